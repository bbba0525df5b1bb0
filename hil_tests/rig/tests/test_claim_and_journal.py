"""The one-rig-per-port-set claim and the record of a rig's changes, without a network: sockets and files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hil_tests.rig.claim import Claim, PortsBusy
from hil_tests.rig.journal import Changes, Journal, JournalError


def test_a_second_claim_on_a_port_is_refused_naming_the_holder_and_takes_nothing(tmp_path: Path) -> None:
    first = Claim(["s8rig-a", "s8rig-b", "s8rig-br"])
    first.take()
    try:
        second = Claim(["s8rig-b", "s8rig-a0"])  # s8rig-a0 is taken first, then s8rig-b is refused
        with pytest.raises(PortsBusy, match=rf"s8rig-b is already used by another rig \(pid {os.getpid()}\)"):
            second.take()
        free = Claim(["s8rig-a0"])  # the refused claim let go of what it had got before the refusal
        free.take()
        free.release()
    finally:
        first.release()
    again = Claim(["s8rig-b"])
    again.take()
    again.release()


def test_a_claim_ends_with_its_process_however_it_ends() -> None:
    """SIGKILL leaves no stale lock: the kernel closes the abstract socket with the process."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "from hil_tests.rig.claim import Claim; import time; claim = Claim(['s8rig-k']); claim.take(); "
         "print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[3],
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(PortsBusy, match=f"pid {holder.pid}"):
            Claim(["s8rig-k"]).take()
    finally:
        holder.kill()
        holder.wait()  # the kernel closed the process's sockets before its exit status was there to collect
    after = Claim(["s8rig-k"])
    after.take()
    after.release()


def test_the_record_round_trips_and_is_replaced_whole(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "state", "bridge-eth1-eth2")
    assert journal.load() is None
    changes = Changes(["eth1", "eth2"], "hilbr0", "hilrig_hilbr0", created_bridge=True, enslaved=["eth1"],
                      sysctls={"/proc/sys/net/ipv4/tcp_early_retrans": "3"}, addrgenmodes={"eth1": "eui64"},
                      routes=[["10.99.0.5/32", "dev", "router9"]], shaped=True, mcast_snooping="1")
    journal.save(changes)
    assert journal.load() == changes
    assert [path.name for path in journal.path.parent.iterdir()] == [journal.path.name]  # no .new left
    journal.remove()
    assert journal.load() is None


def test_a_state_directory_that_cannot_be_written_is_a_clear_error(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(JournalError, match="cannot write the state file .*--state-dir"):
        Journal(blocked / "state", "bridge-eth1-eth2").save(Changes(["eth1", "eth2"], "hilbr0", "t"))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=15), inner, max_size=6),
    max_leaves=20,
)
FIELDS = st.fixed_dictionaries(
    {"ports": st.just(["eth1", "eth2"]), "bridge": st.just("hilbr0"), "table": st.just("hilrig_hilbr0")},
    optional={name: JSON for name in ("created_bridge", "enslaved", "address", "sysctls", "addrgenmodes", "routes",
                                      "shaped", "mcast_snooping", "colour")},
)


@settings(max_examples=300, deadline=None)
@given(record=st.one_of(JSON, FIELDS))
def test_a_record_the_rig_did_not_write_is_refused_as_such(record: object, tmp_path_factory) -> None:
    """Hostile input: whatever the file holds, loading it gives the rig's own kind of record or ValueError,
    and a sysctl path in it can only be one under /proc/sys/net (the rig writes back what it finds)."""
    path = tmp_path_factory.mktemp("state")
    journal = Journal(path, "bridge-eth1-eth2")
    journal.path.write_text(json.dumps(record))
    try:
        changes = journal.load()
    except ValueError:
        return
    assert isinstance(changes, Changes)
    assert all(key.startswith("/proc/sys/net/") and ".." not in key for key in changes.sysctls)
    assert all(isinstance(port, str) for port in changes.enslaved)
