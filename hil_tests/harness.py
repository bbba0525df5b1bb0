"""The moving parts of the end-to-end scenarios: gateway, thermostats, a tap on each side of the uplink.

A scenario sees the system the way an operator would: what the thermostats print (the simulated relay
prints every switch), what enters the gateway (a subscriber on the gateway's own broker, the *tap*), and
what reaches the cloud broker behind the rig (the *collector*). Both taps name every message the same way
(`message_key`, from the device's JSON payload), so a message's ``sent`` record (it entered the gateway,
which stores it before routing it to any subscriber) and its ``received`` record (it reached the cloud)
meet in the timeline. Duplicates are counted by the gateway's stable ``gw-message-id``. The collector reads
both upstream formats (docs/message-format.md): a batch PUBLISH is unpacked into one message per record,
with the ``gw-*`` properties the record would carry as a PUBLISH of its own (`record_properties`), so a
scenario sees the same messages whichever format the gateway sends.

Every wait is on a condition with a deadline (a condition variable, or the gateway's log, polled as
`GatewayProcess.wait_for_log` does); nothing here sleeps to synchronize. Time is compressed by
configuration only (short TTLs, keep-alives and telemetry periods), never by touching a clock.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt

from appliance.forwarding.batch import BatchFormatError, decode_batch, record_properties
from appliance.forwarding.config import DEFAULT_BATCH_TOPIC
from hil_tests.timeline import Timeline
from testing.collector import Collector
from testing.processes import GatewayProcess
from testing.waiting import wait_until

RUN_UNIX = Path(__file__).resolve().parents[1] / "images" / "firmware" / "run_unix.py"
#: The heap the bench's thermostats run with: they run the sources (see ``Thermostat.start``).
SOURCE_HEAP = "2M"

GATEWAY_ID = "gw-hil"
TELEMETRY_TOPICS = "devices/+/messages/events/+"
BATCH_TOPIC = DEFAULT_BATCH_TOPIC.format(gateway_id=GATEWAY_ID)  # [forwarding.upstream] format = "batch"
CLOUD_TOPICS = (f"gateways/{GATEWAY_ID}/devices/#", BATCH_TOPIC)
SET_POINT_SUFFIX = "\\setPoint"  # the firmware's key: `<thermostat>\setPoint`, a literal backslash


# -- timeline --------------------------------------------------------------------------------------------


class Recorder:
    """The scenario's timeline behind a lock: the taps write from paho threads, the rig from the test."""

    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline
        self._lock = threading.Lock()

    def sent(self, message_id: str, priority: int | None, device: str, **detail: Any) -> None:
        with self._lock:
            self.timeline.record("sent", message_id=message_id, priority=priority, device=device, detail=detail)

    def received(self, message_id: str, priority: int | None, device: str, **detail: Any) -> None:
        with self._lock:
            self.timeline.record("received", message_id=message_id, priority=priority, device=device, detail=detail)

    def expired(self, message_id: str, priority: int | None, device: str, **detail: Any) -> None:
        with self._lock:
            self.timeline.record("expired", message_id=message_id, priority=priority, device=device, detail=detail)

    def rig(self, command: str, reply: str) -> None:
        with self._lock:
            self.timeline.rig(command, reply)


# -- gateway ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    """One Edge Hub route of the manifest: telemetry of ``output`` to ``$upstream`` at ``priority``."""

    name: str
    output: str
    priority: int
    ttl_s: int
    devices: tuple[str, ...] = ()  # empty: every device

    def text(self) -> str:
        condition = f"$outputName = '{self.output}'"
        if self.devices:
            condition += " AND (" + " OR ".join(f"$connectionDeviceId = '{d}'" for d in self.devices) + ")"
        return f"FROM /messages/* WHERE {condition} INTO $upstream"

    def matches(self, device: str, output: str) -> bool:
        return output == self.output and (not self.devices or device in self.devices)


def priority_of(routes: tuple[Route, ...], device: str, output: str) -> int | None:
    """The priority the gateway gives a message (the highest of the matching routes), None if unrouted."""
    return min((r.priority for r in routes if r.matches(device, output)), default=None)


@dataclass(frozen=True)
class Site:
    """How a scenario's gateway is wired on this bench: where its uplink connects, and how it is started
    (on the host, or inside the netns rig's gateway namespace; the ``site`` fixture decides)."""

    upstream: tuple[str, int]
    gateway: Callable[[Path, Path], GatewayProcess]  # (data dir, config file) -> a gateway not yet started


def write_gateway_config(
    folder: Path, upstream: tuple[str, int], routes: tuple[Route, ...], keepalive_s: int = 1,
    upstream_format: str = "message",
) -> Path:
    """A gateway with store-and-forward to ``upstream`` (the rig's relay), tuned for compressed time.

    ``upstream_format`` is ``[forwarding.upstream] format``: ``message`` (one PUBLISH per message) or
    ``batch`` (several per PUBLISH on `BATCH_TOPIC`); the collector reads both.

    A 1 s upstream keep-alive makes a dead link show within about 2 s, a 0.5 s cleanup removes expired
    messages promptly, and short reconnect back-offs bring the bridge back soon after ``UP``. A keep-alive
    must outlast the link's queueing delay, though: on the kernel-shaped 9.6 kbit/s link a PINGREQ waits
    behind the batch already queued in TCP and tbf, and a 1 s keep-alive then takes a slow link for a dead
    one (a reconnect that costs an alert seconds), so scenarios that do not time outage detection give more.
    """
    folder.mkdir(parents=True, exist_ok=True)
    desired = {
        "schemaVersion": "1.1.0",
        "routes": {r.name: {"route": r.text(), "priority": r.priority, "timeToLiveSecs": r.ttl_s} for r in routes},
        "storeAndForwardConfiguration": {"timeToLiveSecs": 7200},
    }
    (folder / "manifest.json").write_text(json.dumps({"$edgeHub": {"properties.desired": desired}}))
    config = folder / "gateway.toml"
    config.write_text(
        f"""[gateway]
id = "{GATEWAY_ID}"

[forwarding]
enabled = true
manifest = "manifest.json"
cleanup_interval_s = 0.5

[forwarding.upstream]
host = "{upstream[0]}"
port = {upstream[1]}
keepalive_s = {keepalive_s}
format = "{upstream_format}"
backoff_min_s = 0.05
backoff_max_s = 0.5
"""
    )
    return config


def gateway_log(gateway: GatewayProcess) -> list[str]:
    return gateway.output().splitlines()


def wait_for_gateway_log(
    gateway: GatewayProcess, condition: Callable[[list[str]], bool], timeout: float, what: str
) -> list[str]:
    """Until ``condition(log lines)`` holds. The gateway's log is its only event source seen from outside,
    and `GatewayProcess` offers no notification, so this polls it as `GatewayProcess.wait_for_log` does."""
    lines: list[str] = []

    def holds() -> bool:
        lines[:] = gateway_log(gateway)
        return condition(lines)

    wait_until(holds, timeout, lambda: f"{what}; gateway log tail:\n" + "\n".join(lines[-30:]))
    return lines


CLEANUP_PATTERN = re.compile(r"cleanup removed \d+ expired messages: (.*)$")


def expired_by_cleanup(lines: list[str], queue: str) -> int:
    """How many messages the gateway's cleanup logged as expired from ``queue`` (e.g. ``upstream_Pri1``)."""
    total = 0
    for line in lines:
        match = CLEANUP_PATTERN.search(line)
        if match:
            for part in match.group(1).split(", "):
                name, _, count = part.partition("=")
                if name == queue:
                    total += int(count)
    return total


# -- MQTT peers ------------------------------------------------------------------------------------------


def message_key(device: str, output: str, payload: bytes) -> str | None:
    """A thermostat message's name, the same on both sides of the gateway: device, output, seq, time.

    The wall time is part of it because ``seq`` starts again at 1 when a thermostat reboots.
    """
    try:
        doc = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(doc, dict) or "ts_ms" not in doc:
        return None
    return f"{device}/{output}/{doc.get('seq', doc.get('alert'))}@{doc['ts_ms']}"


@dataclass(frozen=True)
class Seen:
    """One message as a tap saw it: its key, priority, device, output, arrival (monotonic) and properties."""

    key: str
    priority: int | None
    device: str
    output: str
    at: float
    payload: bytes
    properties: dict[str, str] = field(default_factory=dict)

    @property
    def gw_message_id(self) -> str:
        return self.properties["gw-message-id"]

    def gw_ms(self, name: str) -> int:
        return int(self.properties[name])


class _Subscriber(Collector[Seen]):
    """The suite's collector (`testing.collector`) keeping `Seen` records: it subscribes again after every
    reconnect (the gateway restarts under the tap), with a short keep-alive and reconnect delay."""

    def __init__(self, host: str, port: int, topics: tuple[str, ...], client_name: str) -> None:
        super().__init__(host, port, topics, name=client_name, keepalive=5, reconnect_delay=(0.05, 0.5))


class GatewayTap(_Subscriber):
    """Subscribed to the thermostats' telemetry on the gateway: each arrival is a ``sent`` record.

    The broker hands a publish to the store-and-forward service, which commits it, before it routes the
    publish to subscribers: whatever the tap sees is stored in the gateway and must reach the cloud.
    """

    def __init__(self, host: str, port: int, recorder: Recorder, routes: tuple[Route, ...]) -> None:
        self.recorder = recorder
        self.routes = routes
        super().__init__(host, port, (TELEMETRY_TOPICS,), "hil-tap")

    def parse(self, message: mqtt.MQTTMessage, at: float) -> list[Seen]:
        _, device, _, _, output = message.topic.split("/")
        key = message_key(device, output, message.payload)
        priority = priority_of(self.routes, device, output)
        if key is None or priority is None:  # no route takes it upstream
            return []
        return [Seen(key, priority, device, output, at, message.payload)]

    def record(self, seen: Seen) -> None:
        self.recorder.sent(seen.key, seen.priority, seen.device, output=seen.output)


def upstream_messages(topic: str, payload: bytes, user_properties: dict[str, str], at: float) -> list[Seen]:
    """The thermostat messages in one upstream PUBLISH of either format, each with its ``gw-*`` properties.

    A batch (`BATCH_TOPIC`) gives one per record, all arriving at ``at``; raises ``BatchFormatError`` for
    a batch the decoder refuses. Anything without the gateway's identity or a thermostat payload is skipped.
    """
    if topic == BATCH_TOPIC:
        batch = decode_batch(payload)
        found = [(record.payload, dict(record_properties(batch, record))) for record in batch.records]
    else:
        found = [(payload, user_properties)]
    seen = []
    for body, properties in found:
        device, output = properties.get("gw-device-id"), properties.get("gw-output")
        if device is None or output is None or "gw-message-id" not in properties:
            continue
        key = message_key(device, output, body)
        if key is not None:
            seen.append(Seen(key, int(properties["gw-priority"]), device, output, at, body, properties))
    return seen


class CloudCollector(_Subscriber):
    """Subscribed to the gateway's upstream topics on the cloud broker: each arrival is a ``received`` record.

    Either upstream format (`upstream_messages`); a batch the decoder refuses is kept in ``malformed``
    (`System.settle` fails on it) instead of vanishing as lost messages.
    """

    def __init__(self, host: str, port: int, recorder: Recorder) -> None:
        self.recorder = recorder
        self.malformed: list[str] = []
        super().__init__(host, port, CLOUD_TOPICS, "hil-cloud")

    def parse(self, message: mqtt.MQTTMessage, at: float) -> list[Seen]:
        properties = dict(getattr(message.properties, "UserProperty", None) or [])
        try:
            return upstream_messages(message.topic, message.payload, properties, at)
        except BatchFormatError as error:
            with self.cond:
                self.malformed.append(f"{message.topic}: {error}")
            return []

    def record(self, seen: Seen) -> None:
        self.recorder.received(seen.key, seen.priority, seen.device, gw_message_id=seen.gw_message_id,
                               bytes=len(seen.payload))

    def keys(self) -> set[str]:
        with self.cond:
            return {seen.key for seen in self.messages}


# -- thermostats -----------------------------------------------------------------------------------------


def thermostat_config(name: str, host: str, port: int, *, telemetry_ms: int, **overrides: Any) -> dict[str, Any]:
    """Fast timing and a slow simulated room: the set point, not the room's drift, decides the heater.

    The room starts at 18 C and the default set point is 20 C, so a fresh thermostat heats; the
    ``sensor.fault`` file in its folder fails the sensor (an alert) for as long as it exists.
    """
    config: dict[str, Any] = {
        "thermostat": name,
        "broker": {"host": host, "port": port, "keepalive": 10},
        "set_point": {"default": 20.0, "min": 5.0, "max": 30.0},
        "hysteresis_c": 0.5,
        "alerts": {"low_c": 5.0, "high_c": 35.0},
        "timing": {"control_ms": 100, "telemetry_ms": telemetry_ms, "backoff_min_ms": 100,
                   "backoff_max_ms": 800, "request_timeout_ms": 1000},
        "state_file": "setpoint.json",
        "hardware": {"kind": "simulated",
                     "room": {"start_c": 18.0, "heat_c_per_s": 0.01, "fault_file": "sensor.fault"}},
    }
    config.update(overrides)
    return config


class Thermostat:
    """One thermostat: the firmware in a real ``micropython`` process, its folder being its flash.

    ``expect`` waits for a line the firmware prints; every line keeps its arrival time, which is how
    latencies are measured (``relay off`` is the heater following a set point).
    """

    def __init__(self, name: str, folder: Path, micropython: Path, firmware_dir: Path, config: dict[str, Any]) -> None:
        self.name = name
        self.folder = folder
        self.micropython = micropython
        self.firmware_dir = firmware_dir
        self.lines: list[str] = []
        self.times: list[float] = []
        self.cond = threading.Condition()
        self.process: subprocess.Popen[str] | None = None
        #: Called on the output thread with each line as it arrives, to timestamp events where they happen.
        self.on_line: Callable[[str], None] | None = None
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config))

    @property
    def key(self) -> str:
        return self.name + SET_POINT_SUFFIX

    def start(self) -> Thermostat:
        """Boot (again): flash, that is the folder with its ``setpoint.json``, is kept. The launcher users
        run (``images/firmware/run_unix.py``: restarts on a reset, as a board does) runs the sources
        from ``firmware_dir``; they compile on the device, so the heap is the unix port's usual 2 MB, not
        the 64 KB the .mpy bundle keeps to. Its own process group: pause and power cut reach both."""
        self.process = subprocess.Popen(
            [sys.executable, str(RUN_UNIX), str(self.folder), "--micropython", str(self.micropython),
             "--path", str(self.firmware_dir), "--heap", SOURCE_HEAP],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )
        threading.Thread(target=self._pump, args=(self.process,), daemon=True).start()
        return self

    def _pump(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self._append(line.rstrip("\n"))
        self._append("<exit>")

    def _append(self, line: str) -> None:
        with self.cond:
            self.lines.append(line)
            self.times.append(time.monotonic())
            self.cond.notify_all()
        if self.on_line is not None:
            self.on_line(line)

    def mark(self) -> int:
        with self.cond:
            return len(self.lines)

    def expect(self, pattern: str, timeout: float = 10.0, after: int = 0) -> tuple[int, float]:
        """The index and arrival time of the first line from ``after`` on that matches ``pattern``."""
        regex = re.compile(pattern)
        found: list[int] = []

        def matched() -> bool:
            for index in range(after, len(self.lines)):
                if regex.search(self.lines[index]):
                    found.append(index)
                    return True
            return False

        with self.cond:
            if not self.cond.wait_for(matched, timeout):
                tail = "\n".join(self.lines[-40:])
                raise AssertionError(
                    f"{self.name}: no line matching {pattern!r} within {timeout} s; last lines:\n{tail}"
                )
            return found[0], self.times[found[0]]

    def set_fault(self, failing: bool) -> None:
        """Fail or repair the simulated sensor (the room reads its fault file at every control tick)."""
        fault = self.folder / "sensor.fault"
        if failing:
            fault.write_text("x")
        else:
            fault.unlink(missing_ok=True)

    def pause(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGCONT)

    def kill9(self) -> None:
        """Power cut: no goodbye on the wire, flash as it was (the launcher and the firmware both go)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGCONT)  # a stopped process dies only once it runs again
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


def record_when_printed(recorder: Recorder, thermostat: Thermostat, message_id: str, pattern: str) -> None:
    """Record ``message_id`` as received the moment ``thermostat`` prints a line matching ``pattern``.

    For changes the firmware acts on (set points): the timeline's time is the action's, not the test's."""
    regex = re.compile(pattern)

    def on_line(line: str) -> None:
        if regex.search(line):
            thermostat.on_line = None
            recorder.received(message_id, None, thermostat.name, line=line)

    thermostat.on_line = on_line


def raise_alert(thermostat: Thermostat, timeout: float = 10.0) -> None:
    """One sensor-failure episode: fail the sensor until the alert is raised, repair it until the heater is back.

    The firmware raises an alert once per episode; the heater switches off while the sensor fails and on
    again when it reads again (room 18 C below the 20 C set point), which is how the episode's end is seen.
    """
    mark = thermostat.mark()
    thermostat.set_fault(True)
    thermostat.expect(r"^alert sensor_failure$", timeout, after=mark)
    mark = thermostat.mark()
    thermostat.set_fault(False)
    thermostat.expect(r"^relay on$", timeout, after=mark)


def identity_problems(tapped: list[Seen], arrived: list[Seen]) -> list[str]:
    """What breaks the gateway's message identity in what reached the cloud (empty: nothing).

    One ``gw-message-id`` must always carry the same message, and a message may arrive under several ids
    only if its device published it that many times (a QoS 1 retry after a lost PUBACK is a new publish,
    which the gateway rightly stores again; ``gw-message-id`` dedupes the gateway's own retries).
    """
    keys_of_id: dict[str, set[str]] = {}
    ids_of_key: dict[str, set[str]] = {}
    for message in arrived:
        keys_of_id.setdefault(message.gw_message_id, set()).add(message.key)
        ids_of_key.setdefault(message.key, set()).add(message.gw_message_id)
    published = Counter(message.key for message in tapped)
    problems = [f"{gw_id} carried {sorted(keys)}" for gw_id, keys in keys_of_id.items() if len(keys) > 1]
    problems += [f"{key} arrived under {sorted(ids)} but was published {published[key]} times"
                 for key, ids in ids_of_key.items() if len(ids) > max(1, published[key])]
    return problems


# -- the running system ----------------------------------------------------------------------------------


@dataclass
class System:
    """What the ``system`` fixture started for one scenario."""

    gateway: GatewayProcess
    cloud: CloudCollector
    tap: GatewayTap
    thermostats: list[Thermostat]
    recorder: Recorder
    routes: tuple[Route, ...]

    def ttl_s(self, priority: int | None) -> int:
        """The TTL messages of ``priority`` are stored with (the longest of its routes, as the gateway picks)."""
        return max((r.ttl_s for r in self.routes if r.priority == priority), default=0)

    def settle(self, timeout: float = 30.0) -> list[Seen]:
        """Close the books: every message that entered the gateway reaches the cloud or outlives its TTL.

        The thermostats are paused first so that the set is final. Messages whose TTL passed undelivered
        are recorded as expired and returned; one still neither delivered nor expired at the deadline is
        a lost message, and this raises, as it does for a batch the collector could not decode.
        """
        for thermostat in self.thermostats:
            thermostat.pause()
        deadline = time.monotonic() + timeout
        with self.cloud.cond:
            while True:
                assert not self.cloud.malformed, f"batches the decoder refused: {self.cloud.malformed}"
                delivered = {m.key for m in self.cloud.messages}
                now = time.monotonic()
                tapped = self.tap.snapshot()
                open_ = [m for m in tapped if m.key not in delivered and m.at + self.ttl_s(m.priority) >= now]
                if not open_:
                    break
                if now > deadline:
                    raise TimeoutError(f"{len(open_)} messages neither delivered nor expired, e.g. {open_[0].key}")
                # Woken by each arrival; the timeout notices TTLs running out when nothing arrives.
                self.cloud.cond.wait(0.1)
        expired = [m for m in tapped if m.key not in delivered]
        for message in expired:
            self.recorder.expired(message.key, message.priority, message.device, ttl_s=self.ttl_s(message.priority))
        return expired
