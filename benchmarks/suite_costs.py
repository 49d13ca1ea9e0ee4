r"""What each test file costs in CPU seconds: the pytest worker's own and its child processes'.

Wall time inside a worker (`pytest --durations`) moves with whatever the other worker runs at
the same moment; CPU seconds do not, so cuts are chosen and checked on these. The numbers come
from `tests/conftest.py`, which writes one JSON line per test when `ELECTRA_TEST_CPU_REPORT` is
set:

  ELECTRA_TEST_CPU_REPORT=/tmp/costs/run make test
  python -m benchmarks.suite_costs /tmp/costs/run          # per file, most expensive first
  python -m benchmarks.suite_costs /tmp/costs/run --tests  # per test
  python -m benchmarks.suite_costs /tmp/costs/run --commands  # per command started

Commands that ran in a preloaded fork (tests/preloaded.py) count with the CPU seconds of the
fork, and each preloaded server's start-up where it started (the `servers` column).

A child's CPU time is counted when the test waits for it (`subprocess.run`, `Popen.wait`), so a
process left running past its test is not counted.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json


def read(prefix: str) -> list[dict]:
    """Every test's line from every worker's `PREFIX.<worker>.jsonl`."""
    rows = []
    for path in sorted(glob.glob(f"{prefix}.*.jsonl")):
        with open(path, encoding="utf-8") as lines:
            rows += [json.loads(line) for line in lines if line.strip()]
    return rows


def per_file(rows: list[dict]) -> list[tuple[str, dict]]:
    """(file, sums of wall, self, children, launches and the test count), most CPU first."""
    sums: dict = collections.defaultdict(lambda: dict(wall=0.0, self=0.0, children=0.0,
                                                      launches=0, tests=0))
    for row in rows:
        total = sums[row["file"]]
        for key in ("wall", "self", "children", "launches"):
            total[key] += row[key]
        total["tests"] += 1
    return sorted(sums.items(), key=lambda kv: -(kv[1]["self"] + kv[1]["children"]))


def command_name(command: str) -> str:
    """`-m electra_tf.tools.export`, `-c`, a script's name, or the program: what a command line
    is (one run in a preloaded fork is recorded as the test wrote it)."""
    words = command.split()
    if not words:
        return "?"
    if words[0].endswith(("python", "python3")) and len(words) > 1:
        if words[1] == "-m" and len(words) > 2:
            return f"-m {words[2]}"
        return "-c" if words[1] == "-c" else words[1].rsplit("/", 1)[-1]
    return words[0].rsplit("/", 1)[-1]


def print_commands(rows: list[dict], top: int) -> None:
    """CPU seconds and count per command name, most CPU first."""
    cpu: dict = collections.Counter()
    count: dict = collections.Counter()
    for row in rows:
        for command, seconds in row.get("waited", []):
            name = command_name(command)
            cpu[name] += seconds
            count[name] += 1
    print(f"{'CPU-s':>7} {'runs':>5}  command")
    for name, seconds in cpu.most_common(top):
        print(f"{seconds:7.0f} {count[name]:5d}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("prefix", help="the ELECTRA_TEST_CPU_REPORT value of the run")
    parser.add_argument("--tests", action="store_true", help="one row per test, not per file")
    parser.add_argument("--commands", action="store_true",
                        help="one row per command (its program and first words), summed")
    parser.add_argument("--top", type=int, default=40, help="rows printed")
    args = parser.parse_args()
    rows = read(args.prefix)
    if not rows:
        raise SystemExit(f"suite_costs: no {args.prefix}.*.jsonl: run the suite with "
                         f"ELECTRA_TEST_CPU_REPORT={args.prefix}")
    if args.commands:
        print_commands(rows, args.top)
        return
    if args.tests:
        table = sorted(((r["test"], dict(r, tests=1)) for r in rows),
                       key=lambda kv: -(kv[1]["self"] + kv[1]["children"]))
    else:
        table = per_file(rows)
    cpu = sum(r["self"] + r["children"] for r in rows)
    print(f"{len(rows)} tests, {cpu:.0f} CPU-s ({cpu / 60:.1f} CPU-minutes), "
          f"{sum(r['launches'] for r in rows)} processes started, "
          f"{sum(r.get('servers', 0) for r in rows)} preloaded servers")
    print(f"{'CPU-s':>7} {'self':>6} {'child':>6} {'wall':>6} {'procs':>5} {'tests':>5}  name")
    for name, t in table[:args.top]:
        print(f"{t['self'] + t['children']:7.0f} {t['self']:6.0f} {t['children']:6.0f} "
              f"{t['wall']:6.0f} {t['launches']:5d} {t['tests']:5d}  {name}")


if __name__ == "__main__":
    main()
