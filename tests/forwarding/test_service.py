"""ForwardingService ingest on a real store: publishes from many clients in one loop turn share one commit,
and each caller still gets its own outcome; an MQTT 5 Message Expiry Interval caps the stored TTL."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from appliance.broker.api import ACCEPTED, InboundPublish
from appliance.forwarding.config import ForwardingConfig, UpstreamConfig
from appliance.forwarding.endpoints import identity_properties
from appliance.forwarding.metrics import LinkStats
from appliance.forwarding.queues import MessageStore
from appliance.forwarding.service import QUOTA_EXCEEDED, ForwardingService
from appliance.forwarding.upstream import UpstreamSender
from appliance.forwarding.validity import upstream_problem
from testing import waiting
from testing.campaigns import campaign
from testing.fake_runtime import FakeRuntime

#: No upstream is configured, so what is stored stays queued and can be counted afterwards.
ROUTES = '{"schemaVersion": "1.1.0", "routes": {"all": {"route": "FROM /messages/* INTO $upstream", "priority": 9}}}'


class SilentBroker:
    """The smallest BrokerHandle; nothing here publishes locally."""

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False, **properties: object) -> None:
        pass

    def disconnect(self, client_id: str, reason_code: int, reason_string: str | None = None) -> None:
        raise AssertionError("forwarding never disconnects clients")

    def may_publish(self, client_id: str, username: str | None, topic: str) -> bool:
        return True

    def prometheus(self) -> str:
        return ""


def publish(n: int, size: int = 10) -> InboundPublish:
    return InboundPublish(f"d{n}", None, 5, f"devices/d{n}/messages/events", bytes(size), 1, False)


def test_publishes_of_one_loop_turn_go_in_one_transaction(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_text(ROUTES)
    config = ForwardingConfig(enabled=True, manifest=manifest, max_store_bytes=60 * 200)
    service = ForwardingService(config, tmp_path, "gw1")
    batches: list[int] = []

    async def body() -> None:
        await service.start(SilentBroker())
        assert service.store is not None
        add_many = service.store.add_many

        def counting_add_many(items):  # type: ignore[no-untyped-def]
            batches.append(len(items))
            return add_many(items)

        service.store.add_many = counting_add_many  # type: ignore[method-assign]
        try:
            verdicts = await asyncio.gather(*(service.on_publish(publish(n)) for n in range(50)))
            assert all(v is ACCEPTED for v in verdicts)
            big = await asyncio.gather(*(service.on_publish(publish(n, 20_000)) for n in range(3)))
            assert [v.reason_code for v in big] == [QUOTA_EXCEEDED] * 3  # larger than the whole store
        finally:
            await service.stop()

    asyncio.run(body())
    assert batches[0] == 50 and sum(batches) == 53 and len(batches) <= 2
    store = MessageStore(tmp_path / "forwarding.db")
    try:
        assert store.message_count() == 50  # committed; what the refused ones would have dropped is back
    finally:
        store.close()


def test_message_expiry_interval_shortens_the_ttl_and_never_lengthens_it(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_text(ROUTES.replace('"priority": 9', '"priority": 9, "timeToLiveSecs": 600'))
    service = ForwardingService(ForwardingConfig(enabled=True, manifest=manifest), tmp_path, "gw1")

    async def body() -> list[int]:
        await service.start(SilentBroker())
        assert service.store is not None
        try:
            for n, expiry in enumerate((None, 30, 3600)):
                message = dataclasses.replace(publish(n), message_expiry_interval=expiry)
                assert await service.on_publish(message) is ACCEPTED
            return [item.ttl_s for item in await service.thread.call(service.store.read, "upstream", 9, 0, 10)]
        finally:
            await service.stop()

    assert asyncio.run(body()) == [600, 30, 600]


def test_expired_messages_leave_the_store_at_the_cleanup_interval_on_the_service_clock(tmp_path: Path) -> None:
    """The service's clock is its runtime's: messages stored with a 10 s TTL stay in the store until the
    cleanup that runs every 60 s comes round, and leave then, counted as expired - a minute in microseconds."""
    manifest = tmp_path / "manifest.json"
    manifest.write_text(ROUTES.replace('"priority": 9', '"priority": 9, "timeToLiveSecs": 10'))
    config = ForwardingConfig(enabled=True, manifest=manifest, cleanup_interval_s=60, metrics_interval_s=3600)

    async def body() -> None:
        runtime = FakeRuntime.on_running_loop()
        service = ForwardingService(config, tmp_path, "gw1", runtime=runtime)
        await service.start(SilentBroker())
        assert service.store is not None
        try:
            for n in range(3):
                assert await service.on_publish(publish(n)) is ACCEPTED
            await waiting.until(lambda: 60.0 in runtime.deadlines(), what="the first cleanup done, the next due")
            await runtime.elapse(59.999)
            assert service.figures.counters["expired"][("upstream", 9)] == 0  # expired at 10 s, not yet removed
            assert await service.thread.call(service.store.message_count) == 3
            await runtime.elapse(0.001)
            await waiting.until(lambda: service.figures.counters["expired"][("upstream", 9)] == 3,
                                what="the cleanup at 60 s")
            assert await service.thread.call(service.store.message_count) == 0
        finally:
            await service.stop()

    asyncio.run(body())


def test_a_store_that_cannot_commit_refuses_with_quota_exceeded_logs_once_and_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SQLITE_FULL (SQLite's own size limit, as a full disk): MQTT 5 gets 0x97; 3.1.1, which cannot be
    told no, is disconnected so the broker sends no PUBACK; one log line for any number of refusals."""
    manifest = tmp_path / "manifest.json"
    manifest.write_text(ROUTES)
    service = ForwardingService(ForwardingConfig(enabled=True, manifest=manifest), tmp_path, "gw1")

    async def body() -> None:
        await service.start(SilentBroker())
        store = service.store
        assert store is not None
        try:
            pages = await service.thread.call(lambda: store.db.execute("PRAGMA page_count").fetchone()[0])
            await service.thread.call(store.db.execute, f"PRAGMA max_page_count = {pages}")
            for n in range(10):
                v5 = await service.on_publish(publish(n, 50_000))
                assert (v5.reason_code, v5.disconnect) == (QUOTA_EXCEEDED, None)
                v3 = await service.on_publish(dataclasses.replace(publish(n, 50_000), protocol_level=4))
                assert (v3.reason_code, v3.disconnect) == (QUOTA_EXCEEDED, QUOTA_EXCEEDED)
            assert not service.health.healthy and service.health.refused == 20
            await service.thread.call(store.db.execute, "PRAGMA max_page_count = 1073741823")
            assert await service.on_publish(publish(99, 50_000)) is ACCEPTED
            assert service.health.healthy
        finally:
            await service.stop()

    with caplog.at_level(logging.WARNING, logger="appliance.forwarding"):
        asyncio.run(body())
    [failing] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "forwarding.db: cannot commit" in failing.getMessage() and "full" in failing.getMessage()


#: Every device-controlled field of the upstream topic.
HOSTILE_TEMPLATE = "gateways/{gateway_id}/devices/{device_id}/modules/{module_id}/outputs/{output}/{message_id}"
HOSTILE = st.lists(st.sampled_from(["+", "#", "/", "%", "=", "&", "$", ".", "\t", "\n", "\x00", "%23", "%2F", "%0A",
                                    "%FF", "%EF%BF%BF", "%24.on=", "a", "é", "\ufffe"]), max_size=8).map("".join)


@campaign(25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(HOSTILE, HOSTILE, HOSTILE, st.lists(st.tuples(HOSTILE, HOSTILE), max_size=2),
                          st.booleans()), min_size=1, max_size=8))
def test_whatever_a_device_publishes_is_refused_with_a_reason_or_can_go_upstream(
        tmp_path_factory: pytest.TempPathFactory, publishes: list) -> None:
    """Hostile device ids, module ids, bags and user properties, over MQTT 5 and 3.1.1, through the service
    and a real store: each is refused (a reason code, one count of its reason) or stored, and what is stored
    makes an upstream PUBLISH that no conforming server must refuse."""
    tmp_path = tmp_path_factory.mktemp("hostile")
    manifest = tmp_path / "manifest.json"
    manifest.write_text(ROUTES)
    service = ForwardingService(ForwardingConfig(enabled=True, manifest=manifest), tmp_path, "gw1")
    upstream = UpstreamSender(UpstreamConfig(host="cloud", topic_template=HOSTILE_TEMPLATE), "gw1", LinkStats())

    async def body() -> None:
        await service.start(SilentBroker())
        assert service.store is not None
        try:
            stored = 0
            for device, module, bag, user_properties, v5 in publishes:
                topic = f"devices/{device}/modules/{module}/messages/events/{bag}"
                refused_before = sum(service.figures.refused.values())
                verdict = await service.on_publish(InboundPublish(
                    "d", None, 5 if v5 else 4, topic, b"{}", 1, False, user_properties if v5 else []))
                if verdict.reason_code >= 0x80:
                    assert verdict.reason_code in (0x90, 0x99) and verdict.disconnect is None
                    assert sum(service.figures.refused.values()) == refused_before + 1
                elif verdict is ACCEPTED and service.figures.unrouted == 0:
                    stored += 1
            queued = await service.thread.call(service.store.read, "upstream", 9, 0, 100)
            assert len(queued) <= stored
            for item in queued:
                topic = upstream.topic_for(item)
                properties = identity_properties(item, "gw1", 0)
                assert upstream_problem(topic, properties, item.message.content_type, 0, None) is None, topic
                assert topic.count("/") == HOSTILE_TEMPLATE.count("/")
        finally:
            await service.stop()

    asyncio.run(body())
