"""Which Redis the settings name (one server, a cluster, Sentinel) and the keys a cluster
needs: every key of a spider in its seeds' key's slot."""

from __future__ import annotations

import pytest
from scrapy.exceptions import NotConfigured
from scrapy.settings import Settings

from project.frontier.config import FrontierConfig
from project.frontier.keys import FrontierKeys, KeyTemplates, hash_tag
from project.frontier.lua import load


def _config(**values: object) -> FrontierConfig:
    return FrontierConfig.from_settings(Settings(values))


def test_one_server_by_default_with_the_plain_key_names() -> None:
    config = _config(REDIS_URL="redis://:s3cret@10.0.0.5:6379/2")
    assert config.target.mode == "single"
    assert "s3cret" not in config.redis_name
    keys = FrontierKeys.from_settings(Settings(), "products")
    assert (keys.queue, keys.start_urls, keys.inflight) == (
        "products:requests",
        "products:start_urls",
        "products:inflight",
    )


@pytest.mark.parametrize(
    "nodes",
    [
        ["10.0.0.1:7000", "10.0.0.2:7000"],
        "10.0.0.1:7000,10.0.0.2:7000",
        '["10.0.0.1:7000", "10.0.0.2:7000"]',
    ],
)
def test_cluster_nodes_as_a_list_a_comma_string_or_json(nodes: object) -> None:
    target = _config(REDIS_CLUSTER_NODES=nodes).target
    assert target.mode == "cluster"
    assert target.cluster_nodes == (("10.0.0.1", 7000), ("10.0.0.2", 7000))
    assert target.describe() == "cluster 10.0.0.1:7000,10.0.0.2:7000"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"REDIS_CLUSTER_NODES": ["nohost"]}, "is not host:port"),
        ({"REDIS_CLUSTER_NODES": ["[::1:7000"]}, "is not host:port"),
        ({"REDIS_CLUSTER_NODES": "[not json"}, "is not a JSON list"),
        ({"REDIS_SENTINELS": ["a:1"], "REDIS_CLUSTER": True}, "both set"),
        ({"REDIS_CLUSTER": True, "REDIS_URL": "redis://h:7000/3"}, "database 0 only"),
    ],
)
def test_a_redis_setting_that_cannot_work_is_refused_at_start(
    values: dict[str, object], message: str
) -> None:
    with pytest.raises(NotConfigured, match=message):
        _config(**values)


def test_sentinel_takes_credentials_from_redis_url_and_masks_them() -> None:
    target = _config(
        REDIS_SENTINELS=["10.0.0.1:26379", "10.0.0.2:26379"],
        REDIS_SENTINEL_MASTER="fleet",
        REDIS_URL="redis://:pw@ignored:1/4",
    ).target
    assert target.mode == "sentinel"
    assert target.describe() == "sentinel master 'fleet' via 10.0.0.1:26379,10.0.0.2:26379"
    client = target.sync_client()  # no I/O yet
    assert client.connection_pool.connection_kwargs["password"] == "pw"
    assert client.connection_pool.connection_kwargs["db"] == 4
    assert client.connection_pool.service_name == "fleet"


def test_on_a_cluster_every_key_carries_the_seeds_key_as_its_tag() -> None:
    settings = Settings({"REDIS_CLUSTER": True})
    keys = FrontierKeys.from_settings(settings, "products")
    assert keys.start_urls == "products:start_urls"  # redis-cli -c lpush still seeds
    assert keys.queue == "{products:start_urls}:requests"
    assert keys.site_index("shop.example") == "{products:start_urls}:requests|i|shop.example"
    assert keys.site_list("shop.example", "0") == "{products:start_urls}:requests|p0|shop.example"
    assert keys.site_counts == "{products:start_urls}:requests|n"
    for name in load("step").keys:
        assert hash_tag(getattr(keys, name)) in (None, "products:start_urls"), name
        if name != "start_urls":
            assert hash_tag(getattr(keys, name)) == "products:start_urls", name
    # a spider's own redis_key moves every key into its slot
    own = keys.with_start_urls("catalogue:seeds")
    assert (own.start_urls, own.queue, own.dupefilter) == (
        "catalogue:seeds",
        "{catalogue:seeds}:products:requests",
        "{catalogue:seeds}:products:dupefilter",
    )


def test_a_seeds_key_with_its_own_tag_lends_it_to_the_others() -> None:
    templates = KeyTemplates(start_urls="{fleet}:%(name)s:seeds", tagged=True)
    keys = FrontierKeys.for_spider("products", templates)
    assert keys.queue == "{fleet}:products:requests"
    assert hash_tag(keys.inflight) == "fleet"


def test_the_tag_cannot_be_turned_off_on_a_cluster() -> None:
    with pytest.raises(NotConfigured, match="FRONTIER_HASH_TAG"):
        KeyTemplates.from_settings(Settings({"REDIS_CLUSTER": True, "FRONTIER_HASH_TAG": False}))
    with pytest.raises(NotConfigured, match="no hash tag"):
        FrontierKeys.for_spider("p", KeyTemplates(start_urls="a}b", tagged=True))


def test_a_cluster_named_by_redis_url_alone_defaults_its_port_and_keeps_tls() -> None:
    target = _config(REDIS_CLUSTER=True, REDIS_URL="rediss://:s3cret@redis-host/0").target
    assert target._cluster_entry() == (("redis-host", 6379),)
    assert target._cluster_options({})["ssl"] is True
    assert target._cluster_options({})["password"] == "s3cret"
    assert "s3cret" not in repr(target)
    sentinel = _config(REDIS_SENTINELS=["h:26379"], REDIS_URL="rediss://:pw@x/0").target
    assert sentinel._credentials()["ssl"] is True


def test_an_address_refused_is_named_without_its_password() -> None:
    with pytest.raises(NotConfigured) as refused:
        _config(REDIS_CLUSTER_NODES=["redis://:s3cret@nohost"])
    assert "s3cret" not in str(refused.value)


def test_an_empty_node_list_is_no_cluster() -> None:
    keys = FrontierKeys.from_settings(Settings({"REDIS_CLUSTER_NODES": "[]"}), "products")
    assert keys.queue == "products:requests"
