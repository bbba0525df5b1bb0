"""The landing zone's vocabulary, shared by the ingest and the Spark jobs: the kinds of record, the fields
of a record, and the topics each kind comes from by default.

Nothing here imports MQTT or Spark. The jobs import this module and never ``pipeline.envelope`` (which
needs paho-mqtt to match topics and ``appliance`` to decode batches), so a Spark driver or executor needs
neither: ``tests/pipeline/test_imports.py`` imports every job with paho blocked.
"""

EVENTS = "events"
METRICS = "metrics"
QUARANTINE = "quarantine"
FIRMWARE = "firmware"  # the thermostats' update status messages (output "update"), apart from their readings
KINDS = (EVENTS, METRICS, QUARANTINE, FIRMWARE)
FIRMWARE_OUTPUT = "update"

# Every landing record has exactly these keys, in this order (None where a kind has no value). The Spark
# schema ``pipeline.jobs.schemas.LANDING`` mirrors it (a test keeps them equal).
LANDING_FIELDS = (
    "message_id",
    "gateway_id",
    "device_id",
    "module_id",
    "output",
    "priority",
    "enqueued_ms",
    "sent_ms",
    "ttl_s",
    "received_ms",
    "topic",
    "content_type",
    "payload",
    "payload_base64",
    "properties",
    "redelivered",
    "reason",
)

# What the ingest subscribes to by default, and which topics are metrics and batches.
DEFAULT_EVENTS_FILTER = "gateways/+/devices/+/messages/events"
DEFAULT_METRICS_FILTER = "gateways/+/metrics"
DEFAULT_BATCH_FILTER = "gateways/+/batches"
