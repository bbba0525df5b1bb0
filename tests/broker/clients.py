"""Test clients for the broker: a raw-socket client built on our codec (exact bytes, exact reason codes)
and a thin wrapper around a real paho-mqtt client (interop). Both wait on events with timeouts, never on
fixed sleeps; a test proves an absence with a sentinel sent after what must not arrive."""

from __future__ import annotations

import contextlib
import itertools
import queue
import socket
import threading
import time
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from appliance.broker.codec import packets as pk
from appliance.broker.codec.reader import PacketReader
from appliance.broker.codec.writer import encode
from testing.processes import GatewayProcess

TIMEOUT = 10.0
_ids = itertools.count(1)


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_ids)}-{time.monotonic_ns() % 1_000_000}"


class RawClient:
    """A blocking MQTT client on a plain socket that speaks through our codec."""

    def __init__(self, port: int, level: int = 5, host: str = "127.0.0.1", source: str | None = None) -> None:
        """``source``: the local address to connect from (127.0.0.2 ... are all loopback on Linux)."""
        self.sock = socket.create_connection((host, port), timeout=TIMEOUT,
                                             source_address=(source, 0) if source is not None else None)
        self.level = level
        self.reader = PacketReader(protocol_level=level)
        self.pending: list[pk.Packet] = []

    def send(self, packet: pk.Packet | bytes) -> None:
        self.sock.sendall(packet if isinstance(packet, bytes) else encode(packet, self.level))

    def connect(self, client_id: str, clean_start: bool = True, keep_alive: int = 60, **kwargs: Any) -> pk.Connack:
        self.send(pk.Connect(self.level, client_id, clean_start, keep_alive, **kwargs))
        connack = self.expect(pk.Connack)
        return connack

    def recv(self, timeout: float = TIMEOUT) -> pk.Packet:
        """The next packet; raises TimeoutError, or ConnectionError when the broker closed the socket."""
        deadline = time.monotonic() + timeout
        while not self.pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no packet arrived")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise TimeoutError("no packet arrived") from None
            if not data:
                raise ConnectionError("closed by the broker")
            self.pending += self.reader.feed(data)
        return self.pending.pop(0)

    def expect(self, kind: type, timeout: float = TIMEOUT) -> Any:
        packet = self.recv(timeout)
        assert isinstance(packet, kind), f"expected {kind.__name__}, got {packet!r}"
        return packet

    def expect_closed(self, timeout: float = TIMEOUT) -> list[pk.Packet]:
        """Read until the broker closes the connection; returns what arrived before."""
        seen: list[pk.Packet] = []
        while True:
            try:
                seen.append(self.recv(timeout))
            except ConnectionError:
                return seen
            except OSError:  # connection reset
                return seen

    def subscribe(self, topic_filter: str, qos: int = 0, packet_id: int = 1, **options: Any) -> pk.Suback:
        properties = options.pop("properties", {})
        self.send(pk.Subscribe(packet_id, [pk.SubscribeRequest(topic_filter, qos, **options)], properties))
        return self.expect(pk.Suback)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class PahoClient:
    """A real paho-mqtt client running its network loop in a thread; callbacks feed queues."""

    def __init__(self, port: int, client_id: str = "", v5: bool = True, clean: bool = True, transport: str = "tcp") -> None:
        self.port = port
        self.v5 = v5
        protocol = mqtt.MQTTv5 if v5 else mqtt.MQTTv311
        kwargs: dict[str, Any] = {"client_id": client_id, "protocol": protocol, "transport": transport}
        if not v5:
            kwargs["clean_session"] = clean
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, **kwargs)
        self.clean = clean
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.connacks: queue.Queue[tuple[Any, Any, Any]] = queue.Queue()
        self.subacks: queue.Queue[list[Any]] = queue.Queue()
        self.disconnects: queue.Queue[Any] = queue.Queue()
        self._acks: dict[int, threading.Event] = {}
        self._ack_codes: dict[int, Any] = {}
        self._lock = threading.Lock()
        self.client.on_connect = lambda c, u, flags, rc, props: self.connacks.put((flags, rc, props))
        self.client.on_message = lambda c, u, message: self.messages.put(message)
        self.client.on_subscribe = lambda c, u, mid, codes, props: self.subacks.put(codes)
        self.client.on_disconnect = lambda c, u, flags, rc, props: self.disconnects.put(rc)
        self.client.on_publish = self._on_publish

    def _on_publish(self, client: Any, userdata: Any, mid: int, reason_code: Any, properties: Any) -> None:
        with self._lock:
            self._ack_codes[mid] = reason_code
            self._acks.setdefault(mid, threading.Event()).set()

    def connect(self, keepalive: int = 60, session_expiry: int | None = None, **properties: Any) -> tuple[Any, Any, Any]:
        """Connect and start the network loop; returns on_connect's (flags, reason code, properties)."""
        props = None
        if self.v5:
            props = Properties(PacketTypes.CONNECT)
            if session_expiry is not None:
                props.SessionExpiryInterval = session_expiry
            for name, value in properties.items():
                setattr(props, name, value)
        if self.v5:
            self.client.connect("127.0.0.1", self.port, keepalive, clean_start=self.clean, properties=props)
        else:
            self.client.connect("127.0.0.1", self.port, keepalive)
        self.client.loop_start()
        return self.connacks.get(timeout=TIMEOUT)

    def subscribe(self, topic: str, qos: int = 0, **options: Any) -> list[Any]:
        properties = options.pop("properties", None)
        if self.v5:
            opts = mqtt.SubscribeOptions(qos=qos, **options)
            self.client.subscribe(topic, options=opts, properties=properties)
        else:
            self.client.subscribe(topic, qos)
        return self.subacks.get(timeout=TIMEOUT)

    def publish(self, topic: str, payload: bytes | str, qos: int = 0, retain: bool = False,
                properties: Properties | None = None, wait: bool = True) -> Any:
        info = self.client.publish(topic, payload, qos, retain, properties)
        if not wait or qos == 0:
            return None
        with self._lock:
            event = self._acks.setdefault(info.mid, threading.Event())
        assert event.wait(TIMEOUT), f"no acknowledgement for message {info.mid}"
        return self._ack_codes.get(info.mid)

    def get(self, timeout: float = TIMEOUT) -> mqtt.MQTTMessage:
        return self.messages.get(timeout=timeout)

    def disconnect(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def stop(self) -> None:
        """Stop without DISCONNECT: the network loop ends and the socket is closed abruptly."""
        self.client.loop_stop()
        sock = self.client.socket()
        if sock is not None:
            sock.close()


class FileConfiguredGateway(GatewayProcess):
    """The gateway with the listeners of its config file (no ``--listen`` override)."""

    def command(self) -> list[str]:
        command = super().command()
        index = command.index("--listen")
        return command[:index] + command[index + 2 :]
