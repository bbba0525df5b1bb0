"""The upstream bridge's policy over its mechanism, checked by reading the imports (issue 27 item 3).

``paho_link.py`` is the mechanism: sockets, TLS, the kernel's ioctl probes, paho's internals.
``upstream.py`` is the policy's asyncio and reaches the network only through ``PahoConnection``; the
policy's state (``window``, ``flow_limit``, ``in_flight``, ``liveness``) is sans-I/O: no asyncio, no clock,
no socket. An import under ``if TYPE_CHECKING:`` does not count (it never runs).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

FORWARDING = Path(__file__).resolve().parents[2] / "appliance" / "forwarding"
#: What only the mechanism touches: the socket layer, TLS, the kernel's probes, paho's client.
MECHANISM = {"socket", "ssl", "fcntl", "termios", "struct", "selectors", "appliance.tcp_floor", "paho.mqtt.client"}
#: What sans-I/O state may not reach besides: the loop and the clock.
LOOP_AND_CLOCK = {"asyncio", "time", "threading"}


def runtime_imports(path: Path) -> set[str]:
    """Every module ``path`` imports when it runs (not under ``if TYPE_CHECKING:``), and its parents."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
        for name in names:
            parts = name.split(".")
            found.update(".".join(parts[:length]) for length in range(1, len(parts) + 1))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def test_the_policy_reaches_the_network_only_through_the_mechanism() -> None:
    assert runtime_imports(FORWARDING / "upstream.py") & MECHANISM == set()
    assert "appliance.forwarding.paho_link" in runtime_imports(FORWARDING / "upstream.py")


@pytest.mark.parametrize("module", ["window.py", "flow_limit.py", "in_flight.py", "liveness.py"])
def test_the_policys_state_is_sans_io(module: str) -> None:
    assert runtime_imports(FORWARDING / module) & (MECHANISM | LOOP_AND_CLOCK) == set()


def test_the_scan_sees_the_mechanisms_imports() -> None:
    imports = runtime_imports(FORWARDING / "paho_link.py")
    assert {"socket", "ssl", "fcntl", "appliance.tcp_floor", "paho.mqtt.client"} <= imports
