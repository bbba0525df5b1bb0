"""The socket layer's lingering close (``server.py``, issue 12 item 13), over real sockets.

When the server ends a connection while the client is still sending (here: more unacknowledged QoS 2
messages than the Receive Maximum, 0x93), closing the socket at once makes the kernel answer the unread
input with a reset, and the client loses what we wrote last (the DISCONNECT, PUBRECs). The server now
sends its last bytes, shuts down its write side, drains and discards input for up to LINGER_SECONDS,
then closes: the client reads everything, then an orderly end of stream. MQTT 3.1.1 and 5 both.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from appliance.broker.codec import packets as pk
from appliance.broker.codec import reasons as rc
from appliance.broker.codec.reader import PacketReader
from appliance.broker.codec.writer import encode
from appliance.broker.config import LimitsConfig
from testing.inprocess import InProcessBroker

RECEIVE_MAXIMUM = LimitsConfig().receive_maximum


@pytest.fixture(scope="module")
def hosted() -> Iterator[InProcessBroker]:
    with InProcessBroker(None) as broker:
        yield broker


def flood_then_read(port: int, level: int) -> tuple[list[pk.Packet], str]:
    """Send CONNECT, RECEIVE_MAXIMUM + 100 QoS 2 PUBLISHes and 1 MB of QoS 0 ones without waiting, read
    until the broker ends the connection; returns what arrived and how the stream ended."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    blob = bytearray(encode(pk.Connect(level, f"flood{level}"), level))
    for packet_id in range(1, RECEIVE_MAXIMUM + 101):
        blob += encode(pk.Publish("q2", b"x", qos=2, packet_id=packet_id), level)
    filler = encode(pk.Publish("q0", bytes(1000)), level)
    blob += filler * 1000

    def send() -> None:
        with contextlib.suppress(OSError):  # the broker stopped reading: what matters is what the reader saw
            sock.sendall(blob)

    sender = threading.Thread(target=send)
    sender.start()
    reader = PacketReader(protocol_level=level)
    packets: list[pk.Packet] = []
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                ending = "eof"
                break
            packets += reader.feed(data)
    except ConnectionResetError:
        ending = "reset"
    finally:
        sender.join(10)
        sock.close()
    return packets, ending


@pytest.mark.parametrize("level", [pk.MQTT_311, pk.MQTT_5], ids=["mqtt311", "mqtt5"])
def test_a_client_still_sending_reads_everything_up_to_the_end_of_stream(hosted: InProcessBroker, level: int) -> None:
    packets, ending = flood_then_read(hosted.port, level)
    assert ending == "eof"
    assert isinstance(packets[0], pk.Connack)
    assert sum(isinstance(p, pk.PubRec) for p in packets) == RECEIVE_MAXIMUM
    if level == pk.MQTT_5:
        assert isinstance(packets[-1], pk.Disconnect) and packets[-1].reason_code == rc.RECEIVE_MAXIMUM_EXCEEDED


def test_closing_a_connection_whose_peer_already_reset_it_ends_it_without_an_error(hosted: InProcessBroker) -> None:
    """The peer's reset arrived, but the loop has not read it yet when the server ends the connection
    (a shutdown, a takeover): the half-close finds the socket no longer connected, and the connection
    must end quietly rather than raise out of the server's close (seen stopping a broker in a test run)."""
    sock = socket.create_connection(("127.0.0.1", hosted.port), timeout=10)
    sock.sendall(encode(pk.Connect(pk.MQTT_5, "reset-before-close"), pk.MQTT_5))
    reader = PacketReader(protocol_level=pk.MQTT_5)
    assert isinstance(reader.feed(sock.recv(1024))[0], pk.Connack)

    async def reset_then_close() -> None:
        # In one loop callback, so the loop cannot notice the reset in between.
        (link,) = [link for link in hosted.broker.links if link.connection.client_id == "reset-before-close"]
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # RST on loopback: the server's socket is reset at once
        link.close()

    hosted.call(reset_then_close())
    assert not [link for link in hosted.broker.links if link.connection.client_id == "reset-before-close" and
                link.transport is not None and not link.transport.is_closing()]
