"""One busy process per core, for running the suite the way a shared CI host runs it (``make test-busy``).

Each process spins in pure Python until ``--seconds`` have passed or the hog is terminated; the children
are daemons of the parent, so a SIGTERM to the parent (what ``make test-busy`` sends when the suite ends)
ends them all. Bounded in time on purpose: a hog left behind must not keep a machine busy for ever.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import sys
import time


def _spin(until: float) -> None:
    count = 0
    while time.monotonic() < until:
        count += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=900.0, help="stop after this long at the latest")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1, help="busy processes (default: one per core)")
    args = parser.parse_args(argv)
    until = time.monotonic() + args.seconds
    hogs = [multiprocessing.Process(target=_spin, args=(until,), daemon=True) for _ in range(args.processes)]
    for hog in hogs:
        hog.start()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # daemons end with the parent
    for hog in hogs:
        hog.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
