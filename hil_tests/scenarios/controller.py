"""A cloud-side site controller for scenario 6: active while it holds the lock, standby otherwise.

Run as ``python -m hil_tests.scenarios.controller --port P --name A --key K --base 21``. It holds the lock key with the
state store client's `Lease` (``SET lock name NEX PX ttl``, renewed every quarter of the TTL) and, while
active, writes the protected key (a thermostat's set point: ``base`` + 0.01 per write, so the value
tells who wrote it) with the lease's version as its fencing token (``__ft``), so a write by
a holder whose lease has passed to another is refused by the store, not by the controller's good manners.

Every step is one JSON line on stdout, with ``time.time()`` stamps, for the scenario to wait on:
``standby``, ``active`` (``token``, ``requested``: the wall time before the acquiring request),
``renewed`` (same fields), ``write`` (before the request: ``value``, ``token``), ``wrote``, ``rejected``,
``lost``.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

from appliance.statestore.client import FencingTokenLower, Lease, StateStoreClient


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


def hold_and_write(store: StateStoreClient, lease: Lease, key: str, base: float, period_s: float) -> None:
    """While the lease holds: write ``key`` every period, then renew. Returns when the lease is gone."""
    tick = threading.Event()  # never set: its wait is the controller's duty-cycle timer
    number = 0
    while True:
        value = f"{base + number % 100 / 100:.2f}"  # a set point; its whole degrees tell the writer
        say("write", value=value, token=str(lease.fencing_token))
        try:
            store.set(key, value, fencing_token=lease.fencing_token)
        except FencingTokenLower as error:  # another holder wrote with a newer token: we are stale
            say("rejected", value=value, error=str(error))
            return
        say("wrote", value=value)
        number += 1
        tick.wait(period_s)
        requested = time.time()
        if not lease.renew():
            say("lost")
            return
        say("renewed", token=str(lease.fencing_token), requested=requested)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--lock", default="site/controller.lock")
    parser.add_argument("--key", required=True, help="the protected key, e.g. a thermostat's set point")
    parser.add_argument("--base", type=float, required=True, help="values written: base + 0.00, + 0.01, ...")
    parser.add_argument("--ttl-ms", type=int, default=1500)
    args = parser.parse_args()
    with StateStoreClient(args.host, args.port, client_id=f"controller-{args.name}", timeout=5) as store:
        lease = store.lease(args.lock, args.name, ttl_ms=args.ttl_ms)
        while True:
            requested = time.time()
            if not lease.acquire():
                say("standby")
                while True:
                    requested = time.time()
                    # Event-driven: the lock key is watched, every change (expiry) triggers an attempt.
                    if lease.acquire(wait=3600):
                        break
            say("active", token=str(lease.fencing_token), requested=requested)
            hold_and_write(store, lease, args.key, args.base, args.ttl_ms / 4000)


if __name__ == "__main__":
    main()
