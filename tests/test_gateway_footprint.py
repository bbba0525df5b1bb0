"""What a real ``appliance run`` loads: the libraries only one listener type or one tool needs stay out of a
gateway that does not use them.

``cryptography`` (reading TLS certificate dates, signing firmware manifests in ``appliance firmware``)
costs the process about 11 MB of resident memory once loaded, ``wsproto`` (WebSocket listeners) about
2 MB; on a gateway with plain TCP listeners both were 13 MB of its 48 MB budget for 2,000 idle
connections (issue 30, ``bench/idle_connections.py``). Python's own import log (``-X importtime``, set
through ``PYTHONPROFILEIMPORTTIME``) names every module the gateway imported, from start to shutdown,
with a client connected in between.
"""

from __future__ import annotations

import re
from pathlib import Path

from appliance.broker.codec import packets as pk
from tests.broker.clients import RawClient
from tests.support.processes import GatewayProcess

IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \| ( *)([\w.]+)\s*$")


def imported_modules(output: str) -> set[str]:
    return {match.group(2) for line in output.splitlines() if (match := IMPORTED.match(line))}


def test_a_gateway_with_a_plain_tcp_listener_loads_neither_cryptography_nor_wsproto(tmp_path: Path) -> None:
    gateway = GatewayProcess(tmp_path / "data", env={"PYTHONPROFILEIMPORTTIME": "1"}).start()
    try:
        client = RawClient(gateway.port)
        assert client.connect("footprint").reason_code == 0
        client.send(pk.Disconnect())
        client.sock.close()
    finally:
        assert gateway.terminate() == 0
    modules = imported_modules(gateway.output())
    # The log is read right: the gateway's own socket layer and its services show up in it.
    assert {"appliance.broker.server", "appliance.statestore.service", "appliance.firmware.service"} <= modules
    heavy = sorted(name for name in modules if name.split(".")[0] in {"cryptography", "wsproto"})
    assert not heavy, f"the gateway imported {heavy}"
