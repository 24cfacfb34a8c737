"""Both clients a fleet node needs, connected before the first request (``bare.py``)."""

from __future__ import annotations

import os
from typing import Any

import redis.asyncio
from pymongo import AsyncMongoClient


class ClientsPipeline:
    """Both clients connected at open, one round trip each (``REDIS_URL``, ``MONGO_URI``)."""

    async def open_spider(self) -> None:
        self.redis = redis.asyncio.Redis.from_url(os.environ["REDIS_URL"])
        self.mongo: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(os.environ["MONGO_URI"])
        await self.redis.ping()
        await self.mongo.admin.command("ping")

    async def close_spider(self) -> None:
        await self.redis.aclose()
        await self.mongo.close()

    async def process_item(self, item: Any) -> Any:
        return item
