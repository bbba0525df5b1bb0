"""Cloud-side data pipeline: MQTT ingest into a landing zone, and Spark jobs over it.

``pipeline.ingest`` lands every upstream message durably before acknowledging it; ``pipeline.jobs`` turns
the landing zone into rollups, a set-point change log, delivery SLA tables and HIL run analyses, in batch
or incrementally with Structured Streaming; ``pipeline.report`` draws them. See ``docs/pipeline.md``.
"""
