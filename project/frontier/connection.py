"""Which Redis the fleet uses: one server, a Redis Cluster, or a master found through Sentinel.

One place builds every client (the frontier's, the monitor's, the admin commands'), so
``REDIS_URL``, ``REDIS_CLUSTER``/``REDIS_CLUSTER_NODES`` and ``REDIS_SENTINELS`` mean the
same server to all. Credentials and the database come from ``REDIS_URL`` (also with
Sentinel or a cluster's node list), client options from ``REDIS_PARAMS``.

- **Cluster**: redis-py's ``RedisCluster`` follows ``MOVED`` and, when a master dies, finds
  the promoted replica by itself; a spider's keys share one slot (``FRONTIER_HASH_TAG``).
- **Sentinel**: redis-py's ``SentinelConnectionPool`` asks the sentinels for the master on
  every new connection, and drops a connection whose server has become a replica; after a
  failover the next step simply reaches the new master.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast
from urllib.parse import urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from redis.connection import SSLConnection, parse_url
from scrapy.exceptions import NotConfigured

from project.config import read_settings, setting
from project.utils import mask_url

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = ["RedisTarget", "list_setting"]

#: Keyword arguments parse_url gives that name the server rather than how to talk to it.
_PLACE = ("host", "port", "path", "connection_class")


def _address(text: str, setting: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``, or a ``redis://`` URL) as a pair; NotConfigured if not."""
    raw = str(text).strip()
    try:
        parts = urlsplit(raw if "//" in raw else f"//{raw}")
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if not host or not port:
        raise NotConfigured(f"{setting}: {mask_url(raw)!r} is not host:port")
    return host, port


def list_setting(settings: BaseSettings, name: str) -> list[str]:
    """A list setting: a list, ``a:1,b:2`` (``-s`` on the command line) or a JSON list."""
    value = settings.get(name)
    if isinstance(value, str) and value.strip().startswith("["):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise NotConfigured(f"{name}: {value!r} is not a JSON list ({exc})") from exc
    if isinstance(value, str):
        return [part for part in value.split(",") if part.strip()]
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise NotConfigured(f"{name} must be a list of host:port, not {value!r}")
    return [str(part) for part in value]


@dataclass(frozen=True)
class RedisTarget:
    """The fleet's Redis as the settings name it; ``client()``/``sync_client()`` connect
    lazily (no I/O until a command)."""

    url: str = field(repr=False)
    params: dict[str, Any] = field(default_factory=dict, repr=False)
    #: REDIS_URL names one server of a Redis Cluster (implied by REDIS_CLUSTER_NODES).
    cluster: bool = setting("REDIS_CLUSTER", False)
    cluster_nodes: tuple[tuple[str, int], ...] = setting("REDIS_CLUSTER_NODES", ())
    sentinels: tuple[tuple[str, int], ...] = setting("REDIS_SENTINELS", ())
    sentinel_master: str = setting("REDIS_SENTINEL_MASTER", "mymaster")
    #: Keyword arguments of the connections to the sentinels (their own password).
    sentinel_params: dict[str, Any] = field(
        default_factory=dict,
        repr=False,
        metadata=setting("REDIS_SENTINEL_PARAMS", {}).metadata,
    )

    @classmethod
    def from_settings(cls, settings: BaseSettings, url: str, params: dict[str, Any]) -> RedisTarget:
        values = read_settings(
            cls,
            settings,
            url=url,
            params=params,
            cluster_nodes=tuple(
                _address(n, "REDIS_CLUSTER_NODES")
                for n in list_setting(settings, "REDIS_CLUSTER_NODES")
            ),
            sentinels=tuple(
                _address(n, "REDIS_SENTINELS") for n in list_setting(settings, "REDIS_SENTINELS")
            ),
        )
        values["cluster"] = values["cluster"] or bool(values["cluster_nodes"])
        target = cls(**values)
        if target.cluster and target.sentinels:
            raise NotConfigured(
                "REDIS_SENTINELS and a Redis Cluster (REDIS_CLUSTER, REDIS_CLUSTER_NODES) are"
                " both set: a cluster fails over by itself, without sentinels"
            )
        if target.cluster and target._credentials().get("db", 0) not in (0, "0"):
            raise NotConfigured("a Redis Cluster has database 0 only: drop /N from REDIS_URL")
        return target

    @property
    def mode(self) -> Literal["single", "cluster", "sentinel"]:
        if self.cluster:
            return "cluster"
        return "sentinel" if self.sentinels else "single"

    def describe(self) -> str:
        """Where the fleet's Redis is, for logs: never a password."""
        if self.mode == "cluster" and self.cluster_nodes:
            return "cluster " + ",".join(f"{h}:{p}" for h, p in self.cluster_nodes)
        if self.mode == "cluster":
            return f"cluster via {mask_url(self.url)}"
        if self.mode == "sentinel":
            where = ",".join(f"{h}:{p}" for h, p in self.sentinels)
            return f"sentinel master {self.sentinel_master!r} via {where}"
        return mask_url(self.url)

    def _credentials(self) -> dict[str, Any]:
        """What REDIS_URL says besides the address: user, password, db, TLS."""
        try:
            parsed = parse_url(self.url)  # type: ignore[no-untyped-call]
        except ValueError as exc:
            raise NotConfigured(f"REDIS_URL {mask_url(self.url)}: {exc}") from exc
        found = {k: v for k, v in parsed.items() if k not in _PLACE}
        if parsed.get("connection_class") is not None and issubclass(
            parsed["connection_class"], SSLConnection
        ):
            found["ssl"] = True  # rediss://: the cluster's and Sentinel's own TLS switch
        return found

    def _url_address(self) -> tuple[str, int]:
        """REDIS_URL's server (6379 unless it names a port)."""
        parsed = parse_url(self.url)  # type: ignore[no-untyped-call]
        return str(parsed.get("host") or "127.0.0.1"), int(parsed.get("port") or 6379)

    def client(self, **defaults: Any) -> redis.asyncio.Redis:
        """An asyncio client: *defaults*, then REDIS_PARAMS."""
        return cast(
            "redis.asyncio.Redis",
            self._connect(
                defaults,
                redis.asyncio.cluster.RedisCluster,
                redis.asyncio.cluster.ClusterNode,
                redis.asyncio.sentinel.Sentinel,
                redis.asyncio.from_url,
            ),
        )

    def sync_client(self, **defaults: Any) -> redis.Redis:
        """A blocking client (the admin commands, the dashboard): *defaults*, then REDIS_PARAMS."""
        return cast(
            "redis.Redis",
            self._connect(
                defaults,
                redis.cluster.RedisCluster,
                redis.cluster.ClusterNode,
                redis.sentinel.Sentinel,
                redis.Redis.from_url,
            ),
        )

    def _connect(
        self, defaults: dict[str, Any], cluster: Any, node: Any, sentinel: Any, from_url: Any
    ) -> Any:
        """A client of this target from redis-py's classes of one flavour (asyncio or not)."""
        options = {**defaults, **self.params}
        if self.mode == "cluster":
            nodes = [node(host, port) for host, port in self._cluster_entry()]
            return cluster(startup_nodes=nodes, **self._cluster_options(options))
        if self.mode == "sentinel":
            sentinels = sentinel(
                list(self.sentinels),
                sentinel_kwargs=self._sentinel_kwargs(defaults),
                **{**self._credentials(), **options},
            )
            return sentinels.master_for(self.sentinel_master)
        return from_url(self.url, **options)

    def _cluster_entry(self) -> tuple[tuple[str, int], ...]:
        """Where the client first asks for the cluster's map: the nodes, or REDIS_URL's server."""
        return self.cluster_nodes or (self._url_address(),)

    def _cluster_options(self, options: dict[str, Any]) -> dict[str, Any]:
        # a cluster has database 0 only, and redis-py refuses the argument
        return {k: v for k, v in {**self._credentials(), **options}.items() if k != "db"}

    def _sentinel_kwargs(self, defaults: dict[str, Any]) -> dict[str, Any]:
        timeouts = {k: v for k, v in defaults.items() if k.startswith("socket_")}
        return {
            "socket_timeout": 5,
            "socket_connect_timeout": 5,
            **timeouts,
            **self.sentinel_params,
        }
