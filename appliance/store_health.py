"""Whether a store's commits succeed, and the few log lines that say so.

A full disk makes every commit fail, and a busy gateway tries to commit hundreds of times a second: one
traceback per attempt buried the log (29 MB in 20 s) and said nothing the first line had not. So a store
reports each outcome here, and only a *change* of state is logged - healthy to failing (an error with
the reason) and back (how long it lasted, how many commits failed) - at most once per
``LOG_INTERVAL`` seconds. A change inside that interval is not lost: ``tick`` logs the state the store
is in once the interval is over, with the number of changes in between, so the last line in the log
always tells the current state. Callers pass the time (monotonic seconds): no clock in here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from appliance.prometheus import Family, counter, gauge

#: Seconds between two log lines about one store's state.
LOG_INTERVAL = 10.0


@dataclass(slots=True)
class StoreHealth:
    """One store's commit state (``what`` names it in the log: the file's path)."""

    what: str
    log: logging.Logger
    #: What the failure means for clients, for the log line.
    consequence: str = "writes are refused until a commit succeeds"
    healthy: bool = True
    #: The latest failure was SQLite's "database or disk is full" (SQLITE_FULL).
    disk_full: bool = False
    #: Commits that failed, in total (a counter for ``$SYS`` and Prometheus).
    failed_commits: int = 0
    #: Requests answered with an error because of the failing store, in total.
    refused: int = 0
    _failing_since: float = 0.0
    _failed_in_spell: int = 0
    _last_logged: float = field(default=float("-inf"))
    _unlogged_changes: int = 0

    def families(self, component: str) -> list[Family]:
        """``appliance_store_*{store="<component>"}`` for the gateway's Prometheus page: one name per figure
        with the store as a label, so one alert rule and one graph cover every store of every gateway."""
        return [
            gauge("appliance_store_healthy", "1 while the store's commits succeed, 0 while they fail",
                  int(self.healthy), store=component),
            gauge("appliance_store_disk_full", "1 while the store's latest failure is SQLite's disk full",
                  int(self.disk_full and not self.healthy), store=component),
            counter("appliance_store_failed_commits_total", "commits of the store that failed", self.failed_commits,
                    store=component),
            counter("appliance_store_refused_total",
                    "requests refused or answered with an error because the store could not commit", self.refused,
                    store=component),
        ]

    def failed(self, error: str, disk_full: bool, now: float) -> bool:
        """A commit failed (nothing was written); returns whether the state changed."""
        self.failed_commits += 1
        self._failed_in_spell += 1
        self.disk_full = disk_full
        if not self.healthy:
            return False
        self.healthy = False
        self._failing_since = now
        self._failed_in_spell = 1
        self._changed(now, f"{self.what}: cannot commit ({error}); {self.consequence}")
        return True

    def succeeded(self, now: float) -> bool:
        """A commit succeeded; returns whether the state changed."""
        if self.healthy:
            return False
        self.healthy = True
        self.disk_full = False
        self._changed(now, f"{self.what}: commits succeed again after {now - self._failing_since:.1f}s "
                           f"({self._failed_in_spell} failed attempts)")
        return True

    def tick(self, now: float) -> None:
        """Log the current state if changes were held back by the rate limit and the interval is over."""
        if self._unlogged_changes and now - self._last_logged >= LOG_INTERVAL:
            state = "healthy" if self.healthy else "failing"
            self._log(now, f"{self.what}: {state} ({self._unlogged_changes} state changes in the last "
                           f"{LOG_INTERVAL:.0f}s not logged one by one)")

    def _changed(self, now: float, message: str) -> None:
        if now - self._last_logged < LOG_INTERVAL:
            self._unlogged_changes += 1
            return
        self._log(now, message)

    def _log(self, now: float, message: str) -> None:
        self._last_logged = now
        self._unlogged_changes = 0
        self.log.log(logging.WARNING if self.healthy else logging.ERROR, message)
