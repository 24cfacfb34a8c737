"""Item pipelines: validation, then MongoDB storage."""

from __future__ import annotations

from pipelines.mongo import MongoPipeline
from pipelines.validation import ValidationPipeline

__all__ = ["MongoPipeline", "ValidationPipeline"]
