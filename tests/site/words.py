"""Small text helpers shared by the sections of the test site."""

from __future__ import annotations

import re
import unicodedata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import random
    from collections.abc import Sequence

__all__ = ["paragraph", "slug"]

_NOT_SLUG = re.compile(r"[^a-z0-9]+")


def slug(text: str) -> str:
    """ASCII slug of *text*: ``"Zürich & the Sea"`` is ``"zurich-the-sea"``."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    return _NOT_SLUG.sub("-", ascii_text.lower()).strip("-") or "untitled"


def paragraph(rng: random.Random, sentences: Sequence[str], low: int, high: int) -> str:
    """*low* to *high* distinct sentences of *sentences*, joined by spaces."""
    return " ".join(rng.sample(sentences, rng.randint(low, min(high, len(sentences)))))
