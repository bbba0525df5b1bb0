"""Explicit schemas for everything the jobs read. Nothing is inferred: a field that does not fit is null,
and the telemetry parser turns that into a quarantine reason.

``LANDING`` mirrors ``pipeline.records.LANDING_FIELDS`` (a test keeps them equal). The payload schemas
are the contract with the thermostat firmware and the gateway, documented in ``docs/pipeline.md``.
"""

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
