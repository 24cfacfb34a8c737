"""Run a command so that the CPU of its whole process tree is counted.

    python tests/benchmarks/reaper.py ARGV...

The kernel adds a child's CPU to its parent's ``RUSAGE_CHILDREN`` only when the parent reaps
it. Chromium's renderers are forked by its zygote, and outlive it at shutdown: they are
reparented to init and reaped there, so a benchmark reading its own ``RUSAGE_CHILDREN`` after
a node exits misses every renderer's CPU (measured: 6.4 of 20 CPU seconds of an adaptive node
on the mixed shop, nearly all of what its renderers spent). This wrapper makes itself a child
subreaper (Linux ``PR_SET_CHILD_SUBREAPER``): every orphaned descendant is reparented to it,
and it reaps them all before it exits, so its parent's ``RUSAGE_CHILDREN`` holds the tree's
CPU (the wrapper's own few tens of milliseconds included).

- The command runs in its own process group; SIGTERM and SIGINT sent to the wrapper go to the
  command once (a terminal's Ctrl-C reaches only the wrapper's group, so Scrapy sees one).
- Orphans still running ORPHAN_GRACE seconds after the command exited are sent SIGTERM, then
  SIGKILL, so the wrapper always ends.
- It exits with the command's exit code, or 128 + N when a signal N ended the command.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

_PR_SET_CHILD_SUBREAPER = 36
#: Seconds the orphans have to exit after the command did, before SIGTERM, then SIGKILL.
ORPHAN_GRACE = 20.0


def _children() -> list[int]:
    # project.utils.child_processes reads the same, but this script runs beside another
    # checkout's code (the benchmark's "today" worktree) and imports nothing of the project
    found: list[int] = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        with contextlib.suppress(OSError):
            found += [int(pid) for pid in (task / "children").read_text().split()]
    return found


def _reap_all() -> None:
    """Reap every orphan: wait, then SIGTERM, then SIGKILL the ones that stay."""
    deadline = time.monotonic() + ORPHAN_GRACE
    sent: signal.Signals | None = None
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            continue
        now = time.monotonic()
        if now > deadline:
            sent = signal.SIGTERM if sent is None else signal.SIGKILL
            for child in _children():
                with contextlib.suppress(OSError):
                    os.kill(child, sent)
            deadline = now + 5.0
        time.sleep(0.05)


def main(argv: list[str]) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    received: list[int] = []
    proc: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _frame: object) -> None:
        if proc is None:
            received.append(signum)  # before the command started: it gets it once started
        elif proc.returncode is None:
            proc.send_signal(signum)
        else:  # the command is gone: its orphans get it
            for child in _children():
                with contextlib.suppress(OSError):
                    os.kill(child, signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    proc = subprocess.Popen(argv, process_group=0)
    for signum in received:
        proc.send_signal(signum)
    code = proc.wait()
    _reap_all()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
