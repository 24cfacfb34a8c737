"""``make test-repeat``: the multi-node crawl tests where races live, run again and again.

Runs the crawl tests of :data:`FILES` ``--count`` times each (pytest-repeat, in parallel as
``make test`` runs), then prints every test with its failures out of its runs, failures
first. Exits 1 if any run failed. On demand, not in CI: ``python -m tests.repeat --count 10``
(``-k EXPR`` narrows it, ``--workers N``, ``--files`` another list).
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: The README's crawl, own spiders, termination, politeness and permits, knobs, two-node
#: crawls, kills and restarts.
FILES = (
    "tests/test_readme.py",
    "tests/test_own_spiders.py",
    "tests/test_termination.py",
    "tests/test_politeness.py",
    "tests/test_site_cap.py",
    "tests/test_knobs.py",
    "tests/test_fleet_crawl.py",
    "tests/test_resilience.py",
)


def _outcomes(junit: Path) -> dict[str, list[str]]:
    """Test (repetition suffix removed) -> the outcome of each of its runs."""
    outcomes: dict[str, list[str]] = collections.defaultdict(list)
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "")
        # pytest-repeat names the runs test[1-10], or test[param-1-10]
        base, _, suffix = name.rpartition("[")
        if suffix.endswith("]") and "-" in suffix:
            params = suffix[:-1].rsplit("-", 2)[0]
            name = base if params.isdigit() else f"{base}[{params}]"
        test = f"{case.get('classname', '').replace('.', '/')}.py::{name}"
        if case.find("failure") is not None or case.find("error") is not None:
            outcomes[test].append("failed")
        elif case.find("skipped") is not None:
            outcomes[test].append("skipped")
        else:
            outcomes[test].append("passed")
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.repeat", description=__doc__)
    parser.add_argument("--count", type=int, default=10, help="runs of each test (%(default)s)")
    parser.add_argument("--workers", type=int, default=4, help="pytest-xdist workers")
    parser.add_argument("-k", dest="keyword", help="only tests matching this pytest -k")
    parser.add_argument("--files", nargs="+", default=list(FILES), help="test files")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        junit = Path(scratch) / "repeat.xml"
        command = [
            sys.executable, "-m", "pytest", *args.files, "-m", "crawl", "-q",
            f"--count={args.count}", "-n", str(args.workers), "--dist", "worksteal",
            f"--junitxml={junit}", "--durations=0", "-o", "junit_family=xunit1",
        ]  # fmt: skip
        if args.keyword:
            command += ["-k", args.keyword]
        started = time.monotonic()
        subprocess.run(command, cwd=ROOT, check=False)
        elapsed = time.monotonic() - started
        if not junit.exists():
            print("test-repeat: pytest wrote no report", file=sys.stderr)
            return 1
        outcomes = _outcomes(junit)
    failing = 0
    print(f"\nfailures per test ({args.count} runs each, {elapsed / 60:.1f} min in all):")
    for test, runs in sorted(outcomes.items(), key=lambda kv: (-kv[1].count("failed"), kv[0])):
        failed = runs.count("failed")
        failing += failed > 0
        print(f"  {failed:3d} / {len(runs):<3d} {test}")
    print(f"{failing} of {len(outcomes)} tests failed at least once")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
