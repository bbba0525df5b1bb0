"""`paho_clients.close` ends a looping client at once instead of waiting for its network thread's wake-up."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt

from testing import paho_clients, run_queue
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

        # The close is this thread's and the network thread's work: what they waited for a CPU meanwhile is
        # a loaded host's (a CI host at load 9 on 2 cores), not a wait in the close.
        network = client._thread  # paho's own network thread (loop_start)
        assert network is not None and network.native_id is not None
        with run_queue.sampling(os.getpid(), threading.get_native_id()) as own_waits, \
                run_queue.sampling(os.getpid(), network.native_id) as network_waits:
            started = time.time()
            paho_clients.close(client)
            took = time.time() - started
        waited = own_waits.between(started, started + took) + network_waits.since(started)

        assert took - waited < CLOSE_BOUND_S, (took, waited)
        assert not client.is_connected()
