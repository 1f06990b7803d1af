"""How fast the ``ripieno`` front door answers: ``--help``, ``--version``, ``recipes``, against bare Python.

Each command runs in a fresh interpreter, interleaved with ``python -c pass`` (the floor no
command can beat) over ``--rounds`` rounds; the table shows the median wall seconds and the
median of per-round ratios to the floor. ``--importtime`` adds, per command, the ten largest
cumulative imports from ``python -X importtime`` (what a slow start is spent on).

Target (issue 35): ``ripieno --help`` and ``ripieno recipes`` under 2 s on a 2-core machine.

    python bench/cli_startup.py [--rounds 9] [--importtime]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = {"--help": ["--help"], "--version": ["--version"], "recipes": ["recipes"]}


def _seconds(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def _importtime(args: list[str]) -> list[tuple[float, str]]:
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "ripieno", *args], capture_output=True,
                          text=True, check=False)
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = (part.strip() for part in line.removeprefix("import time:").split("|"))
        if not name.startswith(" "):
            rows.append((int(cumulative) / 1e6, name.strip()))
    return sorted(rows, reverse=True)[:10]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--importtime", action="store_true")
    options = parser.parse_args()
    floor: list[float] = []
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    ratios: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(options.rounds):
        base = _seconds([sys.executable, "-c", "pass"])
        floor.append(base)
        for name, args in COMMANDS.items():
            seconds = _seconds([sys.executable, "-m", "ripieno", *args])
            times[name].append(seconds)
            ratios[name].append(seconds / base)
    print(f"ripieno front door, {options.rounds} interleaved rounds (median; ratio to `python -c pass`)")
    print(f"  {'python -c pass':<18} {statistics.median(floor):7.3f} s   1.0x")
    for name in COMMANDS:
        print(f"  {'ripieno ' + name:<18} {statistics.median(times[name]):7.3f} s  "
              f" {statistics.median(ratios[name]):4.1f}x   (max {max(times[name]):.3f} s)")
    if options.importtime:
        for name, args in COMMANDS.items():
            print(f"\nlargest imports of ripieno {name} (cumulative seconds, python -X importtime):")
            for seconds, module in _importtime(args):
                print(f"  {seconds:7.3f}  {module}")


if __name__ == "__main__":
    main()
