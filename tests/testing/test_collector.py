"""The suite's one collector (`testing.collector`) against the real broker on loopback: what the tests
that use it take for granted."""

from __future__ import annotations

import socket
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from testing.collector import Collector, CollectorError, Received
from testing.inprocess import InProcessBroker
from testing.waiting import WaitTimeout


def test_what_is_published_once_the_constructor_returned_is_kept_in_order(tmp_path: Path) -> None:
    with InProcessBroker(tmp_path) as hosted, Collector(hosted.host, hosted.port, "t/#") as collector, \
            Collector(hosted.host, hosted.port) as publisher:
        for n in range(3):
            publisher.publish(f"t/{n}", b"%d" % n, user_properties=[("n", str(n))])
        kept = collector.wait_for(3)
        assert [(m.topic, m.payload, m.n, m.qos) for m in kept] == [(f"t/{n}", b"%d" % n, n, 1) for n in range(3)]
        assert all(isinstance(m, Received) and m.properties is not None for m in kept)
        assert collector.wait_for_topic("t/1").payload == b"1"


def test_next_reads_each_message_once_and_skips_what_does_not_match(tmp_path: Path) -> None:
    with InProcessBroker(tmp_path) as hosted, Collector(hosted.host, hosted.port, "t/#", protocol=mqtt.MQTTv311) as collector:
        for topic, payload in (("t/a", b'{"v": 1}'), ("t/b", b'{"v": 2}'), ("t/a", b'{"v": 3}')):
            collector.publish(topic, payload)
        assert collector.next().topic == "t/a"
        assert collector.next_json("/a") == {"v": 3}  # t/b is skipped, and counts as read
        with pytest.raises(WaitTimeout):
            collector.next(timeout=0.2)
        collector.publish("t/c", b"{}")
        collector.wait_for(4)
        assert [m.topic for m in collector.read_all()] == ["t/c"]
        assert len(collector.messages) == 4  # reading does not remove


def test_topics_set_aside_stay_out_of_messages(tmp_path: Path) -> None:
    with InProcessBroker(tmp_path) as hosted, \
            Collector(hosted.host, hosted.port, "g/#", aside={"g/metrics"}) as collector:
        collector.publish("g/metrics", b"{}")
        collector.publish("g/data", b"x")
        assert collector.wait_for_topic("g/metrics").payload == b"{}"
        assert [m.topic for m in collector.wait_for(1)] == ["g/data"]
        assert [m.topic for m in collector.set_aside] == ["g/metrics"]


def test_a_wait_that_times_out_says_what_it_saw(tmp_path: Path) -> None:
    with InProcessBroker(tmp_path) as hosted, Collector(hosted.host, hosted.port, "t/#", name="tap") as collector, \
            pytest.raises(WaitTimeout, match="tap: 0 of 2 messages"):
        collector.wait_for(2, timeout=0.1)


def test_nothing_listening_is_a_collector_error_not_a_hang() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # bound, never listening: connections are refused
        with pytest.raises(CollectorError, match="cannot connect"):
            Collector("127.0.0.1", port, "t/#")


def test_a_durable_collector_comes_back_to_what_was_queued_while_it_was_away(tmp_path: Path) -> None:
    durable = {"client_id": "durable-collector", "clean_start": False, "session_expiry": 600}
    with InProcessBroker(tmp_path) as hosted, Collector(hosted.host, hosted.port) as publisher:
        with Collector(hosted.host, hosted.port, "cmd/#", **durable) as first:
            assert first.session_present is False
        for n in range(3):
            publisher.publish(f"cmd/{n}", b"%d" % n)
        with Collector(hosted.host, hosted.port, **durable) as back:
            assert back.session_present is True
            assert [m.payload for m in back.wait_for(3)] == [b"0", b"1", b"2"]
        with Collector(hosted.host, hosted.port, "cmd/#", client_id="durable-collector") as clean:
            assert clean.session_present is False  # clean start: the kept session is gone
