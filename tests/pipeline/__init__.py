"""Tests of the cloud-side pipeline (``pipeline/``)."""
