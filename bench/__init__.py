"""Benchmarks, side by side with mosquitto (``bench/broker.py``)."""
