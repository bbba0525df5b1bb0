"""Benchmarks, each a script run by path; ``README.md`` describes the broker benchmark."""
