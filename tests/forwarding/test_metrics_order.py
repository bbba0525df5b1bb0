"""The gateway's metrics document carries an order no clock step breaks: a boot id per process and a
sequence number per document (docs/message-format.md, "Gateway metrics")."""

import json

from appliance.forwarding.metrics import ForwardingMetrics


def test_documents_carry_a_boot_id_and_a_sequence_that_ignores_the_clock():
    metrics = ForwardingMetrics()
    first = json.loads(metrics.to_json("gw1", [], 2_000_000))
    stepped_back = json.loads(metrics.to_json("gw1", [], 1_400_000))  # the clock stepped back 10 minutes
    assert first["boot_id"] == stepped_back["boot_id"] and len(first["boot_id"]) == 32
    assert (first["seq"], stepped_back["seq"]) == (1, 2)
    restarted = json.loads(ForwardingMetrics().to_json("gw1", [], 2_100_000))
    assert restarted["boot_id"] != first["boot_id"] and restarted["seq"] == 1
