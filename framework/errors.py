"""Errors a user can fix, and how they are worded.

``RipienoInputError`` is the one base of every error caused by the user's input (a config,
a data or model file, a checkpoint) rather than by a bug. Its message is one line that names
the thing (a file's path, a config key), what is wrong with it and the fix. The ``ripieno``
command prints such an error as that line alone, without a traceback; in Python it is an
ordinary ``ValueError``.

Example:
    >>> from ripieno.framework.errors import RipienoInputError, file_problem
    >>> file_problem("runs/a.ckpt", "is empty (0 bytes)", "train again or pick another checkpoint")
    'runs/a.ckpt: is empty (0 bytes); train again or pick another checkpoint.'
    >>> issubclass(RipienoInputError, ValueError)
    True
"""

from __future__ import annotations

from collections.abc import Iterator
from os import PathLike
from typing import Any


class RipienoInputError(ValueError):
    """Bad input that the user can fix: the message names the input, the problem and the fix."""


#: The ripieno release that removes what ``RipienoDeprecationWarning`` announces (old module paths,
#: ``ripieno.framework.cli``'s old names, flat arguments that moved into groups).
REMOVED_IN = "0.3.0"


class RipienoDeprecationWarning(DeprecationWarning):
    """An old name, path or config key that still works, naming its replacement and when it goes.

    A ``DeprecationWarning``, so in a user's own program the program's warning filters decide (Python
    hides it outside ``__main__``, test runners show it); the ``ripieno`` command shows it.
    """


def fold_flat_arguments(owner: str, argument: str, group: Any, default: Any,  # noqa: ANN401 - a frozen dataclass
                        moved: dict[str, tuple[str, Any]], stacklevel: int = 2) -> Any:  # noqa: ANN401
    """``group`` with flat arguments of earlier releases folded in, each with a ``RipienoDeprecationWarning``.

    The one policy of every class whose flat arguments became a group (``SamplerEvaluation``, the
    ``LastLayerSampler`` posteriors, ``SplitSettings`` / ``LoaderSettings``): each flat argument sets its
    field, warns naming the group's form, and is refused when the group given sets the field too.

    Args:
        owner: the class name, for the messages.
        argument: the group's argument name (``evaluation``, ``posterior``, ``split``).
        group: the group as given (a frozen dataclass).
        default: what a field the user did not set equals (a field equal to it, or ``None``, is unset).
        moved: ``{flat name: (field, value)}``.
        stacklevel: of the warning, counted from the caller of this function.

    Raises:
        ValueError: a setting given both flat and in the group.

    Example:
        >>> import dataclasses, warnings
        >>> @dataclasses.dataclass(frozen=True)
        ... class Group:
        ...     seed: int = 0
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     fold_flat_arguments("Data", "split", Group(), Group(), {"split_seed": ("seed", 3)})
        Group(seed=3)
        >>> print(caught[0].message)
        Data(split_seed=...) is now Data(split=Group(seed=...)); the flat argument is removed in ripieno 0.3.0
    """
    import dataclasses
    import warnings

    name = type(group).__name__
    for flat, (field, _) in moved.items():
        if getattr(group, field) not in (None, getattr(default, field)):
            raise ValueError(f"{owner}({flat}=...) and {owner}({argument}={name}({field}=...)) are the same"
                             f" setting, given twice; keep {argument}.{field}.")
        warnings.warn(f"{owner}({flat}=...) is now {owner}({argument}={name}({field}=...)); the flat argument"
                      f" is removed in ripieno {REMOVED_IN}", RipienoDeprecationWarning,
                      stacklevel=stacklevel + 1)
    return dataclasses.replace(group, **{field: value for field, value in moved.values()})


def file_problem(path: str | PathLike[str], problem: str, fix: str) -> str:
    """The one-line message for a file that cannot be used.

    It reads ``<path>: <problem>; <fix>.``

    Args:
        path: The file (or folder) as the user named it.
        problem: What is wrong with it, e.g. ``"is empty (0 bytes)"``.
        fix: What to do about it, e.g. ``"delete it and rerun to rebuild it"``.

    Returns:
        The message, ending with a full stop.
    """
    return f"{path}: {problem}; {fix.rstrip('.')}."


def first_line(error: BaseException) -> str:
    r"""The first line of an exception's message (its type's name when the message is empty).

    Library errors (pandas, pyarrow, torch) often run to many lines; a one-line message
    quotes only this part of them.

    Example:
        >>> first_line(ValueError("bad header\nsee the docs")), first_line(EOFError())
        ('bad header', 'EOFError')
    """
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class NonFiniteTrainingError(RuntimeError):
    """Training produced a non-finite loss, metric or weight; the message says where and why.

    Raised by ``ripieno.callbacks.NonFiniteGuard`` before the value can reach a checkpoint;
    the ``ripieno`` command prints it as its message alone.
    """


def exception_chain(error: BaseException | None) -> Iterator[BaseException]:
    """``error``, then its cause (or, without one, its context), and so on; each exception once.

    jsonargparse and Lightning wrap or re-raise errors; the one a message is about may be
    anywhere in the chain.

    Example:
        >>> try:
        ...     try:
        ...         raise OSError("disk")
        ...     except OSError as inner:
        ...         raise RuntimeError("wrapped") from inner
        ... except RuntimeError as outer:
        ...     [type(e).__name__ for e in exception_chain(outer)]
        ['RuntimeError', 'OSError']
    """
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__
