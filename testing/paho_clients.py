"""Closing a paho-mqtt client that runs its network thread (``loop_start``) without waiting for nothing."""

from __future__ import annotations

import paho.mqtt.client as mqtt


def close(client: mqtt.Client) -> None:
    """DISCONNECT, then join the network thread.

    In this order the thread sends the DISCONNECT and its loop ends at once. The other way round,
    ``loop_stop`` waits for the thread's next wake-up, up to its 1 s select timeout (0.7 s measured on an
    idle client), and then ``disconnect`` sends the same packet from the caller: every close of a test's
    collector, device or tap cost that second for nothing.
    """
    client.disconnect()
    client.loop_stop()
