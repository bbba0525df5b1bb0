"""What a real ``appliance run`` loads: the libraries only one listener type, one service or one tool needs
stay out of a gateway that does not use them.

``cryptography`` (reading TLS certificate dates, signing firmware manifests in ``appliance firmware``)
costs the process about 11 MB of resident memory once loaded, ``wsproto`` (WebSocket listeners) about
2 MB, the other subcommands' modules (``appliance doctor``, the state store and forwarding tools,
forwarding's manifest with jsonschema) about 7 MB; on a gateway with plain TCP listeners and the default
services all of it was 20 MB of its 48 MB budget for 2,000 idle connections (issue 30,
``bench/idle_connections.py``). Python's own import log (``-X importtime``, set through
``PYTHONPROFILEIMPORTTIME``) names every module the gateway imported, from start to shutdown, with a
client connected in between.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from appliance.broker.codec import packets as pk
from testing.processes import GatewayProcess
from tests.broker.clients import RawClient

#: Imported by a default gateway for nothing: its listener is plain TCP, forwarding is off, no tool runs.
#: (``appliance.forwarding.config`` is the configuration schema's section, read by every gateway.) The
#: standard library's ``zipfile`` (a firmware publish), ``tarfile`` (a factory reset's backup),
#: ``configparser`` (RAUC's files, on a machine booted from a slot) and ``uuid`` (a client id assigned to
#: a client that sent none) cost every start CPU, not memory: together ~7 ms of its ~0.2 s, and the tests
#: start a gateway some 160 times a run (bench/RESULTS-suite.md, session 15).
UNUSED = ("cryptography", "wsproto", "jsonschema", "appliance.doctor", "appliance.forwarding.service",
          "appliance.forwarding.cli", "appliance.forwarding.manifest", "appliance.statestore.client",
          "appliance.firmware.cli", "appliance.statestore.cli", "zipfile", "tarfile", "configparser", "uuid")
IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \| ( *)([\w.]+)\s*$")


def imported_modules(output: str) -> set[str]:
    return {match.group(2) for line in output.splitlines() if (match := IMPORTED.match(line))}


def test_a_default_gateway_imports_no_library_or_tool_it_does_not_use(tmp_path: Path) -> None:
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
    assert {"appliance.broker.transport.server", "appliance.statestore.service", "appliance.firmware.service"} <= modules
    unused = sorted(name for name in modules if name.startswith(UNUSED))
    assert not unused, f"the gateway imported {unused}"



#: Each tool's own module, and what no other tool needs. (A test starts many short tools: importing all of
#: them cost each run 0.3 s of CPU instead of 0.1, appliance/cli.py.)
TOOL_MODULES = {"passwd": "appliance.broker.security.passwd_cli", "state": "appliance.statestore.cli"}
OTHER_TOOLS = ("appliance.doctor", "appliance.firmware.cli", "appliance.forwarding.cli", "jsonschema")
#: ``appliance TOOL --help`` as the command line runs it, then the names of every module it imported.
TOOL_HELP_THEN_MODULES = """import sys
from appliance.cli import main
try:
    main([sys.argv[1], "--help"])
except SystemExit:
    pass
print(*sys.modules, file=sys.stderr)
"""


def test_a_tool_imports_its_own_subcommand_and_no_other():
    for tool, module in TOOL_MODULES.items():
        done = subprocess.run([sys.executable, "-c", TOOL_HELP_THEN_MODULES, tool], capture_output=True, text=True,
                              timeout=60)
        assert f"usage: appliance {tool}" in done.stdout, done.stderr
        modules = set(done.stderr.split())
        assert module in modules
        unused = OTHER_TOOLS + tuple(set(TOOL_MODULES.values()) - {module})
        others = sorted(name for name in modules if name.startswith(unused))
        assert not others, f"appliance {tool} imported {others}"
