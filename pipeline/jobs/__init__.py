"""Spark jobs over the landing zone. One module per concept; ``batch`` and ``stream`` wire them up.

The batch job (``batch.py``) and the Structured Streaming job (``stream.py``) read and parse the landing
zone with the same functions; batch aggregates and deduplicates in Spark SQL, streaming in per-key folds
that keep each key's own event-time progress (``ordered.py``), and they write by overwrite vs. append.
"""
