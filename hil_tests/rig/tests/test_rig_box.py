"""The rig box as a technician meets it (issue 26): cables pulled, a rig killed, a second rig, its own chatter.

The bridge tests run on the three-namespace bench of `hil_tests.bridge_site` (ports named like NICs); the
serial tests need no root: the rig opens a pty slave by a symlink's name, as it opens ``/dev/hilrig``, and
the test plays the host on the master side, closing it (a hang-up) and making a new pair behind the same
name (the adapter plugged in again).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import tty
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from hil_tests.bridge_site import UPLINK_ADDRESS, BridgeSite, leftovers
from hil_tests.netns_site import netns_refusal
from hil_tests.rig.client import RigClient
from hil_tests.rig.launcher import RigStartError, local_rig
from hil_tests.rig.namespace_sockets import in_namespace
from hil_tests.rig.tests.flow import drain, flooding, quiet_for
from hil_tests.rig.tests.unit_sandbox import NOBODY, sandboxed_command, unit_settings

SINK_PORT = 7000
RigFactory = Callable[..., tuple[dict[str, Any], RigClient]]
needs_netns = pytest.mark.skipif(netns_refusal() is not None, reason=str(netns_refusal()))


class HostSide:
    """The host's end of a serial line: a pty master, with the rig's end reachable by a stable name."""

    def __init__(self, name: Path, owner: int = -1) -> None:
        self.name = name
        self.master = -1
        self._owner = owner
        self.plug()

    def plug(self) -> None:
        """A new pty pair behind ``name`` (udev's symlink to a replugged adapter)."""
        self.master, slave = os.openpty()
        tty.setraw(slave)
        slave_name = os.ttyname(slave)
        os.chown(slave_name, self._owner, -1)
        os.close(slave)
        temporary = self.name.with_suffix(".new")
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(slave_name)
        os.replace(temporary, self.name)

    def unplug(self) -> None:
        os.close(self.master)
        self.master = -1
        self.name.unlink()

    def command(self, line: str, timeout: float = 10.0) -> str:
        """Send ``line`` once the rig has its end open (a master reads EIO until then); return the reply."""
        os.set_blocking(self.master, False)
        deadline = time.monotonic() + timeout
        sent = False
        reply = b""
        while not reply.endswith(b"\n"):
            assert time.monotonic() < deadline, f"no reply to {line!r} (got {reply!r}, sent: {sent})"
            try:
                reply += os.read(self.master, 4096)
            except BlockingIOError:  # the rig's end is open: the line is up
                if not sent:
                    os.write(self.master, line.encode() + b"\n")
                    sent = True
            except OSError:  # EIO: nobody has the other end open yet
                pass
            time.sleep(0.01)
        return reply.decode().strip()

    def close(self) -> None:
        if self.master >= 0:
            os.close(self.master)


def _rig_cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def test_a_serial_hang_up_is_logged_once_keeps_the_link_and_the_rig_answers_when_the_line_is_back(tmp_path):
    """Issue 26 section 2: the host side goes (adapter unplugged, gadget host rebooted). The rig used to
    spin on ``in_waiting``'s EIO, 1-4 s of CPU and megabytes of tracebacks per 5 s. Now: one log line, no
    CPU, the link as it was, and the same rig answers on the line when it is back."""
    host = HostSide(tmp_path / "hilrig")
    try:
        with socket.create_server(("127.0.0.1", 0)) as sink:
            backend = ["--backend", "userspace", "--target", f"127.0.0.1:{sink.getsockname()[1]}"]
            log = tmp_path / "rig.log"
            with local_rig(backend, log, serial_device=str(host.name)) as ready:
                assert host.command("RATE 9600") == "OK RATE 9600"
                host.unplug()
                cpu_before = _rig_cpu_seconds(ready["pid"])
                time.sleep(2.0)  # a measuring window, not a synchronisation: the rig must idle through it
                cpu_used = _rig_cpu_seconds(ready["pid"]) - cpu_before
                assert cpu_used < 0.3, f"the rig spun on its hung-up line: {cpu_used:.2f} s of CPU in 2 s"
                host.plug()
                status = host.command("STATUS")
                assert " rate=9600 " in status, status
                assert host.command("RATE 64000") == "OK RATE 64000"
                text = log.read_text()
    finally:
        host.close()
    print(f"rig with its serial line gone for 2 s: {cpu_used:.3f} s of CPU; its log: {text!r}")
    assert text.count("hung up") == 1 and "Traceback" not in text and len(text) < 2000


def test_a_rig_whose_serial_line_is_not_there_yet_starts_and_answers_once_it_appears(tmp_path):
    """Issue 26 section 7: with the adapter absent at boot the rig box still bridges (an unshaped cable) and
    the unit does not wait for the device; the rig opens the line when it appears."""
    name = tmp_path / "hilrig"
    log = tmp_path / "rig.log"
    with local_rig(["--backend", "userspace", "--target", "127.0.0.1:9"], log, serial_device=str(name)):
        assert "is not there" in log.read_text()
        host = HostSide(name)
        try:
            assert host.command("STATUS").startswith("OK backend=userspace")
        finally:
            host.close()
    assert log.read_text().count("is not there") == 1


# The bridge backend on a bench of namespaces.


@pytest.fixture
def site() -> Iterator[BridgeSite]:
    if netns_refusal() is not None:
        pytest.skip(str(netns_refusal()))
    bench = BridgeSite()
    try:
        yield bench.open()
    finally:
        bench.close()
        assert not leftovers(bench.namespaces)


@pytest.fixture
def start_rig(site: BridgeSite, tmp_path: Path) -> Iterator[RigFactory]:
    """Start the rig as the unit does (default state directory) in the rig namespace; stopped at the end."""
    with contextlib.ExitStack() as stack:
        count = 0

        def start(*extra: str, ports: tuple[str, ...] = ()) -> tuple[dict[str, Any], RigClient]:
            nonlocal count
            count += 1
            args = ["--backend", "bridge", "--ports", ",".join(ports or site.ports), *extra]
            log = tmp_path / f"rig{count}.log"
            ready = stack.enter_context(local_rig(args, log, prefix=site.exec_in(site.rig_ns)))
            return ready, stack.enter_context(RigClient(ready["serial"]))

        yield start


def _in_rig(site: BridgeSite, *argv: str) -> str:
    return subprocess.run(["ip", "netns", "exec", site.rig_ns, *argv], capture_output=True, text=True, check=True).stdout


def _early_retrans(site: BridgeSite) -> str:
    return _in_rig(site, "cat", "/proc/sys/net/ipv4/tcp_early_retrans").strip()


def _stop(pid: int) -> int:
    os.kill(pid, signal.SIGTERM)
    return int(psutil.Process(pid).wait(15))


def test_a_killed_rig_is_undone_by_the_next_one_which_tells_the_host(site, start_rig):
    """Issue 26 section 3: SIGKILL left tcp_early_retrans at 0 (the next rig restored 0 for good), the bridge,
    tbf, the DOWN table, the address and the route; the next rig silently reset the link. Now it undoes the
    dead rig's record and says ``restarted=1``; its own stop then leaves the box as it was."""
    original = _early_retrans(site)
    assert original != "0"
    ready, rig = start_rig("--address", site.rig_address, "--target", f"{UPLINK_ADDRESS}:{SINK_PORT}")
    assert ready["restarted"] is False and rig.status()["restarted"] == "0"
    rig.rate(64_000)
    rig.down()
    os.kill(ready["pid"], signal.SIGKILL)
    psutil.Process(ready["pid"]).wait(15)
    assert _early_retrans(site) == "0" and "tbf" in _in_rig(site, "tc", "qdisc", "show")  # what it left
    again, rig = start_rig()
    assert again["restarted"] is True and rig.status()["restarted"] == "1"
    assert _early_retrans(site) == original
    assert "tbf" not in _in_rig(site, "tc", "qdisc", "show") and "drop" not in _in_rig(site, "nft", "list", "ruleset")
    assert site.rig_address not in _in_rig(site, "ip", "addr") and "rto_min" not in _in_rig(site, "ip", "route")
    assert _stop(again["pid"]) == 0
    assert _early_retrans(site) == original and "hilbr0" not in _in_rig(site, "ip", "-br", "link")


def test_after_a_hang_up_the_host_reads_the_answer_to_its_own_command_not_to_commands_queued_before(site, tmp_path):
    """A host that sends commands and goes (a script killed, the bench PC rebooted) leaves them queued; they
    are still carried out (``echo DOWN > /dev/hilrig`` works), but their replies used to go to the next host:
    its STATUS read ``OK RATE 64000``, so every reply after it was the answer to some other line."""
    host = HostSide(tmp_path / "hilrig")
    try:
        args = ["--backend", "bridge", "--ports", ",".join(site.ports), "--state-dir", str(tmp_path / "state")]
        with local_rig(args, tmp_path / "rig.log", serial_device=str(host.name), prefix=site.exec_in(site.rig_ns)):
            assert host.command("STATUS").startswith("OK backend=bridge")
            os.set_blocking(host.master, True)
            # Each RATE runs tc twice: far more than the rig carries out before it opens the line again. Not
            # fewer: with 1,000 (11 KB, which the pty buffers whole; what the rig has not read goes with the
            # hang-up) the test passed 3 of 3 with the fix undone; with 2,000 it fails 3 of 3.
            os.write(host.master, b"".join(b"RATE %d\n" % (9600 + i % 2 * 54400) for i in range(2000)))
            host.unplug()
            host.plug()
            status = host.command("STATUS", timeout=30)
            assert status.startswith("OK backend=bridge "), f"the new host read {status!r} for its STATUS"
            assert host.command("LOSS 5") == "OK LOSS 5"
    finally:
        host.close()


def test_a_second_rig_on_the_same_ports_refuses_and_leaves_the_first_one_shaping(site, start_rig, tmp_path):
    """Issue 26 section 4: the second rig deleted the first one's qdiscs and table as a dead rig's leftovers,
    and the first one's STATUS went on saying rate=64000 loss=50."""
    ready, rig = start_rig()
    rig.rate(64_000)
    rig.loss(50)
    log = tmp_path / "second.log"
    args = ["--backend", "bridge", "--ports", ",".join(site.ports)]
    refusal = rf"eth1 is already used by another rig \(pid {ready['pid']}\)"
    with pytest.raises(RigStartError, match=refusal), local_rig(args, log, prefix=site.exec_in(site.rig_ns)):
        pass
    assert log.read_text().count("\n") == 1 and "Traceback" not in log.read_text()
    qdiscs, rules = _in_rig(site, "tc", "qdisc", "show"), _in_rig(site, "nft", "list", "ruleset")
    assert qdiscs.count("rate 64Kbit") == 2 and "numgen" in rules
    assert rig.status()["loss"] == "50"
    assert _stop(ready["pid"]) == 0
    assert "tbf" not in _in_rig(site, "tc", "qdisc", "show")


def test_two_rigs_on_two_port_sets_keep_tail_loss_probes_off_until_the_last_one_stops(site, start_rig):
    """``tcp_early_retrans`` is one setting per namespace: the second rig found the first one's 0 and saved it,
    and when the first one stopped it restored the box's value under the second one's relay, whose STATUS
    still said tail_loss_probes=off. Now the last rig out restores it, whichever it is, and a killed rig's
    record is not undone under a live one."""
    original = _early_retrans(site)
    assert original != "0"
    for pair in ("a", "b"):  # a second port set in the rig's namespace, like a second pair of NICs
        subprocess.run(["ip", "-n", site.rig_ns, "link", "add", f"eth{pair}1", "type", "veth", "peer", "name",
                        f"eth{pair}2"], check=True)
    relay = ("--target", f"{UPLINK_ADDRESS}:{SINK_PORT}")
    first, _ = start_rig("--address", site.rig_address, *relay)
    second, second_rig = start_rig("--address", "10.254.7.1/24", "--bridge", "hilbr7", *relay, ports=("etha1", "etha2"))
    assert second_rig.status()["tail_loss_probes"] == "off"
    assert _stop(first["pid"]) == 0
    assert _early_retrans(site) == "0" and second_rig.status()["tail_loss_probes"] == "off"
    # The second one killed: a third rig on its ports undoes its record, but not under the first one's
    # successor, which holds the probes off.
    third, third_rig = start_rig("--address", site.rig_address, *relay)
    os.kill(second["pid"], signal.SIGKILL)
    psutil.Process(second["pid"]).wait(15)
    fourth, _ = start_rig("--bridge", "hilbr7", ports=("etha1", "etha2"))
    assert fourth["restarted"] is True
    assert _early_retrans(site) == "0" and third_rig.status()["tail_loss_probes"] == "off"
    assert _stop(fourth["pid"]) == 0 and _early_retrans(site) == "0"
    assert _stop(third["pid"]) == 0
    assert _early_retrans(site) == original  # the box's own value, from the first rig through the others


def test_a_missing_port_is_one_line_on_stderr_not_a_traceback(site, tmp_path):
    """Issue 26 section 6: under Restart=always a missing port wrote a 25-line traceback every 2 s."""
    log = tmp_path / "rig.log"
    args = ["--backend", "bridge", "--ports", "eth1,eth9"]
    with pytest.raises(RigStartError, match="rig exited with 1"), local_rig(args, log, prefix=site.exec_in(site.rig_ns)):
        pass
    text = log.read_text()
    assert text.count("\n") == 1 and text.startswith("rig: cannot run: port eth9 does not exist"), text


def test_a_state_file_that_is_not_the_rigs_is_reported_and_the_rig_starts_clean(site, start_rig, tmp_path):
    """Hostile input: garbage where the record of a dead rig would be. The rig says so in one line and undoes
    what any rig on those ports could have left (the drop table, the ports in the bridge)."""
    subprocess.run(["ip", "-n", site.rig_ns, "link", "add", "hilbr0", "type", "bridge"], check=True)
    subprocess.run(["ip", "-n", site.rig_ns, "link", "set", "eth1", "master", "hilbr0"], check=True)
    cookie = int(_in_rig(site, sys.executable, "-c",
                         "from hil_tests.rig.journal import netns_cookie; print(netns_cookie())").strip())
    state = Path("/run/hil-rig") / f"bridge-eth1-eth2-netns{cookie}.json"
    state.parent.mkdir(exist_ok=True)
    state.write_text('{"ports": ["eth1", "eth2"], "bridge": "x; rm -rf /", "table": 7}')
    ready, rig = start_rig()
    assert rig.status()["restarted"] == "1"
    assert _stop(ready["pid"]) == 0
    assert not state.exists()


def test_a_state_directory_the_rig_cannot_write_is_one_line_and_the_rig_still_shapes(site, start_rig, tmp_path):
    """A rig started by hand as an unprivileged user (no RuntimeDirectory) cannot keep its record: it says so
    once and shapes all the same."""
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    ready, rig = start_rig("--state-dir", str(blocked / "state"))
    assert rig.rate(64_000) == "RATE 64000"
    assert _stop(ready["pid"]) == 0
    text = (tmp_path / "rig1.log").read_text()
    assert text.count("cannot write the state file") == 1 and "running without it" in text, text


def _macs(site: BridgeSite) -> set[bytes]:
    links = json.loads(_in_rig(site, "ip", "-j", "link", "show"))
    return {bytes.fromhex(link["address"].replace(":", "")) for link in links if link.get("address")}


def test_the_rigs_own_bridge_and_ports_send_nothing_onto_the_link(site, start_rig):
    """Issue 26 section 5: hilbr0 kept IPv6 on and sent router solicitations and listener reports onto the
    shaped link, 13-19 frames in its first 30 s. Listen on the uplink side for the first 4 s after start
    (router solicitations follow duplicate address detection, about 1-2 s after link-up)."""
    eth_p_all = 0x0003
    capture = in_namespace(site.uplink_ns, lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(eth_p_all)))
    with capture:
        capture.bind(("wan0", 0))
        capture.settimeout(0.2)
        start_rig()
        macs = _macs(site)
        frames: list[bytes] = []
        until = time.monotonic() + 4.0
        while time.monotonic() < until:
            with contextlib.suppress(TimeoutError):
                frame, address = capture.recvfrom(65535)
                if address[2] != socket.PACKET_OUTGOING and frame[6:12] in macs:
                    frames.append(frame)
    ether_types = [hex(struct.unpack("!H", frame[12:14])[0]) for frame in frames]
    assert not frames, f"the rig sent {len(frames)} frames of its own: ether types {ether_types}"
    assert "inet6" not in _in_rig(site, "ip", "-6", "addr", "show", "dev", "hilbr0")


def test_down_stops_what_the_queue_holds_too(site, start_rig):
    """Issue 26 section 6: after ``OK DOWN`` tbf's queue (burst + 1 s at RATE: 2.3 s at 9.6 kbit/s) used to
    drain onto the link. DOWN now means nothing more crosses once the host reads OK. At 64 kbit/s the queue
    holds 1.2 s and a frame crosses every 0.19 s, so a window a little longer than the queue sees whether
    it drains, as 2.5 s did at 9.6 kbit/s (a frame every 1.26 s), in less time."""
    _, rig = start_rig()
    rig.rate(64_000)
    with in_namespace(site.uplink_ns, lambda: socket.create_server(("0.0.0.0", SINK_PORT))) as sink:
        sender = in_namespace(site.gateway_ns, lambda: socket.create_connection((UPLINK_ADDRESS, SINK_PORT), timeout=30))
        with flooding(sender):
            sink.settimeout(10)
            connection, _ = sink.accept()
            with connection:
                connection.settimeout(10)
                assert connection.recv(65536)
                assert connection.recv(65536)  # a frame 0.19 s later: the queue is full behind it
                rig.down()
                drain(connection)
                assert quiet_for(connection, 1.5), "what tbf held crossed a link that is DOWN"


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder the unprivileged rig can reach (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="s8rig-unit-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _run_as_unit(site: BridgeSite, shared: Path, settings: dict[str, list[str]], options: str, log: Path,
                 host: HostSide) -> contextlib.AbstractContextManager[dict[str, Any]]:
    runtime = shared / "run-hil-rig"
    runtime.mkdir(mode=0o700, exist_ok=True)
    os.chown(runtime, NOBODY, NOBODY)
    command = sandboxed_command(",".join(site.ports), options, str(host.name), runtime, settings)
    return local_rig([], log, prefix=site.exec_in(site.rig_ns), command=command)


def test_the_rig_runs_under_its_units_restrictions_with_delay_and_no_tail_loss_probes(site, shared_dir, tmp_path):
    """Issue 26 section 1: under ``ProtectKernelTunables=yes`` the documented DELAY/JITTER options ended the
    rig at start (``sysctl -w net.ipv4.tcp_early_retrans=0: permission denied``). The unit now makes exactly
    that file writable; the rig runs as an unprivileged user with CAP_NET_ADMIN alone, delays, records its
    changes in its runtime directory and restores the setting on stop."""
    original = _early_retrans(site)
    host = HostSide(shared_dir / "hilrig", owner=NOBODY)
    log = tmp_path / "rig.log"
    options = f"--address {site.rig_address} --target {UPLINK_ADDRESS}:{SINK_PORT}"
    try:
        with _run_as_unit(site, shared_dir, unit_settings(), options, log, host) as ready:
            assert psutil.Process(ready["pid"]).uids().real == NOBODY
            assert host.command("DELAY 50") == "OK DELAY 50"
            status = dict(field.split("=", 1) for field in host.command("STATUS").split()[1:])
            assert status["tail_loss_probes"] == "off" and status["delay"] == "50", status
            assert _early_retrans(site) == "0"
            assert list((shared_dir / "run-hil-rig").glob("bridge-eth1-eth2-netns*.json"))
            assert _stop(ready["pid"]) == 0
    finally:
        host.close()
    assert _early_retrans(site) == original, log.read_text()
    assert not list((shared_dir / "run-hil-rig").iterdir())


def test_with_proc_sys_read_only_the_rig_still_starts_and_says_tail_loss_probes_stay_on(site, shared_dir, tmp_path):
    """The unit without its ``ReadWritePaths=`` line (an older unit, or a stricter one a lab wrote): the rig
    starts, shapes and delays, says once why tail loss probes stay on, and STATUS shows it."""
    settings = {key: values for key, values in unit_settings().items() if key != "ReadWritePaths"}
    host = HostSide(shared_dir / "hilrig", owner=NOBODY)
    log = tmp_path / "rig.log"
    options = f"--address {site.rig_address} --target {UPLINK_ADDRESS}:{SINK_PORT}"
    try:
        with _run_as_unit(site, shared_dir, settings, options, log, host) as ready:
            status = dict(field.split("=", 1) for field in host.command("STATUS").split()[1:])
            assert status["tail_loss_probes"] == "on"
            assert host.command("DELAY 50") == "OK DELAY 50" and host.command("RATE 64000") == "OK RATE 64000"
            assert _stop(ready["pid"]) == 0
    finally:
        host.close()
    text = log.read_text()
    assert text.count("tail loss probes stay on") == 1 and "Traceback" not in text, text
