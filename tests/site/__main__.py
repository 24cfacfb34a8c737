"""``python -m tests.site``: serve the test shop until SIGTERM or SIGINT."""

from __future__ import annotations

import logging
from typing import Any

from twisted.logger import STDLibLogObserver, globalLogBeginner

from tests.site.config import parse_args
from tests.site.server import run


def main() -> None:
    """Parse the command line and serve."""
    config = parse_args()
    # Warnings and errors only, on stderr: stdout carries the LISTENING line and nothing else.
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s [%(name)s] %(levelname)s: %(message)s"
    )
    observer: Any = STDLibLogObserver()  # an ILogObserver; mypy cannot read zope interfaces
    globalLogBeginner.beginLoggingTo([observer], redirectStandardIO=False)
    run(config)


if __name__ == "__main__":
    main()
