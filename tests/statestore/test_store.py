"""The SQLite store: conditions, expiry to the millisecond, fencing, quotas, the clock across reopen."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from appliance.statestore import errors
from appliance.statestore.commands import Condition, SetCommand
from appliance.statestore.errors import StateStoreError
from appliance.statestore.hlc import Hlc
from appliance.statestore.store import FILE_NAME, Change, Quotas, StateStore

T0 = 1_700_000_000_000
BIG = Quotas(max_keys=1000, max_bytes=1_000_000)


def ts(wall: int = T0, counter: int = 0, node: str = "client") -> Hlc:
    return Hlc(wall, counter, node)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StateStore]:
    opened = StateStore(tmp_path, "StateStore", BIG)
    yield opened
    opened.close()


def test_set_then_get_returns_value_and_the_version_issued(store: StateStore) -> None:
    outcome = store.set(SetCommand(b"k", b"v"), ts(), None, T0)
    assert outcome.applied and outcome.version == Hlc(T0, 1, "StateStore")
    assert outcome.changes == [Change(b"k", b"v", outcome.version)]
    entry = store.get(b"k", T0)
    assert entry is not None and entry.value == b"v" and entry.version == outcome.version


def test_versions_grow_and_exceed_the_request_timestamp(store: StateStore) -> None:
    first = store.set(SetCommand(b"k", b"1"), ts(T0 + 50_000), None, T0).version
    second = store.set(SetCommand(b"k", b"2"), ts(T0 - 10_000), None, T0).version
    assert first > ts(T0 + 50_000) and second > first


def test_nx_sets_only_a_missing_key(store: StateStore) -> None:
    assert store.set(SetCommand(b"k", b"1", Condition.NX), ts(), None, T0).applied
    refused = store.set(SetCommand(b"k", b"2", Condition.NX), ts(), None, T0)
    assert not refused.applied and refused.changes == [] and refused.version > ts()
    assert store.get(b"k", T0).value == b"1"  # type: ignore[union-attr]


def test_nex_sets_a_missing_key_or_one_with_the_same_value(store: StateStore) -> None:
    assert store.set(SetCommand(b"lock", b"client1", Condition.NEX, 1000), ts(), None, T0).applied
    assert not store.set(SetCommand(b"lock", b"client2", Condition.NEX, 1000), ts(), None, T0).applied
    renewed = store.set(SetCommand(b"lock", b"client1", Condition.NEX, 1000), ts(), None, T0 + 900)
    assert renewed.applied
    assert store.get(b"lock", T0 + 1899) is not None  # the renewal moved the deadline
    assert store.get(b"lock", T0 + 1900) is None


def test_px_expiry_is_exact_to_the_millisecond_before_any_sweep(store: StateStore) -> None:
    store.set(SetCommand(b"k", b"v", expire_ms=100), ts(), None, T0)
    assert store.get(b"k", T0 + 99) is not None
    assert store.get(b"k", T0 + 100) is None
    # NX sees it as absent, and the change reports the expiry before the new value
    outcome = store.set(SetCommand(b"k", b"new", Condition.NX), ts(), None, T0 + 100)
    assert outcome.applied
    assert [c.value for c in outcome.changes] == [None, b"new"]
    store.set(SetCommand(b"k", b"v", expire_ms=5), ts(), None, T0 + 100)
    gone = store.delete(b"k", None, T0 + 105)
    assert gone.count == 0 and [c.value for c in gone.changes] == [None]


def test_set_without_px_clears_an_earlier_expiry(store: StateStore) -> None:
    store.set(SetCommand(b"k", b"v", expire_ms=10), ts(), None, T0)
    store.set(SetCommand(b"k", b"v"), ts(), None, T0 + 1)
    assert store.get(b"k", T0 + 10_000) is not None


def test_expire_removes_due_entries_and_reports_them(store: StateStore) -> None:
    first = store.set(SetCommand(b"a", b"1", expire_ms=10), ts(), None, T0).version
    store.set(SetCommand(b"b", b"2", expire_ms=20), ts(), None, T0)
    store.set(SetCommand(b"c", b"3"), ts(), None, T0)
    assert store.next_expiry() == T0 + 10
    assert store.expire(T0 + 9) == []
    assert store.expire(T0 + 10) == [Change(b"a", None, first)]
    assert store.next_expiry() == T0 + 20
    assert [c.key for c in store.expire(T0 + 100)] == [b"b"]
    assert store.next_expiry() is None
    assert store.key_count == 1


def test_delete_and_vdelete(store: StateStore) -> None:
    version = store.set(SetCommand(b"k", b"v"), ts(), None, T0).version
    mismatch = store.delete(b"k", None, T0, only_value=b"other")
    assert (mismatch.count, mismatch.version, mismatch.changes) == (-1, version, [])
    deleted = store.delete(b"k", None, T0, only_value=b"v")
    assert (deleted.count, deleted.version) == (1, version)
    assert deleted.changes == [Change(b"k", None, version)]
    assert store.delete(b"k", None, T0).count == 0
    assert store.delete(b"k", None, T0, only_value=b"v").count == 0


class TestFencing:
    """The protocol's algorithm, and the SDK test scenarios 3, 4, 5, 17, 18, 23, 24."""

    def test_a_token_is_stored_and_then_required(self, store: StateStore) -> None:
        token = ts(T0, 5, "lock")
        assert store.set(SetCommand(b"p", b"1"), ts(), token, T0).applied
        with pytest.raises(StateStoreError) as caught:
            store.set(SetCommand(b"p", b"2"), ts(), None, T0)
        assert caught.value.message == errors.FENCING_TOKEN_REQUIRED
        with pytest.raises(StateStoreError) as caught:
            store.set(SetCommand(b"p", b"2"), ts(), ts(T0, 4, "lock"), T0)
        assert caught.value.message == errors.FENCING_TOKEN_LOWER
        assert store.set(SetCommand(b"p", b"3"), ts(), token, T0).applied  # equal is accepted
        assert store.get(b"p", T0).value == b"3"  # type: ignore[union-attr]

    def test_a_newer_token_replaces_the_stored_one(self, store: StateStore) -> None:
        store.set(SetCommand(b"p", b"1"), ts(), ts(T0, 1), T0)
        store.set(SetCommand(b"p", b"2"), ts(), ts(T0, 9), T0)
        with pytest.raises(StateStoreError):
            store.set(SetCommand(b"p", b"3"), ts(), ts(T0, 5), T0)
        assert store.get(b"p", T0).fencing_token == ts(T0, 9)  # type: ignore[union-attr]

    def test_a_key_without_token_accepts_one_and_keeps_it(self, store: StateStore) -> None:
        store.set(SetCommand(b"p", b"1"), ts(), None, T0)
        store.set(SetCommand(b"p", b"2"), ts(), ts(T0, 3), T0)
        assert store.get(b"p", T0).fencing_token == ts(T0, 3)  # type: ignore[union-attr]

    @pytest.mark.parametrize("only_value", [None, b"1"])
    def test_delete_and_vdelete_need_the_token(self, store: StateStore, only_value: bytes | None) -> None:
        store.set(SetCommand(b"p", b"1"), ts(), ts(T0, 3), T0)
        for offered, message in ((None, errors.FENCING_TOKEN_REQUIRED), (ts(T0, 2), errors.FENCING_TOKEN_LOWER)):
            with pytest.raises(StateStoreError) as caught:
                store.delete(b"p", offered, T0, only_value)
            assert caught.value.message == message
        assert store.get(b"p", T0) is not None
        assert store.delete(b"p", ts(T0, 3), T0, only_value).count == 1

    def test_the_token_expires_with_the_key(self, store: StateStore) -> None:
        store.set(SetCommand(b"p", b"1", expire_ms=10), ts(), ts(T0, 3), T0)
        assert store.set(SetCommand(b"p", b"2"), ts(), None, T0 + 10).applied

    def test_refusals_change_nothing(self, store: StateStore) -> None:
        store.set(SetCommand(b"p", b"1"), ts(), ts(T0, 3), T0)
        before = (store.key_count, store.total_bytes, store.clock.last)
        with pytest.raises(StateStoreError):
            store.set(SetCommand(b"p", b"much longer value"), ts(T0 + 5000), None, T0 + 5000)
        assert (store.key_count, store.total_bytes, store.clock.last) == before


def test_key_quota(tmp_path: Path) -> None:
    store = StateStore(tmp_path, "S", Quotas(max_keys=2, max_bytes=10_000))
    store.set(SetCommand(b"a", b"1"), ts(), None, T0)
    store.set(SetCommand(b"b", b"1"), ts(), None, T0)
    with pytest.raises(StateStoreError) as caught:
        store.set(SetCommand(b"c", b"1"), ts(), None, T0)
    assert caught.value.message == errors.QUOTA_EXCEEDED
    assert store.set(SetCommand(b"a", b"2"), ts(), None, T0).applied  # replacing adds no key
    store.delete(b"b", None, T0)
    assert store.set(SetCommand(b"c", b"1"), ts(), None, T0).applied
    store.close()


def test_byte_quota_counts_keys_and_values(tmp_path: Path) -> None:
    store = StateStore(tmp_path, "S", Quotas(max_keys=100, max_bytes=10))
    assert store.set(SetCommand(b"ab", b"12345678"), ts(), None, T0).applied  # exactly 10
    with pytest.raises(StateStoreError) as caught:
        store.set(SetCommand(b"ab", b"123456789"), ts(), None, T0)
    assert caught.value.message == errors.QUOTA_EXCEEDED
    assert store.set(SetCommand(b"ab", b"1"), ts(), None, T0).applied  # shrinking is always fine
    assert store.total_bytes == 3
    store.close()


def test_everything_survives_reopen_and_the_clock_resumes_above_it(tmp_path: Path) -> None:
    store = StateStore(tmp_path, "S", BIG, sync="full")
    version = store.set(SetCommand(b"k", b"v", expire_ms=60_000), ts(T0 + 30_000), ts(T0, 7, "lock"), T0).version
    store.close()
    reopened = StateStore(tmp_path, "S", BIG)
    entry = reopened.get(b"k", T0)
    assert entry is not None
    assert (entry.value, entry.version, entry.fencing_token, entry.expires_at) == (b"v", version, ts(T0, 7, "lock"), T0 + 60_000)
    assert (reopened.key_count, reopened.total_bytes) == (1, 2)
    # the wall clock "went back" an hour: versions still grow
    assert reopened.set(SetCommand(b"x", b"y"), ts(T0 - 3_600_000), None, T0 - 3_600_000).version > version
    reopened.close()


def test_the_database_is_in_wal_mode_with_the_chosen_sync_level(tmp_path: Path) -> None:
    StateStore(tmp_path, "S", BIG, sync="full").close()
    db = sqlite3.connect(tmp_path / FILE_NAME)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()
    with pytest.raises(ValueError):
        StateStore(tmp_path, "S", BIG, sync="sometimes")


def test_the_fencing_rejection_is_the_sdk_clients_string_to_the_letter() -> None:
    """The SDK clients (Rust, Go) match this text exactly to raise their fencing error; the spec page's
    "lower version *that* the fencing token" is a typo (docs/statestore-differences.md)."""
    assert errors.FENCING_TOKEN_LOWER == (
        "the request fencing token is a lower version than the fencing token protecting the resource"
    )
