"""The ingest against a real mosquitto: what lands where, ack only after the write, shared subscriptions,
upstream batches."""

import subprocess
import sys
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from pipeline.ingest import Ingest, IngestConfig
from pipeline.landing import read_records
from tests.pipeline.pipeline_data import at, batch_publish, metrics, queued, reading

ROOT = Path(__file__).resolve().parents[2]


def publish(broker, messages):
    host, port = broker
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="gateway-under-test", protocol=mqtt.MQTTv5)
    client.connect(host, port)
    client.loop_start()
    try:
        for message in messages:
            props = Properties(PacketTypes.PUBLISH)
            if message.user_properties:
                props.UserProperty = list(message.user_properties)
            if message.content_type:
                props.ContentType = message.content_type
            client.publish(message.topic, message.payload, qos=1, properties=props).wait_for_publish(5)
    finally:
        client.loop_stop()
        client.disconnect()


class Running:
    """An Ingest on a thread; ``stop()`` commits, seals and disconnects, then returns the stats."""

    def __init__(self, broker, landing, client_id="ingest-test", **options):
        host, port = broker
        self.ingest = Ingest(IngestConfig(host=host, port=port, landing=str(landing), client_id=client_id, **options))
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.ingest.run, args=(self.stop_event,), daemon=True)
        self.thread.start()
        assert self.ingest.ready.wait(10), "ingest did not subscribe"

    def wait_for(self, landed, timeout=10.0):
        deadline = time.monotonic() + timeout
        while sum(self.ingest.stats.landed.values()) < landed:
            assert time.monotonic() < deadline, f"landed {self.ingest.stats.landed}, wanted {landed}"
            time.sleep(0.02)

    def stop(self):
        self.stop_event.set()
        self.thread.join(10)
        return self.ingest.stats


def test_events_metrics_and_bad_messages_land_in_their_partitions(mosquitto, tmp_path):
    now = int(time.time() * 1000)
    good = reading("gw1", "t1", 1, 0, 21.0, 22.0, True)
    bad = reading("gw1", "t1", 2, 0, 0, 0, False, payload=b"{oops")
    running = Running(mosquitto, tmp_path)
    publish(mosquitto, [good, bad, metrics("gw1", 0, {5: {"depth": 0}})])
    running.wait_for(3)
    stats = running.stop()
    assert stats.landed == {"events": 1, "metrics": 1, "quarantine": 1}

    (event,) = read_records(tmp_path, "events")
    assert event["message_id"] == "gw1:1" and event["priority"] == 5
    assert event["payload"] == good.payload.decode() and event["content_type"] == "application/json"
    assert now - 1000 <= event["received_ms"] <= int(time.time() * 1000)
    (quarantined,) = read_records(tmp_path, "quarantine")
    assert quarantined["message_id"] == "gw1:2" and "not valid JSON" in quarantined["reason"]
    assert read_records(tmp_path, "metrics")[0]["gateway_id"] == "gw1"


def test_message_is_redelivered_when_the_ingest_dies_before_writing_it(mosquitto, tmp_path):
    host, port = mosquitto
    crashing = subprocess.Popen(
        [sys.executable, "-m", "tests.pipeline.ingest_crash", host, str(port), str(tmp_path), "ingest-crash"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert crashing.stdout.readline().strip() == "ready"
        publish(mosquitto, [reading("gw1", "t1", 42, 0, 20.0, 20.0, False)])
        assert crashing.wait(10) == 17  # received it, died at the write: no line, no PUBACK
    finally:
        if crashing.poll() is None:
            crashing.kill()
    assert read_records(tmp_path, "events") == []

    restarted = Running(mosquitto, tmp_path, client_id="ingest-crash")  # same session
    restarted.wait_for(1)
    restarted.stop()
    (event,) = read_records(tmp_path, "events")
    assert event["message_id"] == "gw1:42" and event["redelivered"] is True

    # It was acknowledged after the write this time: a third run of the same session gets nothing of it,
    # only a message published after it connected (what the session still held would have come first).
    again = Running(mosquitto, tmp_path / "again", client_id="ingest-crash")
    publish(mosquitto, [reading("gw1", "t1", 43, 1, 20.0, 20.0, False)])
    again.wait_for(1)
    assert sum(again.stop().landed.values()) == 1
    (after,) = read_records(tmp_path / "again", "events")
    assert after["message_id"] == "gw1:43"


def test_shared_subscription_splits_messages_between_ingests(mosquitto, tmp_path):
    first = Running(mosquitto, tmp_path / "a", client_id="ingest-a")
    second = Running(mosquitto, tmp_path / "b", client_id="ingest-b")
    publish(mosquitto, [reading("gw1", "t1", n, n, 20.0, 20.0, False) for n in range(20)])
    deadline = time.monotonic() + 10
    while first.ingest.stats.landed["events"] + second.ingest.stats.landed["events"] < 20:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    first.stop(), second.stop()
    ids_a = {r["message_id"] for r in read_records(tmp_path / "a", "events")}
    ids_b = {r["message_id"] for r in read_records(tmp_path / "b", "events")}
    assert ids_a and ids_b and not ids_a & ids_b
    assert len(ids_a | ids_b) == 20


def test_a_batch_is_acknowledged_once_after_the_commit_that_holds_all_its_lines(tmp_path):
    """The group-commit flow with a batch PUBLISH (no broker: paho's message handed to the callback)."""
    items = [queued("t1", 1, 0), queued("t2", 2, 0, payload=b"{oops"), queued("t1", 3, 1)]
    batch = batch_publish("gw1", items, sent_ms=at(2), received_ms=at(2))
    ingest = Ingest(IngestConfig(landing=str(tmp_path), client_id="ingest-unit"))
    log = []
    append, commit = ingest.writer.append, ingest.writer.commit
    ingest.writer.append = lambda kind, record: (log.append(("append", kind, record["message_id"])),
                                                 append(kind, record))
    ingest.writer.commit = lambda: (log.append(("commit",)), commit())
    ingest.client.ack = lambda mid, qos: log.append(("ack", mid, qos))
    message = mqtt.MQTTMessage(mid=7, topic=batch.topic.encode())
    message.payload, message.qos = batch.payload, 1

    ingest._on_message(ingest.client, None, message)
    assert ("ack", 7, 1) not in log  # nothing acknowledged before the commit
    ingest._commit_and_ack()
    assert log == [("append", "events", "gw1:1"), ("append", "quarantine", "gw1:2"), ("append", "events", "gw1:3"),
                   ("commit",), ("ack", 7, 1)]
    assert ingest.stats.landed == {"events": 2, "metrics": 0, "quarantine": 1}
    ingest.writer.close()
    assert [r["message_id"] for r in read_records(tmp_path, "events")] == ["gw1:1", "gw1:3"]


@pytest.mark.slow  # a Spark job over what landed
def test_batches_land_every_message_and_the_jobs_drop_the_retried_copies(mosquitto, tmp_path, spark):
    from pipeline.envelope import EVENTS
    from pipeline.jobs import batch as batch_job
    from pipeline.jobs.bronze import read
    from pipeline.jobs.dedup import first_copies
    from pipeline.jobs.settings import JobSettings

    now = int(time.time() * 1000)
    items = [queued(f"t{n % 2 + 1}", 10 + n, n / 2) for n in range(6)]  # two thermostats, minutes 0-2.5
    first = batch_publish("gw1", items, sent_ms=now, received_ms=now)
    running = Running(mosquitto, tmp_path)  # the default topics, batches among them
    publish(mosquitto, [first, first])  # the same batch twice (a lost PUBACK, say)
    # A gateway retry packs the same messages differently, with a later send time.
    publish(mosquitto, [batch_publish("gw1", items[:4], sent_ms=now + 5, received_ms=now),
                        batch_publish("gw1", items[4:], sent_ms=now + 6, received_ms=now)])
    running.wait_for(18)
    stats = running.stop()
    assert stats.landed == {"events": 18, "metrics": 0, "quarantine": 0}

    landed = read_records(tmp_path, "events")
    ids = [f"gw1:{10 + n}" for n in range(6)]
    assert sorted(r["message_id"] for r in landed) == sorted(ids * 3)
    assert {r["topic"] for r in landed} == {"gateways/gw1/batches"}
    assert {r["sent_ms"] for r in landed} == {now, now + 5, now + 6}
    by_id = {r["message_id"]: r for r in landed if r["sent_ms"] == now}
    for item in items:
        record = by_id[f"gw1:{item.seq}"]
        assert (record["device_id"], record["enqueued_ms"], record["priority"]) == (
            item.message.device_id, item.enqueued_ms, 5)
        assert record["payload"] == item.message.payload.decode()

    settings = JobSettings(str(tmp_path), str(tmp_path / "out"))
    outputs = batch_job.build(spark, settings)  # compacts the landing zone into the bronze table
    kept = first_copies(read(spark, settings.bronze_path, EVENTS)).select("message_id").collect()
    assert sorted(row.message_id for row in kept) == ids
    rollups = outputs["rollups"].groupBy("device_id").sum("readings").collect()
    assert {row.device_id: row["sum(readings)"] for row in rollups} == {"t1": 3, "t2": 3}
    assert sum(row.delivered for row in outputs["delivery_latency"].collect()) == 6


def test_the_command_line_subscribes_to_batches_by_default_and_with_a_batch_topic(monkeypatch):
    import pipeline.ingest
    from pipeline.cli import main

    configs = []
    monkeypatch.setattr(pipeline.ingest, "run_ingest", lambda config: configs.append(config) or 0)
    main(["ingest", "--landing", "x"])
    main(["ingest", "--landing", "x", "--batch-topic", "up/+/b"])
    main(["ingest", "--landing", "x", "--topic", "only/#"])
    default, custom, explicit = configs
    assert list(default.topics) == list(IngestConfig().topics) == [
        "gateways/+/devices/+/messages/events", "gateways/+/metrics", "gateways/+/batches"]
    assert default.batch_filter == "gateways/+/batches"
    assert (list(custom.topics)[-1], custom.batch_filter) == ("up/+/b", "up/+/b")
    assert list(explicit.topics) == ["only/#"]
