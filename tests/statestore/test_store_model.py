"""A hypothesis state machine: random command sequences against the SQLite store and a reference model.

The model is the protocol written as plainly as possible (a dict, the fencing rule, NX/NEX, PX, quotas);
the store must agree with it on every outcome, error string, value and version - including across
closing and reopening the database file.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from appliance.statestore import errors
from appliance.statestore.commands import Condition, SetCommand
from appliance.statestore.errors import StateStoreError
from appliance.statestore.hlc import Hlc
from appliance.statestore.store import Quotas, StateStore
from testing.campaigns import campaign

T0 = 1_700_000_000_000
QUOTAS = Quotas(max_keys=3, max_bytes=24)
keys = st.sampled_from([b"a", b"b", b"c", b"d"])
values = st.sampled_from([b"", b"x", b"yy", b"zzzzzzzz"])
tokens = st.none() | st.builds(Hlc, st.sampled_from([T0, T0 + 1]), st.integers(0, 2), st.sampled_from(["n1", "n2"]))


@dataclass
class ModelEntry:
    value: bytes
    version: Hlc
    fencing_token: Hlc | None
    expires_at: int | None


class StoreVersusModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="statestore-model-"))
        self.store = StateStore(self.dir, "S", QUOTAS)
        self.model: dict[bytes, ModelEntry] = {}
        self.now = T0
        self.last_version = Hlc(0, 0, "S")

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _live(self, key: bytes) -> ModelEntry | None:
        entry = self.model.get(key)
        if entry is not None and entry.expires_at is not None and entry.expires_at <= self.now:
            del self.model[key]  # the store removes an expired entry it touches in a change
            return None
        return entry

    def _check_fencing(self, entry: ModelEntry, token: Hlc | None) -> str | None:
        if entry.fencing_token is None:
            return None
        if token is None:
            return errors.FENCING_TOKEN_REQUIRED
        return errors.FENCING_TOKEN_LOWER if token < entry.fencing_token else None

    @rule(key=keys, value=values, condition=st.sampled_from(Condition), px=st.none() | st.integers(1, 30), token=tokens)
    def set(self, key: bytes, value: bytes, condition: Condition, px: int | None, token: Hlc | None) -> None:
        snapshot = dict(self.model)
        current = self._live(key)
        expected_error = self._check_fencing(current, token) if current else None
        applies = (
            condition is Condition.ALWAYS
            or current is None
            or (condition is Condition.NEX and current.value == value)
        )
        if expected_error is None and applies:
            count = len(self.model) + (0 if current else 1)
            size = sum(len(k) + len(e.value) for k, e in self.model.items()) + len(value) + (
                -len(current.value) if current else len(key)
            )
            grows = size > sum(len(k) + len(e.value) for k, e in self.model.items())
            if count > QUOTAS.max_keys or (grows and size > QUOTAS.max_bytes):
                expected_error = errors.QUOTA_EXCEEDED
        try:
            outcome = self.store.set(SetCommand(key, value, condition, px), Hlc(self.now, 0, "c"), token, self.now)
        except StateStoreError as exc:
            assert exc.message == expected_error
            self.model = snapshot  # the refused transaction removed nothing, not even an expired entry
            return
        assert expected_error is None, expected_error
        assert outcome.applied == applies
        assert outcome.version > self.last_version and outcome.version > Hlc(self.now, 0, "c")
        self.last_version = outcome.version
        if applies:
            stored_token = token
            if current and current.fencing_token is not None:
                stored_token = max(current.fencing_token, token) if token else current.fencing_token
            self.model[key] = ModelEntry(value, outcome.version, stored_token, self.now + px if px else None)

    @rule(key=keys, only_value=st.none() | values, token=tokens)
    def delete(self, key: bytes, only_value: bytes | None, token: Hlc | None) -> None:
        snapshot = dict(self.model)
        current = self._live(key)
        expected_error = self._check_fencing(current, token) if current else None
        try:
            outcome = self.store.delete(key, token, self.now, only_value)
        except StateStoreError as exc:
            assert exc.message == expected_error
            self.model = snapshot
            return
        assert expected_error is None, expected_error
        if current is None:
            assert outcome.count == 0
        elif only_value is not None and only_value != current.value:
            assert (outcome.count, outcome.version) == (-1, current.version)
        else:
            assert (outcome.count, outcome.version) == (1, current.version)
            del self.model[key]

    @rule(key=keys)
    def get(self, key: bytes) -> None:
        entry = self.model.get(key)
        live = entry if entry and (entry.expires_at is None or entry.expires_at > self.now) else None
        got = self.store.get(key, self.now)
        if live is None:
            assert got is None
        else:
            assert got is not None
            assert (got.value, got.version, got.fencing_token) == (live.value, live.version, live.fencing_token)

    @rule(ms=st.integers(1, 20))
    def advance_time(self, ms: int) -> None:
        self.now += ms

    @rule()
    def sweep(self) -> None:
        due = {k for k, e in self.model.items() if e.expires_at is not None and e.expires_at <= self.now}
        assert {change.key for change in self.store.expire(self.now)} == due
        for key in due:
            del self.model[key]

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = StateStore(self.dir, "S", QUOTAS)

    @invariant()
    def counters_match(self) -> None:
        assert self.store.key_count == len(self.model)
        assert self.store.total_bytes == sum(len(k) + len(e.value) for k, e in self.model.items())


StoreVersusModel.TestCase.settings = campaign(60, stateful_step_count=30, deadline=None)
TestStoreVersusModel = StoreVersusModel.TestCase
