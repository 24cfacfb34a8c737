"""Epochs of the test shop's catalogue: the same shop as it changes from one crawl to the next.

Epoch 0 is the generated catalogue. Epoch *k* is epoch *k* - 1 where, among its plain
products (the only ones whose every field a spider can extract), ``removed`` of them are gone
(their pages answer 404, the listings drop them), ``price`` of the rest get a new price and
``stock`` of the rest flip their availability (a product may do both); and ``added`` of its
product count are new plain products, with ids above every id used before, in existing
categories. Each epoch draws from its own seed (the catalogue seed and *k*), so the same options
always give the same epochs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tests.site.catalogue import Catalogue, Category, draw_product

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable

    from tests.site.catalogue import Product

__all__ = ["MAX_EPOCH", "CatalogueHistory", "Changes", "EpochShares", "diff"]

#: Highest epoch served: every epoch up to the one asked for is derived and kept.
MAX_EPOCH = 365


@dataclass(frozen=True)
class EpochShares:
    """How much of the catalogue each epoch changes (see the module docstring)."""

    price: float = 0.10
    stock: float = 0.05
    added: float = 0.02
    removed: float = 0.02


@dataclass(frozen=True)
class Changes:
    """How one catalogue differs from another (:func:`diff`): sorted product ids."""

    #: Products of both whose price differs.
    price: tuple[int, ...] = ()
    #: Products of both whose availability differs.
    availability: tuple[int, ...] = ()
    #: Products only in the new catalogue, and products only in the old one.
    added: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()

    def as_dict(self) -> dict[str, list[int]]:
        """JSON-ready copy."""
        return {
            "price": list(self.price),
            "availability": list(self.availability),
            "added": list(self.added),
            "removed": list(self.removed),
        }


def diff(old: Catalogue, new: Catalogue) -> Changes:
    """What changed from *old* to *new*."""
    both = [(p, q) for p in old.products if (q := new.product(p.id)) is not None]
    return Changes(
        price=tuple(p.id for p, q in both if p.price != q.price),
        availability=tuple(p.id for p, q in both if p.availability != q.availability),
        added=tuple(q.id for q in new.products if old.product(q.id) is None),
        removed=tuple(p.id for p in old.products if new.product(p.id) is None),
    )


class CatalogueHistory:
    """Every epoch of one catalogue, each derived from the one before on first use and kept."""

    def __init__(self, base: Catalogue, shares: EpochShares) -> None:
        self._shares = shares
        self._epochs: list[Catalogue] = [base]
        #: Per epoch, the id its next added product gets: ids are never used twice.
        self._next_ids: list[int] = [max((p.id for p in base.products), default=0) + 1]
        self._changed: dict[tuple[Hashable, int], int] = {}

    def at(self, epoch: int) -> Catalogue:
        """The catalogue of *epoch*; a ``ValueError`` past ``[0, MAX_EPOCH]``."""
        if not 0 <= epoch <= MAX_EPOCH:
            raise ValueError(f"epoch must be within [0, {MAX_EPOCH}], got {epoch!r}")
        while len(self._epochs) <= epoch:
            following, next_id = _next_epoch(
                self._epochs[-1], len(self._epochs), self._shares, self._next_ids[-1]
            )
            self._epochs.append(following)
            self._next_ids.append(next_id)
        return self._epochs[epoch]

    def changes(self, old: int, new: int) -> Changes:
        """What changed from epoch *old* to epoch *new* (either may be the later one)."""
        return diff(self.at(old), self.at(new))

    def changed_at(self, page: Hashable, epoch: int, content: Callable[[Catalogue], object]) -> int:
        """The epoch, at most *epoch*, since which *page* has shown the same: ``content``
        (what the page shows, computed from a catalogue) is equal in every epoch after it."""
        known = self._changed.get((page, epoch))
        if known is not None:
            return known
        latest = content(self.at(epoch))
        since = epoch
        while since > 0:
            earlier = self._changed.get((page, since))
            if earlier is not None:
                since = earlier
                break
            if content(self.at(since - 1)) != latest:
                break
            since -= 1
        self._changed[page, epoch] = since
        return since


def _next_epoch(
    previous: Catalogue, epoch: int, shares: EpochShares, next_id: int
) -> tuple[Catalogue, int]:
    """Epoch *epoch* from *previous*, and the id its own next epoch adds from."""
    rng = random.Random(f"{previous.seed}:epoch:{epoch}")
    plain = [p.id for p in previous.products if p.kind == "plain"]
    removed = set(rng.sample(plain, round(shares.removed * len(plain))))
    kept = [pid for pid in plain if pid not in removed]
    repriced = set(rng.sample(kept, min(len(kept), round(shares.price * len(plain)))))
    flipped = set(rng.sample(kept, min(len(kept), round(shares.stock * len(plain)))))

    products: list[Product] = []
    for product in previous.products:
        if product.id in removed:
            continue
        if product.id in repriced:
            price = _new_price(rng, product.price)
            product = replace(product, price=price, page_price=price)
        if product.id in flipped:
            stock = "out of stock" if product.availability == "in stock" else "in stock"
            product = replace(product, availability=stock)
        products.append(product)

    categories = previous.categories
    names = [(c.slug, c.name) for c in categories]
    joined: dict[str, list[int]] = {c.slug: [] for c in categories}
    added = round(shares.added * len(previous.products)) if categories else 0
    for product_id in range(next_id, next_id + added):
        primary = rng.randrange(len(names))
        others = [i for i in range(len(names)) if i != primary]
        extra = rng.sample(others, min(len(others), rng.choice((0, 0, 1, 1, 2))))
        product = draw_product(rng, product_id, [names[i] for i in (primary, *extra)])
        products.append(product)
        for slug in product.categories:
            joined[slug].append(product_id)

    following = Catalogue(
        seed=previous.seed,
        products=tuple(products),
        categories=tuple(
            Category(
                c.slug,
                c.name,
                tuple(pid for pid in c.product_ids if pid not in removed) + tuple(joined[c.slug]),
            )
            for c in categories
        ),
        base_products=previous.base_products or len(previous.products),
    )
    return following, next_id + added


def _new_price(rng: random.Random, price: str) -> str:
    """A price 10-30 % above or below *price* (``"12.34"``), never the same, at least 1.99."""
    cents = int(price.replace(".", ""))
    factor = rng.uniform(1.1, 1.3) if rng.random() < 0.5 else rng.uniform(0.7, 0.9)
    new = max(199, round(cents * factor))
    if new == cents:
        new += 1
    return f"{new // 100}.{new % 100:02d}"
