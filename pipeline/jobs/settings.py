"""What a job run is told: where to read and write, and the time settings every output shares."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta


def default_bronze(landing: str) -> str:
    """Where the bronze table goes unless told (``--bronze``): in the landing folder, where no landing glob
    matches it (``_bronze``, not a kind) and every Spark host already reads."""
    return f"{str(landing).rstrip('/')}/_bronze"


@dataclass(frozen=True)
class JobSettings:
    landing: str
    out: str
    window: str = "5 minutes"  # rollups, delivery latency and queue counters
    lateness: str = "10 minutes"  # streaming: how far behind its key's own progress a row may arrive
    upstream_endpoint: str = "upstream"  # the metrics endpoint whose queues feed the cloud
    hil: str | None = None  # folder of HIL timelines (batch only)
    # batch over receive dates (inclusive, YYYY-MM-DD); None: the whole landing zone
    received_from: str | None = None
    received_to: str | None = None
    late_days: int = 1  # how many days after its event time a message may still be received
    bronze: str | None = None  # the bronze table (bronze.py); None: default_bronze(landing)
    compact: bool = True  # batch: compact new landing files into the bronze table before reading it

    def output(self, name: str) -> str:
        return f"{self.out.rstrip('/')}/{name}"

    @property
    def bronze_path(self) -> str:
        return self.bronze or default_bronze(self.landing)

    @property
    def ranged(self) -> bool:
        return self.received_from is not None

    def output_dates(self) -> tuple[str, str]:
        """The output partitions a ranged run rewrites: what was received in the range can be about events
        up to ``late_days`` before it."""
        first, last = self._range()
        return str(first - timedelta(days=self.late_days)), str(last)

    def read_dates(self) -> list[str]:
        """The landing receive dates a ranged run reads: everything that can count in ``output_dates`` -
        late arrivals up to ``late_days`` after them, and one day before them for the previous set point,
        the previous counter sample and an earlier copy of a message."""
        first, last = self._range()
        start, end = first - timedelta(days=self.late_days + 1), last + timedelta(days=self.late_days)
        return [str(start + timedelta(days=n)) for n in range((end - start).days + 1)]

    def _range(self) -> tuple[date, date]:
        assert self.received_from is not None
        first = date.fromisoformat(self.received_from)
        last = date.fromisoformat(self.received_to or self.received_from)
        if last < first:
            raise ValueError(f"--to {last} is before --from {first}")
        return first, last
