"""Explicit schemas for everything the jobs read, and the columns of every output they write.

Nothing is inferred: a field that does not fit is null, and the telemetry parser turns that into a
quarantine reason. ``LANDING`` mirrors ``pipeline.records.LANDING_FIELDS`` (a test keeps them equal). The
payload schemas are the contract with the thermostat firmware and the gateway, documented in
``docs/pipeline.md``.

An output's columns are written once, as an ``OutputSchema`` (bottom of this module): batch computes its
``computed`` columns in Spark SQL, streaming in a pandas step whose result schema is ``computed`` as DDL,
and both end in the same ``select`` into the ``written`` columns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

LANDING = T.StructType(
    [
        T.StructField("message_id", T.StringType()),
        T.StructField("gateway_id", T.StringType()),
        T.StructField("device_id", T.StringType()),
        T.StructField("module_id", T.StringType()),
        T.StructField("output", T.StringType()),
        T.StructField("priority", T.IntegerType()),
        T.StructField("enqueued_ms", T.LongType()),
        T.StructField("sent_ms", T.LongType()),
        T.StructField("ttl_s", T.LongType()),
        T.StructField("received_ms", T.LongType()),
        T.StructField("topic", T.StringType()),
        T.StructField("content_type", T.StringType()),
        T.StructField("payload", T.StringType()),
        T.StructField("payload_base64", T.StringType()),
        T.StructField("properties", T.MapType(T.StringType(), T.StringType())),
        T.StructField("redelivered", T.BooleanType()),
        T.StructField("reason", T.StringType()),
    ]
)

# An over-the-air update's status (device_firmware/ota_updater.py ``status``), in the updater's messages and
# in the thermostat's readings.
UPDATE_RECORD = T.StructType([
    T.StructField("state", T.StringType()),
    T.StructField("version", T.StringType()),
    T.StructField("reason", T.StringType()),
])
# The updater's status messages: output "update" (the ``firmware`` kind).
FIRMWARE_STATUS = T.StructType([
    T.StructField("device", T.StringType()),
    T.StructField("fw", T.StringType()),
    T.StructField("update", UPDATE_RECORD),
])

# Thermostat telemetry: output "data", content type application/json.
TELEMETRY = T.StructType(
    [
        T.StructField("temperature", T.DoubleType()),  # measured, degrees Celsius
        T.StructField("set_point", T.DoubleType()),  # target, degrees Celsius
        T.StructField("heater", T.BooleanType()),  # relay on at the time of the reading
        T.StructField("device", T.StringType()),  # the thermostat's own id; must equal gw-device-id
        T.StructField("ts_ms", T.LongType()),  # reading time, Unix milliseconds (device clock)
        T.StructField("fw", T.StringType()),  # the running firmware version (jobs/firmware.py)
        T.StructField("update", UPDATE_RECORD),  # the last update's record while it stands, else null
    ]
)
CORRUPT = "_corrupt"
TELEMETRY_PARSE = T.StructType(TELEMETRY.fields + [T.StructField(CORRUPT, T.StringType())])

# Gateway metrics (docs/message-format.md): counters per endpoint per priority.
QUEUE_STATS = T.StructType(
    [
        T.StructField("depth", T.LongType()),
        T.StructField("oldest_age_s", T.DoubleType()),
        T.StructField("sent", T.LongType()),
        T.StructField("expired", T.LongType()),
        T.StructField("dropped", T.LongType()),
        T.StructField("retries", T.LongType()),
        T.StructField("dead_lettered", T.LongType()),  # absent before the gateway had dead letters: 0
    ]
)
METRICS = T.StructType(
    [
        T.StructField("gateway_id", T.StringType()),
        T.StructField("ts_ms", T.LongType()),
        T.StructField("boot_id", T.StringType()),  # one per gateway process; absent from older gateways
        T.StructField("seq", T.LongType()),  # 1, 2, ... per document within a boot
        T.StructField(
            "endpoints", T.MapType(T.StringType(), T.MapType(T.StringType(), QUEUE_STATS))
        ),
    ]
)

# HIL bench timelines (JSON lines, one event per line): hil_tests/timeline.py writes them, docs/pipeline.md
# and docs/hil.md describe them.
HIL_TIMELINE = T.StructType(
    [
        T.StructField("run_id", T.StringType()),
        T.StructField("scenario", T.StringType()),
        T.StructField("message_id", T.StringType()),
        T.StructField("priority", T.IntegerType()),
        T.StructField("device", T.StringType()),
        T.StructField("event", T.StringType()),
        T.StructField("t_ms", T.LongType()),  # ms since the scenario started (one monotonic clock)
        T.StructField("detail", T.StringType()),  # a JSON object; Spark keeps it as its JSON text
    ]
)
# detail of a "rig" event: a command of the rig's serial protocol (hil_tests/rig/PROTOCOL.md) and its reply.
RIG_DETAIL = T.StructType([T.StructField("command", T.StringType()), T.StructField("reply", T.StringType())])


# -- outputs --------------------------------------------------------------------------------------------
_SIMPLE_TYPES = {"string": T.StringType(), "long": T.LongType(), "int": T.IntegerType(), "double": T.DoubleType(),
                 "boolean": T.BooleanType(), "timestamp": T.TimestampType()}


def struct_of(ddl: str) -> T.StructType:
    """``"name type, ..."`` of simple types as a StructType, without a JVM (``StructType.fromDDL`` needs a
    running Spark, and these are module constants)."""
    fields = [field.split() for field in ddl.split(",")]
    return T.StructType([T.StructField(name, _SIMPLE_TYPES[kind]) for name, kind in fields])


@dataclass(frozen=True)
class OutputSchema:
    """One output's columns. ``computed``: what its computation yields, the same in batch (Spark SQL) and
    in streaming (a pandas step, whose result schema is ``ddl``); ``written``: the output's columns in
    order, each either a computed column or one derived from them when written (``select``'s ``derived``:
    window timestamps, ``date``)."""

    computed: T.StructType
    written: tuple[str, ...]

    @classmethod
    def of(cls, ddl: str, written: tuple[str, ...] | None = None) -> OutputSchema:
        computed = struct_of(ddl)
        return cls(computed, tuple(computed.fieldNames()) if written is None else written)

    @property
    def ddl(self) -> str:
        """``computed`` as Spark DDL (``applyInPandasWithState``'s output schema)."""
        return ", ".join(f"{field.name} {field.dataType.simpleString()}" for field in self.computed.fields)

    @property
    def names(self) -> list[str]:
        return self.computed.fieldNames()

    def select(self, frame: DataFrame, derived: Mapping[str, Column] | None = None) -> DataFrame:
        """``frame`` (holding the computed columns, cast to their types) as the output's ``written`` columns;
        ``derived`` gives each written column that is not a computed one (``ValueError`` for one missing,
        or one given that is not written)."""
        derived = dict(derived or {})
        unused = set(derived) - set(self.written)
        missing = [name for name in self.written if name not in derived and name not in self.names]
        if unused or missing:
            raise ValueError(f"derived columns not written: {sorted(unused)}; written columns not given: {missing}")
        types = {field.name: field.dataType for field in self.computed.fields}
        return frame.select(*[derived[name].alias(name) if name in derived else F.col(name).cast(types[name]).alias(name)
                              for name in self.written])


def windowed(ddl: str, *extra: str, window_first: bool = True) -> OutputSchema:
    """A windowed output: ``ddl`` holds the window as ``window_start_ms``; it is written as
    ``window_start``/``window_end`` timestamps in its place (``window_first``; else after the other
    columns), then ``extra`` derived columns, then ``date``."""
    computed = struct_of(ddl)
    names = [name for name in computed.fieldNames() if name not in ("window_start_ms", "window_end_ms")]
    window = ("window_start", "window_end")
    if window_first:
        at = computed.fieldNames().index("window_start_ms")
        written = (*names[:at], *window, *names[at:], *extra, "date")
    else:
        written = (*names, *extra, *window, "date")
    return OutputSchema(computed, written)


ROLLUPS_OUTPUT = windowed(
    "gateway_id string, device_id string, window_start_ms long, readings long, temperature_min double, "
    "temperature_avg double, temperature_max double, set_point_avg double, set_point_last double, "
    "heater_duty_cycle double"
)
SETPOINT_CHANGES_OUTPUT = OutputSchema.of(
    "gateway_id string, device_id string, changed_ms long, previous_set_point double, set_point double, "
    "temperature double, message_id string",
    ("gateway_id", "device_id", "changed_ms", "previous_set_point", "set_point", "temperature", "message_id",
     "changed_at", "date"),
)
DELIVERY_LATENCY_OUTPUT = windowed(
    "gateway_id string, priority int, window_start_ms long, delivered long, latency_p50_ms long, "
    "latency_p95_ms long, latency_p99_ms long, latency_max_ms long, clock_offset_ms long",
    "clock_suspect",
)
# The queue statistics that are counters (only grow while the gateway runs); the others are gauges.
COUNTERS = ("sent", "expired", "dropped", "retries", "dead_lettered")
QUEUE_COUNTERS_OUTPUT = windowed(
    "gateway_id string, endpoint string, priority int, window_start_ms long, window_end_ms long, samples long, "
    + "".join(f"{name} long, " for name in COUNTERS) + "depth_max long, oldest_age_s_max double",
    window_first=False,
)
QUARANTINE_OUTPUT = OutputSchema.of(
    "gateway_id string, received_ms long, stage string, reason string, message_id string, device_id string, "
    "topic string, payload string, payload_base64 string",
    ("stage", "reason", "message_id", "gateway_id", "device_id", "topic", "received_ms", "received_at", "payload",
     "payload_base64", "date"),
)
