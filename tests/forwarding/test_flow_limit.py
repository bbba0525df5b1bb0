"""How much the bridge may have in flight (appliance/forwarding/flow_limit.py): the measured link's
window in the upstream's format, bounded by the server's CONNACK."""

from __future__ import annotations

from appliance.forwarding.config import UpstreamConfig
from appliance.forwarding.flow_limit import PACKET_OVERHEAD, RECEIVE_MAXIMUM_DEFAULT, FlowLimit
from appliance.forwarding.window import LinkEstimate


def fast_link(estimate: LinkEstimate) -> None:
    """Batches over a link of about 1 MB/s with a 50 ms round trip."""
    for _ in range(12):
        n = estimate.window().messages
        estimate.record([1000] * n, [0.05 + 0.001 * (i + 1) for i in range(n)], sent_at=0.0)


def test_the_message_window_is_the_estimates_bounded_by_the_receive_maximum() -> None:
    limit = FlowLimit(UpstreamConfig(host="cloud"), LinkEstimate())
    fast_link(limit.estimate)
    window = limit.estimate.window().messages
    assert window > 20
    assert limit.in_flight() == window, "no Receive Maximum announced: 65535"
    limit.connected(max_packet=None, receive_max=10)
    assert limit.in_flight() == 10
    limit.connected(max_packet=None, receive_max=None)
    assert limit.receive_max == RECEIVE_MAXIMUM_DEFAULT and limit.in_flight() == window, "a new server's CONNACK"


def test_packed_publishes_fit_the_servers_maximum_packet_size() -> None:
    limit = FlowLimit(UpstreamConfig(host="cloud", format="batch", batch_max_bytes=64_000), LinkEstimate())
    fast_link(limit.estimate)
    assert limit.window().chunk_bytes == 64_000
    limit.connected(max_packet=4096, receive_max=None)
    window = limit.window()
    assert window.chunk_bytes == 4096 - PACKET_OVERHEAD
    assert window.bytes is not None and limit.in_flight() == max(2, -(-window.bytes // window.chunk_bytes))
    limit.connected(max_packet=100, receive_max=None)
    assert limit.window().chunk_bytes == 1, "a tiny Maximum Packet Size still leaves a positive chunk"


def test_at_least_two_packed_publishes_but_never_more_than_the_receive_maximum() -> None:
    limit = FlowLimit(UpstreamConfig(host="cloud", format="batch"), LinkEstimate())
    assert limit.in_flight() == 2, "before a measurement: two PUBLISHes, so their acks measure the link"
    limit.connected(max_packet=None, receive_max=1)
    assert limit.in_flight() == 1
