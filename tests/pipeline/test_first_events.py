"""The batch job's deduplication of the events (``batch.first_events``): only the rows whose message id may
have copies go through the exact window, and the rows and flags it keeps are those of the first-copy rule
(``dedup.first_copies``: earliest received, then landing file, then send time) applied to each group.

Held to a plain Python statement of the rule on small zones of many copies: copies in one millisecond, one
file, one send time; readings and rejects sharing an id; null ids; lines that are not records; and the
candidate key forced to collide (every id one key, or two keys for all ids), so the exact step is what
decides wherever a collision sends rows to it.

Each example is many zones at once, their message ids kept apart by the zone's number (null ids stay null:
they are one group whatever the zone), and each zone's ids get one of the three candidate keys (by the
zone's number): a query over these zones costs the same for one zone or sixteen (seconds of planning and
scheduling; the rows are nothing), so the property checks several times the zones of one zone per
example, each under one candidate key, for a fraction of the queries.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from pipeline.records import EVENTS
from testing.campaigns import campaign

if TYPE_CHECKING:  # imported where used: every `make test` worker collects this folder and runs no Spark
    from pyspark.sql import Column
    from pyspark.sql import types as T

READING_PAYLOAD = json.dumps({"temperature": 20.5, "set_point": 21.0, "heater": True, "device": "t1", "ts_ms": 1})
KINDS = ("reading", "reject", "alert", "unreadable")
#: The candidate keys a zone's ids get (`candidate_key`), by name.
CANDIDATE_KEYS = ("xxhash64", "one key for every id", "two keys")

rows_strategy = st.lists(
    st.tuples(st.sampled_from(["m0", "m1", "m2", "m3", None]), st.sampled_from(KINDS), st.integers(0, 2),
              st.sampled_from(["a.jsonl", "b.jsonl"]), st.sampled_from([None, 0, 1])),
    max_size=30,
)


def landing_row(tag: int, message_id: str | None, kind: str, received_ms: int, landing_file: str,
                sent_ms: int | None) -> dict:
    """A bronze events row; ``tag`` (its ``enqueued_ms``, read by no rule) names it in the output."""
    return {
        "message_id": None if kind == "unreadable" else message_id, "gateway_id": "gw1", "device_id": "t1",
        "output": "alerts" if kind == "alert" else "data", "priority": 0, "enqueued_ms": tag,
        "sent_ms": sent_ms, "received_ms": received_ms, "topic": "t",
        "payload": "{not json" if kind == "reject" else READING_PAYLOAD,
        "landing_error": "landing line is not a JSON record (cut short?)" if kind == "unreadable" else None,
        "landing_file": landing_file,
    }


def expected(rows: list[dict]) -> set[tuple[int, bool, bool, bool]]:
    """(tag, first event, first reading, first reject) of each row the rule keeps: the first copy of its
    id in each group it is in; every line that is not a record."""
    from pipeline.jobs.batch import EVENT, READING, REJECT

    def order(row):
        return (row["received_ms"], row["landing_file"], row["sent_ms"] is None, row["sent_ms"] or 0)

    groups = {
        EVENT: lambda row: row["landing_error"] is None,
        READING: lambda row: row["landing_error"] is None and row["payload"] == READING_PAYLOAD
        and row["output"] == "data",
        REJECT: lambda row: row["landing_error"] is None and row["payload"] != READING_PAYLOAD
        and row["output"] == "data",
    }
    firsts = {}
    for name, member in groups.items():
        earliest: dict[str | None, dict] = {}
        for row in filter(member, rows):
            if row["message_id"] not in earliest or order(row) < order(earliest[row["message_id"]]):
                earliest[row["message_id"]] = row
        firsts[name] = {row["enqueued_ms"] for row in earliest.values()}
    flagged = {(row["enqueued_ms"], *(row["enqueued_ms"] in firsts[name] for name in groups)) for row in rows}
    return {row for row in flagged if any(row[1:])} | {
        (row["enqueued_ms"], False, False, False) for row in rows if row["landing_error"] is not None}


#: Zones per example and examples: 48-96 zones of up to 30 rows (16-32 per candidate key), in 6 queries.
#: (Ten single zones, as before, drew two copies of one id received in one millisecond whose file order and
#: send order disagree in 10 runs of 20; four examples of 8-16 zones in 19 of 20.)
ZONES = (8, 16)
EXAMPLES = 6
ZONE_NUMBER = r"^z(\d+)\."  # of a message id


def union_of_zones(zones: list[list[tuple]]) -> list[dict]:
    """The drawn zones as one: each zone's message ids prefixed by its number, each row tagged apart and
    told its ``zone``. Copies equal in the whole copy order are left out (which one is kept is up to the
    engine)."""
    rows, orders = [], set()
    for zone, drawn in enumerate(zones):
        for message_id, kind, received_ms, landing_file, sent_ms in drawn:
            zone_id = None if message_id is None else f"z{zone}.{message_id}"
            row = landing_row(len(rows), zone_id, kind, received_ms, landing_file, sent_ms)
            order = (row["message_id"], received_ms, landing_file, sent_ms)
            if kind != "unreadable" and order in orders:
                continue
            orders.add(order)
            rows.append(row | {"zone": zone})
    return rows


def rows_schema() -> T.StructType:
    """The bronze events table's columns (pyspark is imported by the test, not at collection: every test
    worker collects this folder)."""
    from pyspark.sql import types as T

    from pipeline.jobs.schemas import LANDING

    return T.StructType(LANDING.fields + [T.StructField("landing_error", T.StringType()),
                                          T.StructField("landing_file", T.StringType())])


def candidate_key(name: str, key: Column) -> Column:
    """The candidate key ``name`` of ``CANDIDATE_KEYS`` for the message id ``key``: the job's own, every id
    one key, or two keys for all ids."""
    from pyspark.sql import functions as F

    from pipeline.jobs.dedup import hashed_key

    if name == "xxhash64":
        return hashed_key(key)
    if name == "one key for every id":
        return F.lit(7).cast("long")
    assert name == "two keys"
    return F.xxhash64(key) % 2


def candidate_key_of_the_zone(key: Column) -> Column:
    """``CANDIDATE_KEYS``' n-th for the ids of zones n, n + 3, n + 6...; a null id gets the first."""
    from pyspark.sql import functions as F

    zone = F.regexp_extract(key, ZONE_NUMBER, 1).cast("int") % len(CANDIDATE_KEYS)
    chosen = candidate_key(CANDIDATE_KEYS[0], key)
    for number, name in enumerate(CANDIDATE_KEYS[1:], start=1):
        chosen = F.when(zone == number, candidate_key(name, key)).otherwise(chosen)
    return chosen


@given(st.lists(rows_strategy, min_size=ZONES[0], max_size=ZONES[1]))
@campaign(EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_first_events_keeps_the_rows_and_flags_of_the_first_copy_rule(spark, zones):
    from pyspark.sql import functions as F

    from pipeline.jobs import bronze
    from pipeline.jobs.batch import EVENT, READING, REJECT, first_events
    from pipeline.jobs.source import with_times

    rows = union_of_zones(zones)
    schema = rows_schema()
    frame = spark.createDataFrame([tuple(row.get(f.name) for f in schema.fields) for row in rows], schema)
    lines = with_times(bronze.parse_payloads(frame.withColumn("kind", F.lit(EVENTS))))
    events = first_events(lines, candidate_key_of_the_zone)
    kept = [tuple(row) for row in events.select("enqueued_ms", EVENT, READING, REJECT).collect()]
    events.unpersist()
    want = expected(rows)
    candidate_key_of_row = {row["enqueued_ms"]: CANDIDATE_KEYS[row["zone"] % len(CANDIDATE_KEYS)] for row in rows}
    for name in CANDIDATE_KEYS:  # each candidate key's zones apart, named if they fail
        assert {row for row in kept if candidate_key_of_row[row[0]] == name} == {
            row for row in want if candidate_key_of_row[row[0]] == name}, name
    assert len(kept) == len(set(kept)) == len(want)  # and no row twice
