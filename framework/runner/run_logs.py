"""A run's logs, whole: CSV metrics that are appended to, never deleted, and one TensorBoard stream.

Lightning's CSV writer deletes a ``metrics.csv`` it finds when it starts (and warns that it
will, whenever the folder is not empty). Under ``ddp_spawn`` the test after ``fit`` runs in
new processes, whose new writer deleted every ``train/*`` and ``val/*`` row of the fit; and
every ripieno run printed the warning, because ``config.yaml`` is written into the run folder
first. ``KeepingExperimentWriter`` appends instead: it reads the header of an existing file
and rewrites the file (atomically) only when new columns appear. ``keep_csv_logs`` gives it
to every CSV logger of a run, ripieno's default one and the user's own.

TensorBoard writes one events file per process, so the same ``ddp_spawn`` run left two
(fit, then test). ``merge_event_files`` joins a run folder's events files into one, in the
order they were written.

Example:
    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> first = KeepingExperimentWriter(folder)
    >>> first.log_metrics({"val/loss": 0.5}, step=3); first.save()
    >>> second = KeepingExperimentWriter(folder)  # e.g. the test's process after a spawned fit
    >>> second.log_metrics({"test/loss": 0.4}, step=4); second.save()
    >>> print(open(f"{folder}/metrics.csv").read().strip())
    step,test/loss,val/loss
    3,,0.5
    4,0.4,
"""

from __future__ import annotations

import csv
import struct
from collections.abc import Iterable
from pathlib import Path

from lightning.pytorch.loggers import Logger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from typing_extensions import override

from ripieno.framework.outputs.output_files import atomic_output
from ripieno.framework.runner.lightning_private import csv_logger_unstarted, set_csv_experiment

EVENTS_PREFIX = "events.out.tfevents."


class KeepingExperimentWriter(ExperimentWriter):
    """Lightning's CSV ``ExperimentWriter`` that appends to an existing ``metrics.csv`` (module docstring)."""

    @override
    def _check_log_dir_exists(self) -> None:
        """Keep what is there: no deletion, and so no warning that something will be deleted."""

    @override
    def _record_new_keys(self) -> set[str]:
        on_disk = [key for key in self._header_on_disk() if key not in self.metrics_keys]
        self.metrics_keys.extend(on_disk)  # another process (the spawned fit) wrote these columns
        return super()._record_new_keys()

    @override
    def _rewrite_with_new_header(self, fieldnames: list[str]) -> None:
        """Rewrite the file with the new columns atomically: a kill leaves the old file, not half of it."""
        if "://" in self.metrics_file_path:
            super()._rewrite_with_new_header(fieldnames)
            return
        with open(self.metrics_file_path, newline="") as file:  # noqa: PTH123
            rows = list(csv.DictReader(file))
        with atomic_output(self.metrics_file_path, "w", what="the metrics") as file:
            writer = csv.DictWriter(file, fieldnames=fieldnames)
            writer.writeheader()
            writer.writerows(rows)

    def _header_on_disk(self) -> list[str]:
        if not self._fs.isfile(self.metrics_file_path):
            return []
        with self._fs.open(self.metrics_file_path, "r", newline="") as file:
            return next(csv.reader(file), [])


def keep_csv_logs(loggers: Iterable[Logger]) -> None:
    """Give every CSV logger that has not started writing a ``KeepingExperimentWriter``.

    Call it in the run's first process once the loggers have their versions (the writer
    creates the run folder); spawned processes receive the writer with the logger.
    """
    for logger in loggers:
        if csv_logger_unstarted(logger):  # its writer is made by `experiment` on first use
            set_csv_experiment(logger, KeepingExperimentWriter(log_dir=logger.log_dir))


def event_files(folder: str | Path) -> list[Path]:
    """The TensorBoard events files directly in ``folder``, in the order they were written."""
    found = [p for p in Path(folder).glob(EVENTS_PREFIX + "*") if p.is_file()]
    return sorted(found, key=_written_order)


def merge_event_files(folder: str | Path) -> Path | None:
    """Join the events files of one run folder into the first one; return it (``None``: none there).

    An events file is a sequence of TFRecords that starts with a ``file_version`` event;
    the later files' records follow the first file's, without their own ``file_version``
    record. The joined file replaces the first atomically, then the others are removed, so
    a kill in between leaves every event readable (some twice), never fewer.
    """
    files = event_files(folder)
    if len(files) < 2:
        return files[0] if files else None
    first = files[0]
    with atomic_output(first, "wb", what="the TensorBoard events") as out:
        out.write(first.read_bytes())
        for path in files[1:]:
            out.write(_without_first_record(path.read_bytes()))
    for path in files[1:]:
        path.unlink()
    return first


def _without_first_record(data: bytes) -> bytes:
    """TFRecord bytes after the first record (length u64, its CRC u32, payload, payload CRC u32)."""
    if len(data) < 12:
        return b""
    (length,) = struct.unpack("<Q", data[:8])
    return data[8 + 4 + length + 4:]


def _written_order(path: Path) -> tuple[float, str]:
    """The wall time of a file's first event (its creation, to the microsecond), then its name.

    The first record's payload is an ``Event`` protobuf whose field 1 is ``wall_time``, a
    double (tag byte ``0x09``); a file that does not start so sorts first, by name.
    """
    with path.open("rb") as file:
        head = file.read(8 + 4 + 9)
    if len(head) == 21 and head[12] == 0x09:
        return struct.unpack("<d", head[13:21])[0], path.name
    return 0.0, path.name
