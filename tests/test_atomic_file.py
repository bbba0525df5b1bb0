from __future__ import annotations

import stat
from pathlib import Path

import pytest

from appliance import atomic_file


def test_a_write_that_fails_halfway_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "passwd"
    target.write_bytes(b"old\n")
    with pytest.raises(RuntimeError), atomic_file.replacing(target) as handle:
        handle.write(b"half of the new")
        raise RuntimeError("disk went away")
    assert target.read_bytes() == b"old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["passwd"]


def test_a_whole_write_replaces_the_file_with_the_mode_asked_for(tmp_path: Path) -> None:
    target = tmp_path / "passwd"
    target.write_bytes(b"old\n")
    target.chmod(0o644)
    atomic_file.write_bytes(target, b"new\n", mode=0o600)
    assert target.read_bytes() == b"new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["passwd"]
