"""Spark jobs over the landing zone. One module per concept; ``batch`` and ``stream`` wire them up.

Every transformation takes and returns DataFrames and does not know whether they are streaming: the batch
job (``batch.py``) and the Structured Streaming job (``stream.py``) call the same functions and differ only
in how they read (file source with a checkpoint vs. a plain read), deduplicate (watermark-bounded state vs.
a window function) and write (append with checkpoints vs. overwrite).
"""
