"""bench/gpu.py: the CPU dry run prints every section, --out never overwrites, no GPU -> one line."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu.py"

# what the dry run's report must show: section headers, row and column names
EXPECTED = [
    "## (a) tabular step", "tabm package TabM", "ripieno rank1 (TabM)", "ripieno lometab r=4", "| fp32 |",
    "| bf16 |", "| eager |", "| compiled |", "ratio to tabm eager fp32",
    "## (b) GLM sampling", "| LL-GLM |", "| DNN-GLM |", "peak growth MiB", "memory n/a (CPU)",
    "## (c) DDP step", "DDP step: skipped:",
    "## (d) LOES extraction", "| MiniLM |", "rows/s", "selection share",
    "section a time:", "section b time:", "section c time:", "section d time:",
    "total time:", "all sections ran",
]


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_dry_run_prints_every_section_and_writes_the_report(tmp_path):
    out = tmp_path / "report.md"
    # section (e) trains four recipes twice: test_host_syncs.py checks the same families' steps
    result = _run("--dry-run", "--sections", "abcd", "--out", str(out), timeout=1500)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    missing = [text for text in EXPECTED if text not in result.stdout]
    assert not missing, (missing, result.stdout)
    assert "failed" not in result.stdout
    assert f"report written to {out}" in result.stdout
    report = out.read_text()
    assert report.startswith("# GPU benchmark") and all(text in report for text in EXPECTED)
    assert report in result.stdout  # the file is the printed report
    assert not (tmp_path / "report.md.tmp").exists()


def test_out_refuses_an_existing_file(tmp_path):
    out = tmp_path / "report.md"
    out.write_text("keep me\n")
    result = _run("--dry-run", "--out", str(out))
    assert result.returncode != 0
    assert result.stdout == ""  # refused before any section ran
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "exists" in lines[0] and str(out) in lines[0]
    assert out.read_text() == "keep me\n"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_a_full_run_asks_for_the_dry_run():
    result = _run()
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "GPU is needed" in lines[0] and "--dry-run" in lines[0]


def test_dry_run_counts_host_syncs_of_a_training_step():
    """Section (e) on one family (test_host_syncs.py trains all four): zero syncs per step."""
    result = _run("--dry-run", "--sections", "e", "--families", "tabular", timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (row,) = [line for line in result.stdout.splitlines() if line.startswith("| tabular LoMETab |")]
    assert row.split("|")[-2].strip() == "0.00"  # HostSyncCounter per step
    assert "- tabular LoMETab: none" in result.stdout
