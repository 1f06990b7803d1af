"""Models against each other on many tables, as a library: ``run_benchmark`` returns the results table.

``run`` (``run_benchmark``, ``BenchmarkOptions``, ``BenchmarkResult`` and the steps ``ripieno
benchmark`` composes), the benchmark files (``config``), the cells and their store (``cells``), the
models with their fits and scores (``models``, ``uncertainty``) and the report (``report``). Needs
the ``benchmark`` extra; each name is imported on first use.

Example:
    >>> from ripieno.framework.benchmark import BenchmarkOptions
    >>> BenchmarkOptions(datasets="wine").datasets
    ['wine']
"""

from typing import TYPE_CHECKING

from ripieno.framework.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from ripieno.framework.benchmark.config import BenchmarkConfig, load_benchmark
    from ripieno.framework.benchmark.run import BenchmarkOptions, BenchmarkResult, run_benchmark

_EXPORTS = {
    "BenchmarkConfig": "ripieno.framework.benchmark.config",
    "load_benchmark": "ripieno.framework.benchmark.config",
    "BenchmarkOptions": "ripieno.framework.benchmark.run",
    "BenchmarkResult": "ripieno.framework.benchmark.run",
    "run_benchmark": "ripieno.framework.benchmark.run",
}
__all__ = ["BenchmarkConfig", "BenchmarkOptions", "BenchmarkResult", "load_benchmark", "run_benchmark"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
