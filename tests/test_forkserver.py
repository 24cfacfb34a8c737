"""The suite's fork server (tests/forkserver.py): a forked process is what ``python -m`` starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from tests import forkserver
from tests.fleet import ROOT, wait_for

if TYPE_CHECKING:
    from pathlib import Path

_PROBE = """\
import json, os, sys, time
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "path0": sys.path[0],
                  "env": os.environ.get("PROBE"), "pid": os.getpid(), "ppid": os.getppid()}))
sys.stdout.flush()
if sys.argv[1:] == ["wait"]:
    time.sleep(60)
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
"""


@pytest.fixture
def probe(tmp_path: Path) -> Path:
    """A module ``probe`` in *tmp_path* that prints what it was started with."""
    (tmp_path / "probe.py").write_text(_PROBE)
    return tmp_path


def _spawn(probe: Path, *args: str, **env: str) -> subprocess.Popen[bytes] | forkserver.Forked:
    return forkserver.spawn(
        "probe",
        args,
        cwd=probe,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), **env},
        stdout=subprocess.PIPE,
    )


def test_the_suite_forks_its_processes() -> None:
    if os.environ.get("FLEET_TESTS_FORK", "1") == "0":
        pytest.skip("FLEET_TESTS_FORK=0")
    assert forkserver.active()


def test_a_forked_process_gets_its_argv_directory_environment_and_exit_status(
    probe: Path,
) -> None:
    proc = _spawn(probe, "a", "b c", PROBE="x", PROBE_EXIT="3")
    assert proc.wait(30) == 3
    assert proc.stdout is not None
    seen = json.loads(proc.stdout.read())
    proc.stdout.close()
    assert seen["argv"] == ["a", "b c"]
    assert seen["cwd"] == str(probe)
    assert seen["path0"] == str(probe), "python -m puts its directory first"
    assert seen["env"] == "x"
    assert seen["pid"] == proc.pid
    assert seen["ppid"] != os.getpid() or not forkserver.active()


def test_a_forked_process_dies_by_the_signal_it_is_sent(probe: Path) -> None:
    proc = _spawn(probe, "wait")
    assert proc.stdout is not None
    wait_for(lambda: proc.stdout.readline(), 30, "the probe to start")
    assert proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL
    proc.stdout.close()
    # signalling it again is harmless: its pid may belong to another process by now
    proc.kill()


def test_a_process_that_cannot_start_says_why_and_fails(probe: Path, tmp_path: Path) -> None:
    log = tmp_path / "err.log"
    with log.open("wb") as err:
        proc = forkserver.spawn(
            "no_such_module_here", [], cwd=probe, env={"PATH": os.environ["PATH"]}, stderr=err
        )
        assert proc.wait(30) == 1
    assert "No module named no_such_module_here" in log.read_text()


def test_many_short_processes_each_report_their_own_status(probe: Path) -> None:
    procs = [_spawn(probe, PROBE_EXIT=str(n)) for n in range(12)]
    assert [proc.wait(60) for proc in procs] == list(range(12))
    for proc in procs:
        assert proc.stdout is not None
        proc.stdout.close()


def test_outside_a_session_it_is_subprocess(probe: Path) -> None:
    proc = forkserver.spawn("probe", [], cwd=probe, env={}, wrapper=("env",))
    assert isinstance(proc, subprocess.Popen)
    assert proc.wait(30) == 0
    assert sys.executable in proc.args
