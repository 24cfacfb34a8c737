"""Run a command so that the CPU of its whole process tree is counted.

    python -m tests.benchmarks.reaper ARGV...

The kernel adds a child's CPU to its parent's ``RUSAGE_CHILDREN`` only when the parent reaps
it. Chromium's renderers are forked by its zygote, and outlive it at shutdown: they are
reparented to init and reaped there, so a benchmark reading its own ``RUSAGE_CHILDREN`` after
a node exits misses every renderer's CPU (measured: 6.4 of 20 CPU seconds of an adaptive node
on the mixed shop, nearly all of what its renderers spent). This wrapper makes itself a child
subreaper (Linux ``PR_SET_CHILD_SUBREAPER``): every orphaned descendant is reparented to it,
and it reaps them all before it exits, so its parent's ``RUSAGE_CHILDREN`` holds the tree's
CPU. It exits with the command's own exit code. SIGTERM and SIGINT are passed on to the
command.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

_PR_SET_CHILD_SUBREAPER = 36


def main(argv: list[str]) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    proc = subprocess.Popen(argv)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda s, _f: proc.send_signal(s))
    code = proc.wait()
    while True:  # the orphans: each is reaped here, its CPU added to this process's children
        try:
            os.wait()
        except ChildProcessError:
            return code
        except InterruptedError:
            continue


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
