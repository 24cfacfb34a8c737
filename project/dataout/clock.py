"""The watermark of a read: Redis' time (the clock that stamped the writes) less the settle."""

from __future__ import annotations

import logging
import time
from typing import Any

__all__ = ["fleet_ms"]

logger = logging.getLogger(__name__)


def fleet_ms(client: Any | None) -> int:
    """Redis' time in milliseconds from a blocking *client*; this machine's clock (said once
    in the log) when Redis cannot be asked."""
    if client is not None:
        try:
            seconds, micros = client.time()
            return int(seconds) * 1000 + int(micros) // 1000
        except Exception as exc:  # noqa: BLE001 (any failure of Redis: the local clock serves)
            logger.warning(
                "Redis' time unavailable (%s): this machine's clock sets the watermark", exc
            )
    return int(time.time() * 1000)
