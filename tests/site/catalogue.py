"""Deterministic catalogue of the test shop: products, categories and page kinds."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "KINDS",
    "Catalogue",
    "Category",
    "Product",
    "draw_product",
    "generate_catalogue",
]

#: Every product has exactly one kind; it decides how its page is served.
KINDS: tuple[str, ...] = ("plain", "js", "malformed", "flaky", "broken")

_GARBAGE_PRICES: tuple[str, ...] = ("call us", "12,,3", "")
_CURRENCIES: tuple[str, ...] = ("EUR", "USD")
_CATEGORY_ADJECTIVES: tuple[str, ...] = (
    "Garden", "Kitchen", "Outdoor", "Office", "Travel", "Kids", "Vintage", "Smart",
    "Bathroom", "Workshop", "Camping", "Festive", "Pet", "Studio", "Winter", "Summer",
)  # fmt: skip
_CATEGORY_NOUNS: tuple[str, ...] = (
    "Tools", "Lighting", "Furniture", "Storage", "Textiles", "Gadgets", "Decor",
    "Accessories", "Supplies", "Essentials", "Games", "Audio", "Clothing", "Cookware",
)  # fmt: skip
_PRODUCT_ADJECTIVES: tuple[str, ...] = (
    "Sturdy", "Compact", "Deluxe", "Classic", "Foldable", "Wireless", "Handmade",
    "Ergonomic", "Portable", "Rustic", "Modern", "Heavy-Duty", "Minimal", "Cosy",
)  # fmt: skip
_PRODUCT_MATERIALS: tuple[str, ...] = (
    "Oak", "Steel", "Bamboo", "Linen", "Ceramic", "Copper", "Wool", "Glass",
    "Black & White", "Walnut", "Cotton", "Aluminium", "Cork", "Leather",
)  # fmt: skip
_PRODUCT_NOUNS: tuple[str, ...] = (
    "Chair", "Lamp", "Kettle", "Backpack", "Blanket", "Speaker", "Shelf", "Mug",
    "Planter", "Clock", "Toolbox", "Tent", "Scarf", "Cutting Board", "Desk Organiser",
)  # fmt: skip
_DESCRIPTION_SENTENCES: tuple[str, ...] = (
    "Built to last and easy to clean.",
    "Ships in recyclable packaging.",
    "A customer favourite for over a decade.",
    "Designed in our studio and tested by real people.",
    "Pairs well with the rest of the collection.",
    "Covered by a two-year warranty.",
    "Light enough to take anywhere.",
    "Each piece is slightly different.",
)


@dataclass(frozen=True)
class Category:
    """A category: its listing pages show ``product_ids`` in ascending order."""

    slug: str
    name: str
    product_ids: tuple[int, ...]


@dataclass(frozen=True)
class Product:
    """Ground truth for one product page."""

    id: int
    name: str
    price: str
    currency: str
    sku: str
    availability: str
    description: str
    breadcrumb: tuple[str, ...]
    images: tuple[str, ...]
    categories: tuple[str, ...]
    kind: str = "plain"
    slow: bool = False
    #: Text of the ``.price`` element as served (``None``: no element); differs for "malformed".
    page_price: str | None = None

    @property
    def url(self) -> str:
        """Canonical relative URL of the product page."""
        return f"/product/{self.id}"

    @property
    def listing_url(self) -> str:
        """Relative URL of the first listing page of the product's primary category."""
        return f"/category/{self.categories[0]}?page=1"


@dataclass(frozen=True)
class Catalogue:
    """Products and categories generated from one seed."""

    seed: int
    products: tuple[Product, ...]
    categories: tuple[Category, ...]
    #: Products of the catalogue this one is an epoch of (0: none, it is epoch 0). Listings draw
    #: their related products from ids up to it, so an epoch changes a listing's related links
    #: only where it removes one of them (:mod:`tests.site.epochs`).
    base_products: int = 0
    _by_id: dict[int, Product] = field(init=False, repr=False, compare=False)
    _by_slug: dict[str, Category] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {p.id: p for p in self.products})
        object.__setattr__(self, "_by_slug", {c.slug: c for c in self.categories})

    def product(self, product_id: int) -> Product | None:
        """Product with this id, or ``None``."""
        return self._by_id.get(product_id)

    def category(self, slug: str) -> Category | None:
        """Category with this slug, or ``None``."""
        return self._by_slug.get(slug)

    def ids_of_kind(self, kind: str) -> list[int]:
        """Sorted ids of the products of one kind."""
        return [p.id for p in self.products if p.kind == kind]


def generate_catalogue(
    n_products: int,
    seed: int = 0,
    *,
    js_share: float = 0.0,
    malformed_share: float = 0.0,
    flaky_share: float = 0.0,
    broken_share: float = 0.0,
    slow_share: float = 0.0,
) -> Catalogue:
    """Build the catalogue; the same arguments always give the same catalogue."""
    if n_products < 1:
        raise ValueError(f"n_products must be >= 1, got {n_products!r}")
    shares = {
        "js": js_share,
        "malformed": malformed_share,
        "flaky": flaky_share,
        "broken": broken_share,
    }
    for name, share in [*shares.items(), ("slow", slow_share)]:
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"{name}_share must be within [0, 1], got {share!r}")
    if sum(shares.values()) > 1.0 + 1e-9:
        raise ValueError("js, malformed, flaky and broken shares add up to more than 1")

    rng = random.Random(f"{seed}:catalogue")
    ids = list(range(1, n_products + 1))
    names = _category_names(rng, max(3, round(n_products / rng.uniform(60, 100))))
    slugs = [_slugify(name) for name in names]
    memberships = _memberships(rng, ids, len(slugs))
    kinds = _kinds(random.Random(f"{seed}:kinds"), ids, shares)
    slow = set(random.Random(f"{seed}:slow").sample(ids, round(slow_share * n_products)))
    garbage = _page_prices(kinds)

    products = []
    for product_id in ids:
        drawn = draw_product(
            rng, product_id, [(slugs[c], names[c]) for c in memberships[product_id]]
        )
        products.append(
            replace(
                drawn,
                kind=kinds.get(product_id, "plain"),
                slow=product_id in slow,
                page_price=garbage.get(product_id, drawn.price),
            )
        )
    members: list[list[int]] = [[] for _ in slugs]
    for product_id in ids:
        for index in memberships[product_id]:
            members[index].append(product_id)
    categories = tuple(
        Category(slug, name, tuple(pids))
        for slug, name, pids in zip(slugs, names, members, strict=True)
    )
    return Catalogue(seed=seed, products=tuple(products), categories=categories)


def draw_product(
    rng: random.Random, product_id: int, categories: Sequence[tuple[str, str]]
) -> Product:
    """A plain product drawn from *rng*, in *categories* (``(slug, name)``, primary first)."""
    euros, cents = divmod(rng.randint(199, 99_999), 100)
    price = f"{euros}.{cents:02d}"
    return Product(
        id=product_id,
        name=f"{rng.choice(_PRODUCT_ADJECTIVES)} {rng.choice(_PRODUCT_MATERIALS)} {rng.choice(_PRODUCT_NOUNS)}",
        price=price,
        currency=rng.choice(_CURRENCIES),
        sku=f"SKU-{product_id:06d}",
        availability="in stock" if rng.random() < 0.8 else "out of stock",
        description=" ".join(rng.sample(_DESCRIPTION_SENTENCES, rng.randint(2, 3))),
        breadcrumb=("Home", categories[0][1]),
        images=tuple(f"/img/{product_id}-{k}.jpg" for k in range(1, rng.randint(2, 3) + 1)),
        categories=tuple(slug for slug, _ in categories),
        page_price=price,
    )


def _category_names(rng: random.Random, count: int) -> list[str]:
    pool = [f"{adj} {noun}" for adj in _CATEGORY_ADJECTIVES for noun in _CATEGORY_NOUNS]
    rng.shuffle(pool)
    # Past the pool size, names repeat with a numeric suffix so slugs stay unique.
    return [
        pool[i % len(pool)] + ("" if i < len(pool) else f" {i // len(pool) + 1}")
        for i in range(count)
    ]


def _slugify(name: str) -> str:
    return "-".join(name.lower().split())


def _memberships(rng: random.Random, ids: list[int], n_categories: int) -> dict[int, list[int]]:
    """Category indexes of each product, primary first; primaries round-robin so none is empty."""
    order = ids[:]
    rng.shuffle(order)
    primary = {pid: i % n_categories for i, pid in enumerate(order)}
    memberships = {}
    for pid in ids:
        others = [c for c in range(n_categories) if c != primary[pid]]
        extra = rng.sample(others, min(len(others), rng.choice((0, 0, 1, 1, 2))))
        memberships[pid] = [primary[pid], *extra]
    return memberships


def _kinds(rng: random.Random, ids: list[int], shares: dict[str, float]) -> dict[int, str]:
    order = ids[:]
    rng.shuffle(order)
    kinds: dict[int, str] = {}
    start = 0
    for kind in ("broken", "flaky", "malformed", "js"):
        count = min(round(shares[kind] * len(ids)), len(ids) - start)
        kinds.update((pid, kind) for pid in order[start : start + count])
        start += count
    return kinds


def _page_prices(kinds: dict[int, str]) -> dict[int, str | None]:
    """Malformed pages: the first half by id has no price element, the rest garbage text."""
    malformed = sorted(pid for pid, kind in kinds.items() if kind == "malformed")
    half = (len(malformed) + 1) // 2
    prices: dict[int, str | None] = dict.fromkeys(malformed[:half])
    for i, pid in enumerate(malformed[half:]):
        prices[pid] = _GARBAGE_PRICES[i % len(_GARBAGE_PRICES)]
    return prices
