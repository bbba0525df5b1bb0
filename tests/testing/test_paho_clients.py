"""`paho_clients.close` ends a looping client at once instead of waiting for its network thread's wake-up."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt

from testing import paho_clients
from testing.inprocess import InProcessBroker

#: An idle client's network thread wakes once a second; a close that waited for it took 0.7-1 s.
CLOSE_BOUND_S = 0.5


def test_closing_an_idle_looping_client_does_not_wait_for_its_network_thread(tmp_path: Path) -> None:
    with InProcessBroker(tmp_path) as hosted:
        connected = threading.Event()
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="closing", protocol=mqtt.MQTTv5)
        client.on_connect = lambda *_: connected.set()
        client.connect(hosted.host, hosted.port, keepalive=30)
        client.loop_start()
        assert connected.wait(10)
        time.sleep(0.1)  # the input: an idle client, its network thread in its select as between messages

        started = time.monotonic()
        paho_clients.close(client)
        took = time.monotonic() - started

        assert took < CLOSE_BOUND_S, took
        assert not client.is_connected()
