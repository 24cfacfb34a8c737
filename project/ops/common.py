"""What the ``fleetcrawl`` commands share: their error, the project's settings, the fleet's
Redis and its failures told in one line, and the argument types."""

from __future__ import annotations

import argparse
import contextlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator

    from project.frontier.connection import RedisTarget

__all__ = [
    "CommandError",
    "frontier_keys",
    "positive_int",
    "positive_seconds",
    "project_settings",
    "redis_client",
    "redis_errors",
    "redis_target",
    "tcp_port",
]


class CommandError(Exception):
    """A command could not do its job: one line for the user, and the exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def project_settings(args: argparse.Namespace) -> Any:
    """The project's settings, with ``-s NAME=VALUE`` on top (as ``scrapy crawl`` takes them)."""
    from scrapy.utils.project import get_project_settings

    settings = get_project_settings()
    for pair in getattr(args, "set", None) or []:
        name, _, value = pair.partition("=")
        settings.set(name, value, priority="cmdline")
    return settings


def frontier_keys(settings: Any, spider: str) -> Any:
    """The Redis keys of *spider*'s frontier under the project's settings."""
    from project.frontier.keys import FrontierKeys

    return FrontierKeys.for_project_spider(settings, spider)


def redis_target(settings: Any) -> RedisTarget:
    """The fleet's Redis as the settings name it: one server, a cluster or Sentinel's master."""
    from project.frontier.config import FrontierConfig

    return FrontierConfig.from_settings(settings).target


def redis_client(target: RedisTarget) -> Any:
    """A blocking client of *target* (no I/O yet); a malformed REDIS_URL is a CommandError."""
    try:
        return target.sync_client(socket_connect_timeout=5, socket_timeout=30)
    except ValueError as exc:
        raise CommandError(f"REDIS_URL {target.describe()} is not a Redis URL: {exc}", 2) from exc


@contextlib.contextmanager
def redis_errors(target: RedisTarget) -> Iterator[None]:
    """Redis failures as one line that says what failed and what to do."""
    from redis.exceptions import AuthenticationError, RedisError, ResponseError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    where = f"Redis at {target.describe()}"
    try:
        yield
    except AuthenticationError as exc:
        raise CommandError(
            f"{where} refused the credentials ({exc}): put the right password in REDIS_URL"
            " (redis://:PASSWORD@host:6379/0)"
        ) from exc
    except (RedisConnectionError, RedisTimeoutError) as exc:
        raise CommandError(
            f"{where} is unreachable ({exc}): start it (fleetcrawl services start)"
            " or point REDIS_URL at it"
        ) from exc
    except ResponseError as exc:
        hint = "put the password in REDIS_URL" if "NOAUTH" in str(exc) else "check REDIS_URL"
        raise CommandError(f"{where} answered with an error ({exc}): {hint}") from exc
    except RedisError as exc:
        raise CommandError(f"{where} failed: {exc}") from exc


# --- argument types ----------------------------------------------------------


def positive_int(text: str) -> int:
    """argparse type of a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a positive whole number: {text!r}")
    return value


def positive_seconds(text: str) -> float:
    """argparse type of a finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"not a positive number of seconds: {text!r}")
    return value


def tcp_port(text: str) -> int:
    """argparse type of a TCP port (1 to 65535)."""
    value = positive_int(text) if text.isdigit() else -1
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"not a TCP port: {text!r}")
    return value
