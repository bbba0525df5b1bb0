"""State store client over MQTT 5 request/response, as the Azure IoT Operations clients speak it.

Requests are QoS 1 PUBLISHes to the system topic with a response topic, correlation data and an
HLC `__ts` user property; the reply comes back on our response topic with the same correlation
data. Where the published spec and the official clients differ we follow the clients: a deletion
notifies `NOTIFY DELETE`. Only what a thermostat sends is here (GET, KEYNOTIFY): SET, DEL and VDEL
are the cloud's and the operator's, and their code would cost a 64 KB heap for nothing.

The module-level functions build and read payloads and topics with no I/O; `StateStoreClient`
is the blocking layer on `mqtt5.MQTTClient` (one request in flight, like umqtt's QoS 1).

Replies and notifications are decoded inside the MQTT callback, in place in the receive buffer:
a value up to `max_value` bytes is copied out, a longer one (or one whose message did not even fit
the buffer) becomes `resp3.TooLong(size)`. So no value, however large, costs more than
`max_value` bytes of heap, and the caller still gets an answer it can report.
"""

import binascii
import gc
import os
import time

import resp3
from mqtt5_codec import CORRELATION_DATA, RESPONSE_TOPIC, USER_PROPERTY, Oversized

SYSTEM_TOPIC = "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke"
NOTIFY_ROOT = "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/"


class StateStoreError(Exception):
    """The store answered `-ERR <text>` (str(e) is the text) or something unparseable."""


class StateStoreTimeout(StateStoreError):
    """No reply in time; the MQTT connection itself may be fine (its keep-alive decides that)."""


def notify_topic(client_id, key) -> str:
    """Client id and key in RFC 4648 base16, upper case."""
    client_id, key = [(v.encode() if isinstance(v, str) else bytes(v)) for v in (client_id, key)]
    return (NOTIFY_ROOT + binascii.hexlify(client_id).decode().upper() + "/command/notify/"
            + binascii.hexlify(key).decode().upper())


def response_topic(client_id) -> str:
    """The spec's recommended form; never under the system or notification topics."""
    return "clients/%s/services/statestore/_any_/command/invoke/response" % client_id


def user_property(props, name: str):
    for pname, value in props.get(USER_PROPERTY, ()):
        if pname == name:
            return value
    return None


def decode_payload(payload):
    """RESP3 from a message payload: bytes, a memoryview, or the head of an `Oversized` one."""
    if isinstance(payload, Oversized):
        return resp3.decode(payload.head, True)
    return resp3.decode(payload)


def parse_notification(topic, payload):
    """(key bytes, "SET" or "DELETE", value or None) from a notification; ValueError if malformed.
    The value is whatever `decode_payload` made of it (a view into payload, or TooLong)."""
    topic = topic.decode() if isinstance(topic, (bytes, bytearray)) else topic
    _, sep, key_hex = topic.rpartition("/command/notify/")
    if not sep:
        raise ValueError("not a notification topic")
    key = binascii.unhexlify(key_hex)
    message = decode_payload(payload)
    if (not isinstance(message, list) or len(message) < 2 or isinstance(message[0], resp3.TooLong)
            or isinstance(message[1], resp3.TooLong) or bytes(message[0]) != b"NOTIFY"):
        raise ValueError("malformed notification")
    operation = bytes(message[1]).decode()
    if operation == "SET":
        if len(message) != 4 or isinstance(message[2], resp3.TooLong) or bytes(message[2]) != b"VALUE":
            raise ValueError("malformed SET notification")
        return key, "SET", message[3]
    if operation in ("DELETE", "DEL") and len(message) == 2:
        return key, "DELETE", None
    raise ValueError("unknown notification %r" % operation)


class StateStoreClient:
    """Blocking state store calls. Install before connecting: it takes over the MQTT callback and
    passes everything that is not a state store message to `on_other(topic, payload, props)`.

    `on_notify(key, operation, value, version)` is called for every KEYNOTIFY notification.
    Call `start()` after every (re)connect: subscriptions and registrations die with the connection.
    Values (GET replies, notifications) longer than `max_value` bytes arrive as `resp3.TooLong`.
    """

    def __init__(self, mqtt, hlc, timeout_ms=5000, on_notify=None, on_other=None, max_value=256):
        self.mqtt = mqtt
        self.max_value = max_value
        self.hlc = hlc
        self.timeout_ms = timeout_ms
        self.on_notify = on_notify
        self.on_other = on_other
        self.client_id = mqtt.client_id
        self.resp_topic = response_topic(mqtt.client_id)
        self._corr_prefix = os.urandom(4)  # stale replies from an earlier boot never match
        self._corr_count = 0
        self._waiting = None
        self._reply = None
        self._merge_clock = True
        mqtt.set_callback(self._on_message)

    def start(self) -> None:
        self.client_id = self.mqtt.client_id
        self.resp_topic = response_topic(self.client_id)
        self.mqtt.subscribe(self.resp_topic, 1)

    def _stamp(self, props) -> None:
        stamp = user_property(props, "__ts")
        if stamp:
            try:
                self.hlc.receive(stamp)
            except ValueError as e:
                print("statestore: ignoring clock:", e)

    def _keep(self, value):
        """A bulk string out of the receive buffer: copied if short enough, else its size only."""
        if isinstance(value, memoryview):
            return bytes(value) if len(value) <= self.max_value else resp3.TooLong(len(value))
        return value

    def _on_message(self, topic, payload, props) -> None:
        # payload is a view into the receive buffer, valid only now: decode it here, keep little.
        # What is kept (a set point's value and version, the clock) is allocated after a collection: the
        # garbage of the messages before (a burst of set points during registration) is gone, so it
        # lands in the lowest hole instead of above that garbage, in the middle of the largest free
        # block once the garbage is collected (3.9-4.4 KB instead of 7 KB, measured).
        gc.collect()
        if topic == self.resp_topic.encode():
            if props.get(CORRELATION_DATA) == self._waiting:
                if self._merge_clock:
                    self._stamp(props)
                try:
                    value = self._keep(decode_payload(payload))
                except ValueError as e:
                    value = StateStoreError(str(e))
                self._reply = (value, user_property(props, "__ts"))
            return
        if topic.startswith(NOTIFY_ROOT.encode()):
            self._stamp(props)
            try:
                key, op, value = parse_notification(topic, payload)
            except ValueError as e:
                print("statestore: bad notification:", e)
                return
            if self.on_notify:
                self.on_notify(key, op, self._keep(value), user_property(props, "__ts"))
            return
        if self.on_other:
            self.on_other(topic, payload, props)

    def request(self, payload: bytes, stamp=None):
        """Send one request and wait for its reply: (decoded RESP3 value, version or None).
        stamp: the `__ts` to send instead of our HLC's next one.

        Raises StateStoreError for `-ERR`, StateStoreTimeout when no reply comes in time."""
        self._corr_count += 1
        corr = self._corr_prefix + self._corr_count.to_bytes(4, "big")
        props = {RESPONSE_TOPIC: self.resp_topic, CORRELATION_DATA: corr,
                 USER_PROPERTY: [("__ts", stamp or self.hlc.send())]}
        self._waiting, self._reply = corr, None
        self._merge_clock = stamp is None  # report()'s reply is the clock reading itself
        try:
            self.mqtt.publish(SYSTEM_TOPIC, payload, qos=1, props=props)
            deadline = time.ticks_add(time.ticks_ms(), self.timeout_ms)
            while self._reply is None:
                left = time.ticks_diff(deadline, time.ticks_ms())
                if left <= 0:
                    raise StateStoreTimeout("no reply within %d ms" % self.timeout_ms)
                self.mqtt.wait_msg(left)
        finally:
            self._waiting = None
        value, version = self._reply
        self._reply = None
        if isinstance(value, StateStoreError):
            raise value
        if isinstance(value, resp3.Resp3Error):
            raise StateStoreError(str(value))
        return value, version

    def report(self, key, value):
        """SET key value, stamped at time zero so that the store's clock, not ours, versions it:
        returns that version, which is the gateway's time now. This is how the thermostat reads
        the gateway's clock at every (re)connect whatever its own says (a stamp from a clock hours
        ahead would be refused; one from the epoch never is). SET is the one request whose reply
        carries the store's current time; GET replies carry the entry's, KEYNOTIFY's none."""
        reply, version = self.request(resp3.encode_command("SET", key, value),
                                      "%015d:%05d:%s" % (0, 0, self.hlc.node_id))
        if reply != "OK" or not version:
            raise StateStoreError("unexpected SET reply %r" % (reply,))
        return version

    def get(self, key):
        """(value bytes, TooLong or None, version or None)."""
        reply, version = self.request(resp3.encode_command("GET", key))
        if reply is not None and not isinstance(reply, (bytes, resp3.TooLong)):
            raise StateStoreError("unexpected GET reply %r" % (reply,))
        return reply, version

    def watch(self, key) -> None:
        """Subscribe to key's notification topic, wait for the SUBACK, then KEYNOTIFY: the order
        the spec requires so no change slips between the two. (No KEYNOTIFY STOP: registrations
        end with the connection, and a thermostat never stops watching its key.)"""
        self.mqtt.subscribe(notify_topic(self.client_id, key), 1)
        reply, _ = self.request(resp3.encode_command("KEYNOTIFY", key))
        if reply != "OK":
            raise StateStoreError("unexpected KEYNOTIFY reply %r" % (reply,))
