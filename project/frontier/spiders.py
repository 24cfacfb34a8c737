"""Spiders on the frontier: the fleet's own base, and seeds for any Scrapy or scrapy-redis spider."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy import FormRequest, Request
from scrapy_redis.spiders import RedisMixin, RedisSpider

from project.frontier.config import FrontierConfig
from project.frontier.seeds import InvalidSeed, Seed, parse_seed

if TYPE_CHECKING:
    from scrapy import Spider

__all__ = ["FleetSpider", "has_own_seeds", "requests_from_seed", "seed_key"]


class FleetSpider(RedisSpider):  # type: ignore[misc]
    """scrapy-redis ``RedisSpider`` fed by :class:`project.frontier.scheduler.FleetScheduler`.

    Any ``RedisSpider``, ``RedisCrawlSpider`` or plain Scrapy spider runs on the
    frontier too; this base adds the strict seed format (:func:`parse_seed`) and
    :meth:`make_request_from_seed`, the place to route seeds.
    """

    def spider_idle(self) -> None:
        """Termination is the frontier's decision, not a 5-second poll."""

    def request_from_seed(self, raw: bytes) -> Request:
        """Validate a raw seed and build its request; raises InvalidSeed."""
        seed = parse_seed(raw, _seed_limit(self))
        return self.make_request_from_seed(seed)

    def make_request_from_seed(self, seed: Seed) -> Request:
        """Build the request for a validated seed; override to route seeds."""
        return _request(seed)

    def make_request_from_data(self, data: bytes) -> Request:
        """scrapy-redis' name for :meth:`request_from_seed`."""
        return self.request_from_seed(data)


def _seed_limit(spider: Spider) -> int:
    limit = getattr(spider, "_seed_max_bytes", None)
    if limit is None:
        limit = FrontierConfig.from_settings(spider.settings).seed_max_bytes
        spider._seed_max_bytes = limit  # type: ignore[attr-defined]
    return int(limit)


def _request(seed: Seed) -> Request:
    if seed.formdata:
        return FormRequest(
            seed.url,
            method=seed.method,
            formdata=seed.formdata,
            headers=seed.headers or None,
            meta=seed.meta,
            priority=seed.priority,
            dont_filter=True,
        )
    return Request(
        seed.url,
        method=seed.method,
        headers=seed.headers or None,
        body=seed.body,
        meta=seed.meta,
        priority=seed.priority,
        dont_filter=True,
    )


def has_own_seeds(spider: Spider) -> bool:
    """A spider that reads seeds from Redis (scrapy-redis' ``RedisMixin``, or the fleet's)."""
    return isinstance(spider, RedisMixin) or hasattr(spider, "request_from_seed")


def seed_key(spider: Spider, default: str) -> str:
    """Where the spider's seeds are pushed: its ``redis_key`` when it names one."""
    key = getattr(spider, "redis_key", None)
    if isinstance(key, str) and key.strip():
        try:
            return key % {"name": spider.name}
        except (KeyError, TypeError, ValueError):
            return key
    return default


def requests_from_seed(spider: Spider, raw: bytes) -> list[Request]:
    """The requests one raw seed from Redis becomes for *spider*; raises InvalidSeed.

    The fleet's spiders validate it strictly; a scrapy-redis spider's own
    ``make_request_from_data`` is called when it overrides it; otherwise the seed is a
    URL or a JSON object as scrapy-redis reads them (its other fields are form data).
    """
    own = getattr(spider, "request_from_seed", None)
    if own is not None:
        return [own(raw)]
    if len(raw) > _seed_limit(spider):
        raise InvalidSeed("too_large", f"seed of {len(raw)} bytes exceeds {_seed_limit(spider)}")
    if isinstance(spider, RedisMixin) and (
        type(spider).make_request_from_data is not RedisMixin.make_request_from_data
    ):
        return _from_spider(spider, raw)
    encoding = getattr(spider, "redis_encoding", None) or spider.settings.get(
        "REDIS_ENCODING", "utf-8"
    )
    seed = parse_seed(raw, _seed_limit(spider), encoding=str(encoding), formdata=True)
    return [_request(seed)]


def _from_spider(spider: RedisMixin, raw: bytes) -> list[Request]:
    name = f"{type(spider).__name__}.make_request_from_data"
    try:
        made = spider.make_request_from_data(raw)
        requests = [made] if isinstance(made, Request) else list(made or [])
    except Exception as exc:
        raise InvalidSeed("spider", f"{name} raised {type(exc).__name__}: {exc}") from exc
    if not requests:
        raise InvalidSeed("no_request", f"{name} made no request from it")
    if not all(isinstance(r, Request) for r in requests):
        raise InvalidSeed("no_request", f"{name} must return a Request or Requests")
    return requests
