"""At-least-once delivery upstream means duplicates: keep one copy of each message id.

Both jobs keep the earliest received copy; copies received in the same millisecond are ordered by the
landing file they are in, then by send time, so the copy kept never depends on the order Spark reads
files in. Batch does it here with a window function; streaming inside each ``OrderedFold``
(``ordered.py``), which holds a key's rows until its windows close, so it sees every copy a window can.

Ingest rejects are deduplicated too: a malformed message that was redelivered is one problem, not two.
Their key is the message id when the ingest could read one, else the content (topic, payload, user
properties), which a redelivery repeats exactly.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

KEY = "message_id"
COPY_ORDER = ("received_ms", "landing_file", "sent_ms")
REJECT_KEY = "_reject_key"


def _copy_order(key: str) -> Window:
    return Window.partitionBy(key).orderBy(*[F.col(name).asc_nulls_last() for name in COPY_ORDER])


def first_copies(frame: DataFrame, key: str = KEY) -> DataFrame:
    """One row per ``key``: the earliest received copy (batch; streaming: ``ordered.OrderedFold``)."""
    return frame.withColumn("_copy", F.row_number().over(_copy_order(key))).where(F.col("_copy") == 1).drop("_copy")


def mark_first_copies(frame: DataFrame, groups: dict[str, Column], key: str = KEY) -> DataFrame:
    """``frame`` with a boolean column per group (name: the condition its rows meet), true on the row that
    ``first_copies(frame.where(condition))`` keeps: the earliest received copy of its ``key`` among that
    group's rows. Every group is one running count over one window, so Spark shuffles and sorts the rows
    once however many groups share them (batch: all events, the readings and the telemetry rejects)."""
    so_far = _copy_order(key).rowsBetween(Window.unboundedPreceding, Window.currentRow)
    flags = {}
    for name, condition in groups.items():
        member = F.coalesce(condition, F.lit(False))
        flags[name] = member & (F.count_if(member).over(so_far) == 1)
    return frame.withColumns(flags)


CandidateKey = Callable[[Column], Column]
_CANDIDATE = "_candidate_key"


def hashed_key(key: Column) -> Column:
    """The default candidate key of ``mark_repeated_copies``: 64 bits of hash, computed on the fly."""
    return F.xxhash64(key)


def mark_repeated_copies(frame: DataFrame, groups: dict[str, Column], keyed: Column, key: str = KEY,
                         candidate_key: CandidateKey = hashed_key) -> DataFrame:
    """``mark_first_copies(frame, groups, key)``, with only the rows whose key may have copies through its
    window. ``keyed`` is the condition of the rows the groups are made of (each group's condition implies
    it); the other rows pass with every flag false.

    At-least-once delivery makes copies of a few messages, not of most: shuffling and sorting every row
    by ``key`` to find them was most of the batch job's time. Here the rows' ``candidate_key`` (a long
    computed from ``key``) crosses a hash aggregate instead, a shuffle of longs; a candidate key counted
    more than once names the candidates, and only the rows holding one (few, unless the data is mostly
    copies) are broadcast-joined out to the exact window. A row whose candidate key is its own holds the
    only copy of its ``key`` among the keyed rows, so it is the first copy of every group it is in. Two
    keys with one candidate key (a collision) only send both to the window. Broadcast whatever its size:
    a zone of mostly copies makes the candidates large and the join slower, never wrong."""
    hashed = frame.withColumn(_CANDIDATE, F.when(keyed, F.coalesce(candidate_key(F.col(key)), F.lit(0).cast("long"))))
    counts = hashed.where(F.col(_CANDIDATE).isNotNull()).groupBy(_CANDIDATE).agg(F.count(F.lit(1)).alias("_copies"))
    candidates = F.broadcast(counts.where(F.col("_copies") > 1).select(_CANDIDATE))
    single = hashed.join(candidates, _CANDIDATE, "left_anti").withColumns(
        {name: F.coalesce(condition, F.lit(False)) for name, condition in groups.items()})
    repeated = mark_first_copies(hashed.join(candidates, _CANDIDATE, "left_semi"), groups, key)
    return single.unionByName(repeated).drop(_CANDIDATE)


def reject_key() -> Column:
    """What names an ingest reject across its redeliveries."""
    content = F.concat_ws(
        "\u001f", F.col("topic"), F.coalesce(F.col("payload"), F.lit("")),
        F.coalesce(F.col("payload_base64"), F.lit("")), F.to_json(F.array_sort(F.map_entries("properties"))),
    )
    return F.coalesce(F.col(KEY), F.concat(F.lit("sha256:"), F.sha2(content, 256)))


def first_rejects(frame: DataFrame) -> DataFrame:
    """Ingest rejects, one per rejected message (see the module's docstring)."""
    return first_copies(frame.withColumn(REJECT_KEY, reject_key()), key=REJECT_KEY).drop(REJECT_KEY)
