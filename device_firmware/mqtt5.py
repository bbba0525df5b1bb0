"""A small MQTT 5 client for MicroPython with the API of `umqtt.simple.MQTTClient`.

umqtt.simple speaks MQTT 3.1.1 only; the state store needs MQTT 5 (response topic, correlation
data, user properties). The method names and blocking behaviour match umqtt.simple so its users
feel at home; the callback gets a third argument, the PUBLISH properties. Differences: the socket
is non-blocking and read through `select.poll` into the codec's receive buffer (never byte by
byte), payloads reach the callback as memoryviews into that buffer (valid during the call; a
message larger than the buffer arrives as `mqtt5_codec.Oversized`), `check_msg()` also runs the
keep-alive, judged on what we *receive*, and failures carry MQTT 5 reason codes.
Packets are built and parsed by `mqtt5_codec` (no I/O there).
"""

import errno
import select
import socket
import time

# The codec's constants are read as `codec.X`, not imported: each imported name would be one more
# entry in this module's globals for the run (about 160 B for these eleven; docs/firmware.md, Memory).
import mqtt5_codec as codec


class MQTTException(Exception):
    """The broker refused something: `code` is the MQTT 5 reason code (>= 0x80)."""

    def __init__(self, code: int, what: str, reason_string=None):
        super().__init__("%s failed: reason 0x%02x%s" % (what, code, " (%s)" % reason_string if reason_string else ""))
        self.code = code
        self.reason_string = reason_string


class MQTTClient:
    def __init__(self, client_id, server, port=1883, user=None, password=None, keepalive=0,
                 ssl=None, buf_size=1024, session_expiry=0, receive_maximum=8,
                 timeout_ms=5000, recv_size=512):
        # buf_size bounds what we send; recv_size only what we keep whole (larger is Oversized).
        self.client_id = client_id
        self.server = server
        self.port = port
        self.user = user
        self.password = password
        self.keepalive = keepalive
        self.ssl = ssl
        self.session_expiry = session_expiry
        self.receive_maximum = receive_maximum
        self.timeout_ms = timeout_ms
        self.sock = None
        self.poller = None
        self.cb = None
        self.packer = codec.Packer(buf_size)
        self.framer = codec.Framer(recv_size)
        self.pid = 0
        self.acks = {}  # packet id -> (reason codes, properties) of PUBACK/SUBACK not yet claimed
        self.last_tx = self.last_rx = 0
        self.ping_sent = None  # ticks_ms of the unanswered PINGREQ, None when none is outstanding
        self.max_send = buf_size

    def set_callback(self, f) -> None:
        """f(topic: bytes, payload, props: dict) for every incoming PUBLISH. payload is a memoryview
        valid only during the call (copy what you keep), or `Oversized` for a message larger than
        the receive buffer."""
        self.cb = f

    def _next_pid(self) -> int:
        self.pid = self.pid % 65535 + 1
        return self.pid

    def connect(self, clean_session=True, timeout_ms=None, props=None) -> bool:
        """Open the connection; returns the CONNACK's session-present flag.

        props: extra CONNECT properties. Session expiry and receive maximum are always sent; no
        Maximum Packet Size, because any size is framed (an oversized message is skipped and
        still reported), and a broker that dropped it instead would leave a request unanswered.
        """
        timeout_ms = timeout_ms or self.timeout_ms
        self.close()
        addr = socket.getaddrinfo(self.server, self.port, 0, socket.SOCK_STREAM)[0][-1]
        sock = socket.socket()
        try:
            sock.settimeout(timeout_ms / 1000)
            sock.connect(addr)
            if self.ssl:
                sock = self.ssl.wrap_socket(sock, server_hostname=self.server)
            sock.setblocking(False)
        except Exception:
            sock.close()
            raise
        self.sock = sock
        self.poller = select.poll()
        self.poller.register(sock, select.POLLIN)
        self.framer.reset()
        self.acks = {}
        self.ping_sent = None
        self.last_rx = time.ticks_ms()
        cprops = {codec.SESSION_EXPIRY: self.session_expiry, codec.RECEIVE_MAXIMUM: self.receive_maximum}
        if props:
            cprops.update(props)
        try:
            self._send(self.packer.connect(self.client_id, self.keepalive, clean_session, cprops,
                                           self.user, self.password))
            packet = self._wait_packet(timeout_ms)
            if packet is None or packet[0] != codec.CONNACK:
                raise OSError(errno.ETIMEDOUT) if packet is None else codec.MQTTProtocolError(0x82)
            present, reason, cprops = codec.decode_packet(*packet)
            if reason >= 0x80:
                raise MQTTException(reason, "CONNECT", cprops.get(codec.REASON_STRING))
        except Exception:
            self.close()
            raise
        self.keepalive = cprops.get(codec.SERVER_KEEP_ALIVE, self.keepalive)
        self.client_id = cprops.get(codec.ASSIGNED_CLIENT_ID, self.client_id)
        self.max_send = cprops.get(codec.MAXIMUM_PACKET_SIZE, len(self.packer.buf))
        return present

    def close(self) -> None:
        """Drop the connection without a DISCONNECT (it is dead, or we give up on it)."""
        if self.sock:
            try:
                self.sock.close()
            except OSError:
                pass
        self.sock = None

    def disconnect(self, reason: int = 0) -> None:
        try:
            if self.sock:
                self._send(self.packer.disconnect(reason))
        finally:
            self.close()

    def ping(self) -> None:
        self._send(self.packer.pingreq())
        if self.ping_sent is None:
            self.ping_sent = time.ticks_ms()

    def publish(self, topic, msg, retain=False, qos=0, props=None, timeout_ms=None):
        """Send a PUBLISH. QoS 1 waits for the PUBACK (dispatching incoming messages meanwhile)
        and raises MQTTException if its reason code is a failure. Returns the packet id (0 for QoS 0)."""
        if isinstance(msg, str):
            msg = msg.encode()
        pid = self._next_pid() if qos else 0
        self._send(self.packer.publish(topic, msg, qos, retain, pid, props))
        if qos:
            codes, aprops = self._wait_ack(pid, timeout_ms)
            if codes[0] >= 0x80:
                raise MQTTException(codes[0], "PUBLISH", aprops.get(codec.REASON_STRING))
        return pid

    def subscribe(self, topic, qos=0, props=None, timeout_ms=None) -> int:
        """Subscribe and wait for the SUBACK; returns the granted QoS, raises MQTTException on refusal."""
        pid = self._next_pid()
        self._send(self.packer.subscribe(pid, topic, qos, props))
        codes, aprops = self._wait_ack(pid, timeout_ms)
        if codes[0] >= 0x80:
            raise MQTTException(codes[0], "SUBSCRIBE", aprops.get(codec.REASON_STRING))
        return codes[0]

    def wait_msg(self, timeout_ms=None):
        """Handle one incoming packet, waiting up to timeout_ms (None: forever); returns its
        type, or None on timeout."""
        packet = self._wait_packet(timeout_ms)
        if packet is None:
            return None
        self._handle(packet)
        return packet[0]

    def check_msg(self) -> None:
        """Handle every packet that has already arrived, without blocking, and keep the connection
        alive: PINGREQ when the broker has been quiet for half the keep-alive (or we for 3/4 of
        it), OSError(ETIMEDOUT) when that PINGREQ stays unanswered for a whole keep-alive."""
        while True:
            packet = self._wait_packet(0)
            if packet is None:
                break
            self._handle(packet)
        self._keep_alive()

    # --- internals ---------------------------------------------------------------------------

    def _keep_alive(self) -> None:
        # Judged on what we receive: telemetry keeps us sending, so a broker that hangs with its
        # socket open is only noticed by its silence. Anything received (PINGRESP, PUBACK, a
        # message) proves it alive and clears the outstanding ping.
        if not self.keepalive:
            return
        now = time.ticks_ms()
        period = self.keepalive * 1000
        if self.ping_sent is not None:
            if time.ticks_diff(now, self.ping_sent) > period:
                self.close()
                raise OSError(errno.ETIMEDOUT)
        elif (time.ticks_diff(now, self.last_rx) >= period // 2
              or time.ticks_diff(now, self.last_tx) >= period * 3 // 4):
            self.ping()

    def _send(self, packet) -> None:
        if self.sock is None:
            raise OSError(errno.ENOTCONN)
        if len(packet) > self.max_send:
            raise ValueError("packet larger than the broker's maximum packet size")
        sent = 0
        deadline = time.ticks_add(time.ticks_ms(), self.timeout_ms)
        while sent < len(packet):
            n = self.sock.write(packet[sent:])
            if n:
                sent += n
                continue
            left = time.ticks_diff(deadline, time.ticks_ms())
            if left <= 0:
                self.close()
                raise OSError(errno.ETIMEDOUT)
            self.poller.modify(self.sock, select.POLLOUT)
            self.poller.poll(left)
            self.poller.modify(self.sock, select.POLLIN)
        self.last_tx = time.ticks_ms()

    def _wait_packet(self, timeout_ms):
        """Next whole packet from the receive buffer, reading the socket as needed; None on timeout."""
        if self.sock is None:
            raise OSError(errno.ENOTCONN)
        deadline = None if timeout_ms is None else time.ticks_add(time.ticks_ms(), timeout_ms)
        while True:
            packet = self.framer.next_packet()
            if packet is not None:
                self.last_rx = time.ticks_ms()
                self.ping_sent = None
                return packet
            left = -1 if deadline is None else max(0, time.ticks_diff(deadline, time.ticks_ms()))
            events = self.poller.poll(left)
            if not events:
                return None
            if events[0][1] & (select.POLLHUP | select.POLLERR) and not events[0][1] & select.POLLIN:
                self.close()
                raise OSError(errno.ECONNRESET)
            n = self.sock.readinto(self.framer.space())
            if n == 0:
                self.close()
                raise OSError(errno.ECONNRESET)
            if n:
                self.framer.added(n)

    def _wait_ack(self, pid: int, timeout_ms):
        deadline = time.ticks_add(time.ticks_ms(), timeout_ms or self.timeout_ms)
        while pid not in self.acks:
            left = time.ticks_diff(deadline, time.ticks_ms())
            if left <= 0 or self.wait_msg(left) is None:
                raise OSError(errno.ETIMEDOUT)
        return self.acks.pop(pid)

    def _handle(self, packet) -> None:
        kind = packet[0]
        fields = codec.decode_packet(*packet)  # every check of what arrived is there
        if kind == codec.PUBLISH:
            topic, payload, qos, pid, retain, props = fields
            if self.cb:
                self.cb(topic, payload, props)
            if qos == 1:
                self._send(self.packer.puback(pid))
            elif qos == 2:
                # We never subscribe with QoS 2, so a QoS 2 PUBLISH is a broker error.
                raise codec.MQTTProtocolError(0x82)
        elif kind == codec.PUBACK:
            pid, reason, props = fields
            self.acks[pid] = ([reason], props)
        elif kind == codec.SUBACK:
            pid, reasons, props = fields
            self.acks[pid] = (reasons, props)
        elif kind == codec.DISCONNECT:
            reason, props = fields
            self.close()
            raise MQTTException(reason, "connection", props.get(codec.REASON_STRING))
        elif kind == codec.CONNACK:
            raise codec.MQTTProtocolError(0x82)
        # PINGRESP: nothing to do, _wait_packet already cleared the outstanding ping.
