"""What a job run is told: where to read and write, and the time settings every output shares."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class JobSettings:
    landing: str
    out: str
    window: str = "5 minutes"  # rollups, delivery latency and queue counters
    lateness: str = "10 minutes"  # streaming watermark delay: how late a row may arrive and still count
    upstream_endpoint: str = "upstream"  # the metrics endpoint whose queues feed the cloud
    hil: str | None = None  # folder of HIL timelines (batch only)

    def output(self, name: str) -> str:
        return f"{self.out.rstrip('/')}/{name}"
