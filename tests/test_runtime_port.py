"""One runtime for the whole gateway: no module of ``appliance/`` reads a clock, sleeps or sets a deadline by
itself.

Time is an input (``appliance/runtime.py``): the broker, forwarding, the state store, the firmware service
and the hardware get it from the ``Runtime`` port, so their tests move a fake clock instead of waiting.
This test reads every module's syntax tree and lists each direct clock read, sleep or timed wait (a
deadline or timer on the loop's own clock: ``asyncio.timeout``, ``wait_for``, ``loop.call_later``) outside
the adapters; a new one fails here with its file and line. A module imported under another name
(``import time as t``), a name imported under another (``from time import monotonic as m``) and a function
fetched by name (``getattr(time, "time")``) are followed. A wait with a timeout on a thread's primitive
(``threading.Event().wait(5)`` is a ``time.sleep(5)``), a selector's or ``select``'s timeout and a
socket's ``settimeout`` are timed waits on the system's clock too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

APPLIANCE = Path(__file__).resolve().parents[1] / "appliance"

#: ``time`` functions that read a clock or sleep (``time.strftime`` and ``time.gmtime`` only format).
TIME_FUNCTIONS = {"time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "sleep"}
#: ``asyncio`` functions that sleep or cut a wait short on the loop's clock (``asyncio.wait`` only with a
#: ``timeout=``).
ASYNCIO_FUNCTIONS = {"sleep", "wait_for", "timeout", "timeout_at"}
#: An event loop's own clock and timers.
LOOP_METHODS = {"time", "call_later", "call_at"}
#: Blocking waits that take a timeout (positional or ``timeout=``): ``Event``/``Condition``/``Barrier``
#: ``.wait``, ``Condition.wait_for``, ``Popen.wait``, a future's ``result``; a selector's ``select``; a
#: lock's ``acquire`` and a thread's ``join`` with ``timeout=``. (A queue's ``get(timeout=)`` is not told
#: from the state store client's ``get(key, timeout=)`` by syntax: no module of ``appliance/`` uses
#: ``queue.Queue``, ``tests/test_layers.py``-style review covers it.)
TIMED_WAIT_METHODS = {"wait": 0, "wait_for": 1, "select": 0, "result": 0}
TIMED_WAIT_KEYWORD_METHODS = {"acquire", "join"}

#: Modules that may read the clocks themselves, and why.
ADAPTERS = {
    "asyncio_runtime.py": "the Runtime adapter on asyncio: the one reader of the system clocks for the loop",
    "blocking_clock.py": "the clocks of code with no event loop (command-line tools, the devices' blocking "
                        "client)",
    "broker/transport/server.py": "the broker's socket layer, itself the asyncio adapter of the broker "
                                  "(a BufferedProtocol): deadlines of real sockets on the loop's clock (the "
                                  "connect-deadline wheel, the linger after a half-close) and the wall-clock "
                                  "date its TLS files' certificates are judged at when the listener opens",
    # Deadlines of real I/O stay on the loop's clock: on a test's fake clock, a jump meant for a backoff
    # would time out a TLS handshake that is still running for real.
    "forwarding/paho_link.py": "the bridge's socket adapter (paho on the loop): its TCP connect and TLS "
                               "handshake deadlines",
    "metrics_server.py": "the Prometheus endpoint's socket server: the deadline of a scrape's request",
    "statestore/client/aio.py": "a client library on its caller's event loop: the deadline of a reply "
                                "from the network",
    "statestore/client/blocking.py": "a client library on its caller's threads (paho's network thread "
                                     "answers): the deadline of a reply from the network",
}


def direct_clock_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of each clock read, sleep or timed wait that does not go through a runtime."""
    found: list[tuple[int, str]] = []
    aliases = {  # ``import time as t``: ``t`` is ``time``
        alias.asname: alias.name
        for node in ast.walk(tree) if isinstance(node, ast.Import)
        for alias in node.names if alias.asname and alias.name in ("time", "asyncio", "datetime")
    }
    waits_with_timeout = {
        id(node.func) for node in ast.walk(tree)
        if isinstance(node, ast.Call) and any(keyword.arg == "timeout" for keyword in node.keywords)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            found += _fetched_by_name(node, aliases) + _timed_wait(node)
        if isinstance(node, ast.ImportFrom) and node.module in ("time", "asyncio"):
            names = TIME_FUNCTIONS if node.module == "time" else ASYNCIO_FUNCTIONS
            found += [(node.lineno, f"from {node.module} import {a.name}") for a in node.names if a.name in names]
        if not isinstance(node, ast.Attribute) or not isinstance(node.value, (ast.Name, ast.Attribute, ast.Call)):
            continue
        owner = node.value
        owner_name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
        owner_name = aliases.get(owner_name, owner_name)
        if isinstance(owner, ast.Call) and isinstance(owner.func, (ast.Name, ast.Attribute)):
            called = owner.func.id if isinstance(owner.func, ast.Name) else owner.func.attr
            owner_name = "loop" if called in ("get_running_loop", "get_event_loop") else ""
        if owner_name == "time" and node.attr in TIME_FUNCTIONS:
            found.append((node.lineno, f"time.{node.attr}"))
        elif owner_name == "asyncio" and (node.attr in ASYNCIO_FUNCTIONS or (node.attr == "wait" and id(node) in waits_with_timeout)):
            found.append((node.lineno, f"asyncio.{node.attr}"))
        elif owner_name in ("datetime", "date") and node.attr in ("now", "utcnow", "today"):
            found.append((node.lineno, f"{owner_name}.{node.attr}"))
        elif "loop" in owner_name.lower() and node.attr in LOOP_METHODS:
            found.append((node.lineno, f"{owner_name}.{node.attr}"))
    return sorted(found)


def _fetched_by_name(call: ast.Call, aliases: dict[str, str]) -> list[tuple[int, str]]:
    """``getattr(time, "monotonic")``: a clock function fetched by its name."""
    if not (isinstance(call.func, ast.Name) and call.func.id == "getattr" and len(call.args) >= 2):
        return []
    owner, name = call.args[0], call.args[1]
    if not isinstance(owner, ast.Name) or not isinstance(name, ast.Constant) or not isinstance(name.value, str):
        return []
    module = aliases.get(owner.id, owner.id)
    names = TIME_FUNCTIONS if module == "time" else ASYNCIO_FUNCTIONS if module == "asyncio" else set()
    return [(call.lineno, f"getattr({module}, {name.value!r})")] if name.value in names else []


def _timed_wait(call: ast.Call) -> list[tuple[int, str]]:
    """A blocking wait given a timeout (``event.wait(5)``, ``selector.select(0.5)``, ``queue.get(timeout=1)``,
    ``select.select(r, w, x, 1)``, ``sock.settimeout(5)``); ``asyncio``'s own are found by their names."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return []
    value = func.value
    owner = value.id if isinstance(value, ast.Name) else value.attr if isinstance(value, ast.Attribute) else ""
    if owner in ("asyncio", "self"):  # asyncio's are found by name; ``self.wait(...)``: a class's own method
        return []
    if "clock" in owner.lower() or "runtime" in owner.lower():  # the ports: ``SYSTEM_CLOCK.wait(event, 5)``
        return []
    method = func.attr
    has_timeout = any(keyword.arg == "timeout" for keyword in call.keywords)
    what = f"{owner or '...'}.{method}(timeout)"
    if owner == "select" and method == "select":
        return [(call.lineno, what)] if len(call.args) >= 4 or has_timeout else []
    if method in TIMED_WAIT_METHODS and (len(call.args) > TIMED_WAIT_METHODS[method] or has_timeout):
        return [(call.lineno, what)]
    if method in TIMED_WAIT_KEYWORD_METHODS and has_timeout:
        return [(call.lineno, what)]
    if method == "settimeout" and not (call.args and isinstance(call.args[0], ast.Constant) and call.args[0].value is None):
        return [(call.lineno, what)]
    return []


def modules() -> list[Path]:
    return sorted(APPLIANCE.rglob("*.py"))


def test_no_module_outside_the_adapters_reads_a_clock_or_sleeps() -> None:
    offenders = [
        f"appliance/{path.relative_to(APPLIANCE)}:{line}: {what}"
        for path in modules() if str(path.relative_to(APPLIANCE)) not in ADAPTERS
        for line, what in direct_clock_uses(ast.parse(path.read_text(), str(path)))
    ]
    assert offenders == [], "use the Runtime port (appliance/runtime.py):\n" + "\n".join(offenders)


def test_every_allowed_module_exists_and_still_needs_its_exception() -> None:
    """An exception that is no longer needed is removed, not kept as a licence for the next one."""
    for name in ADAPTERS:
        path = APPLIANCE / name
        assert path.exists(), name
        assert direct_clock_uses(ast.parse(path.read_text())), f"{name} no longer reads a clock: drop it"


@pytest.mark.parametrize("source, what", [
    ("import time\ntime.monotonic()", "time.monotonic"),
    ("import time\nx = time.time", "time.time"),
    ("import time\ntime.sleep(1)", "time.sleep"),
    ("from time import monotonic", "from time import monotonic"),
    ("import asyncio\nawait asyncio.sleep(0)", "asyncio.sleep"),
    ("self._loop.time()", "_loop.time"),
    ("asyncio.get_running_loop().time()", "loop.time"),
    ("datetime.now(UTC)", "datetime.now"),
    ("date.today()", "date.today"),
    ("import time as clock\nclock.monotonic()", "time.monotonic"),
    ("import asyncio as aio\naio.sleep(1)", "asyncio.sleep"),
    ("from asyncio import wait_for", "from asyncio import wait_for"),
    ("asyncio.wait_for(reader.read(), 5)", "asyncio.wait_for"),
    ("asyncio.timeout(5)", "asyncio.timeout"),
    ("asyncio.wait({task}, timeout=1)", "asyncio.wait"),
    ("self._loop.call_later(1, f)", "_loop.call_later"),
    ("loop.call_at(deadline, f)", "loop.call_at"),
    ("from time import monotonic as m\nm()", "from time import monotonic"),
    ("import time\nclock = getattr(time, 'time')", "getattr(time, 'time')"),
    ("import time as t\ngetattr(t, 'perf_counter')()", "getattr(time, 'perf_counter')"),
    ("getattr(asyncio, 'sleep')(1)", "getattr(asyncio, 'sleep')"),
    ("loop.time()", "loop.time"),
    ("time.perf_counter()", "time.perf_counter"),
    ("threading.Event().wait(5)", "....wait(timeout)"),
    ("self._stopped.wait(timeout=0.5)", "_stopped.wait(timeout)"),
    ("condition.wait_for(lambda: ready, 2)", "condition.wait_for(timeout)"),
    ("worker.join(timeout=1)", "worker.join(timeout)"),
    ("lock.acquire(timeout=1)", "lock.acquire(timeout)"),
    ("future.result(5)", "future.result(timeout)"),
    ("selector.select(0.25)", "selector.select(timeout)"),
    ("select.select([r], [], [], 1.0)", "select.select(timeout)"),
    ("sock.settimeout(5)", "sock.settimeout(timeout)"),
])
def test_each_kind_of_direct_clock_use_is_found(source: str, what: str) -> None:
    tree = ast.parse(source.replace("await ", ""))
    assert [found for _, found in direct_clock_uses(tree)] == [what]


def test_the_runtime_and_formatting_are_not_clock_reads() -> None:
    source = ("runtime.monotonic()\nself.runtime.sleep(1)\ntime.strftime('%Y', time.gmtime(0))\nrecord.time\n"
              "runtime.call_later(1, f)\nself.runtime.timeout(5)\nasyncio.wait({task})\nsubprocess.run(c, timeout=5)\n"
              "event.wait()\nawait self._ready.wait()\n', '.join(names)\nthread.join()\nsettings.get('key')\n"
              "selector.select()\nfuture.result()\nself.wait(future, timeout)\nSYSTEM_CLOCK.wait(event, 5)\n"
              "self.clock.wait(event, 5)\nsock.settimeout(None)\ngetattr(config, 'time')\ngetattr(time, 'strftime')")
    assert direct_clock_uses(ast.parse(source)) == []
