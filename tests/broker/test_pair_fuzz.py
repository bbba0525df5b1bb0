"""Hostile input against the whole broker core, not only the codec: valid packets and garbage mixed,
cut at arbitrary points, on the fake clock (``tests/broker/pair.py``). Whatever arrives, the broker
must not hit an internal error (a bug it would log with a traceback), must end only the offending
connection, must keep serving everyone else, and reads the clock once per read it handles."""

from __future__ import annotations

import logging

import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from appliance.broker.codec import packets as pk
from appliance.broker.codec.writer import encode
from testing.campaigns import campaign
from tests.broker.pair import BrokerPair

TOPICS = st.sampled_from(["t", "t/a", "$SYS/x", "a/+/b", "#", "", "t/\u0000"])
REQUESTS = st.builds(lambda topic, qos, handling: pk.SubscribeRequest(topic, qos, retain_handling=handling),
                     TOPICS, st.integers(0, 2), st.integers(0, 2))
PACKETS = st.one_of(
    st.builds(lambda topic, payload, qos, retain, packet_id: pk.Publish(topic, payload, qos, retain, False, packet_id),
              TOPICS, st.binary(max_size=16), st.integers(0, 2), st.booleans(), st.integers(1, 5)),
    st.builds(lambda packet_id, requests: pk.Subscribe(packet_id, requests), st.integers(1, 5),
              st.lists(REQUESTS, min_size=1, max_size=3)),
    st.builds(lambda packet_id, filters: pk.Unsubscribe(packet_id, filters), st.integers(1, 5),
              st.lists(TOPICS, min_size=1, max_size=3)),
    st.builds(lambda kind, packet_id: kind(packet_id), st.sampled_from([pk.PubAck, pk.PubRec, pk.PubRel, pk.PubComp]),
              st.integers(1, 5)),
    st.just(pk.PingReq()),
    st.builds(lambda client_id: pk.Connect(5, client_id), st.sampled_from(["x", "victim", ""])),
)


@pytest.mark.parametrize("level", [pk.MQTT_311, pk.MQTT_5], ids=["mqtt311", "mqtt5"])
@campaign(150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.one_of(PACKETS, st.binary(min_size=1, max_size=24)), max_size=12),
       cuts=st.lists(st.integers(0, 400), max_size=6), advance=st.floats(0, 200))
def test_any_input_ends_at_most_its_own_connection(
    caplog: pytest.LogCaptureFixture, level: int, parts: list[pk.Packet | bytes], cuts: list[int], advance: float
) -> None:
    caplog.clear()
    pair = BrokerPair(None)
    victim = pair.client(level)
    victim.connect("victim", keep_alive=0)
    victim.subscribe("t/#", 1)
    attacker = pair.client(level)
    stream = encode(pk.Connect(level, "attacker"), level) + b"".join(
        p if isinstance(p, bytes) else encode(p, level) for p in parts
    )
    start = 0
    reads = pair.count_clock_reads()
    for cut in sorted(cuts) + [len(stream)]:
        if attacker.closed:
            break
        if cut > start:
            reads.update(now=0, monotonic=0)
            attacker.arrive(stream[start:cut])
            # One read is one batch: whatever it held and however it ended, the time was read once.
            assert reads["now"] <= 1 and reads["monotonic"] <= 1, reads
            pair.runtime.run()
            start = cut
    pair.advance(advance)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors[0].getMessage()
    # Everyone else is still served (unless the attacker legitimately took the victim's client id over).
    publisher = pair.client(level)
    publisher.connect("publisher")
    publisher.send(pk.Publish("t/ok", b"still here", qos=1, packet_id=9))
    if not victim.closed:
        assert b"still here" in [m.payload for m in victim.received() if isinstance(m, pk.Publish)]
    pair.stop()
