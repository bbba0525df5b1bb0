"""What a job run is told: where to read and write, and the time settings every output shares.

Nothing here imports Spark: the command line checks a run's settings (``JobSettings.check``) before it
starts a JVM, so a usage error costs milliseconds, not a Spark start-up and a compaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta

_UNITS_MS = {"millisecond": 1, "second": 1000, "minute": 60_000, "hour": 3_600_000, "day": 86_400_000}


def parse_duration_ms(text: str) -> int:
    """'5 minutes' -> 300000 (the subset of Spark interval strings the CLI accepts); ValueError says what
    is accepted."""
    parts = str(text).split()
    unit = parts[1].lower().rstrip("s") if len(parts) == 2 else ""
    try:
        number = float(parts[0]) if parts else float("nan")
    except ValueError:
        number = float("nan")
    if len(parts) != 2 or unit not in _UNITS_MS or not number >= 0 or number == float("inf"):
        raise ValueError(f"not a duration: {text!r} (a number and a unit: '5 minutes', '90 seconds', '1 hour')")
    return int(number * _UNITS_MS[unit])


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
    idle_timeout: str | None = "30 minutes"  # streaming: close a silent key's windows (receive time); None: never
    upstream_endpoint: str = "upstream"  # the metrics endpoint whose queues feed the cloud
    hil: str | None = None  # folder of HIL timelines (batch only)
    # batch over receive dates (inclusive, YYYY-MM-DD); None: the whole landing zone
    received_from: str | None = None
    received_to: str | None = None
    late_days: int = 1  # how many days after its event time a message may still be received
    bronze: str | None = None  # the bronze table (bronze.py); None: default_bronze(landing)
    compact: bool = True  # batch: compact new landing files into the bronze table before reading it

    def check(self) -> None:
        """Every setting that can be wrong before a job starts: ValueError with what is wrong."""
        if parse_duration_ms(self.window) <= 0:
            raise ValueError(f"--window must be longer than zero: {self.window!r}")
        parse_duration_ms(self.lateness)
        if self.idle_timeout is not None:
            parse_duration_ms(self.idle_timeout)
        if self.late_days < 0:
            raise ValueError(f"--late-days must not be negative: {self.late_days}")
        if self.received_to is not None and self.received_from is None:
            raise ValueError("--to needs --from")
        if self.ranged:
            self._range()

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

    def covered(self) -> str:
        """What a run reads and rewrites, in words, for its progress output."""
        if not self.ranged:
            return "receive dates: all; outputs: rewritten whole"
        read = self.read_dates()
        first, last = self.output_dates()
        return (f"receive dates read: {read[0]}..{read[-1]}; output dates rewritten: {first}..{last} "
                f"(--late-days {self.late_days})")

    def _range(self) -> tuple[date, date]:
        if self.received_from is None:
            raise ValueError("not a ranged run (no --from)")
        first = date.fromisoformat(self.received_from)
        last = date.fromisoformat(self.received_to or self.received_from)
        if last < first:
            raise ValueError(f"--to {last} is before --from {first}")
        return first, last
