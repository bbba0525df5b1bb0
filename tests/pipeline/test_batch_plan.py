"""How the batch job runs, not only what it writes (issue 17, "Speed"): no Python worker on its path, and
the events read, parsed and deduplicated once for every output that needs them.

Read from the physical plans Spark would execute (``executedPlan``), over the sample landing zone. A
cached frame appears in a plan as an ``InMemoryRelation`` line with the plan that fills it indented below.
The queue counters' SQL is also held to ``delivery.counter_step``, the pandas step streaming runs, on
random queues (resets, repeated samples, absent counters).
"""

from __future__ import annotations

import itertools
import os
import random
import re
import shutil
import subprocess
from dataclasses import replace

import pytest

from pipeline.spark import LOCAL_JAVA_OPTIONS, local_cores, local_settings
from tests.pipeline.pipeline_data import T0

PYTHON_OPERATORS = ("Python", "Pandas", "ArrowEval", "BatchEval")  # FlatMapGroupsInPandas, ArrowEvalPython, ...


@pytest.fixture(scope="module")
def plans(spark, batch_outputs):
    """The physical plans of the batch job's outputs over the sample, built on the run ``batch_outputs``
    made (the same settings, without the compaction: its bronze table is there, and a compaction with
    nothing to read still costs a second of CPU): that run is the cluster test's reference too, and a
    make test runs it once."""
    from pipeline.jobs.batch import build

    settings = replace(batch_outputs[0], compact=False)
    # A scan's Location is cut to 100 characters by default, which loses the table's name under pytest's
    # long temporary paths.
    spark.conf.set("spark.sql.maxMetadataStringLength", "10000")
    try:
        outputs = build(spark, settings)
        yield {name: frame._jdf.queryExecution().executedPlan().toString() for name, frame in outputs.items()}
    finally:
        spark.conf.unset("spark.sql.maxMetadataStringLength")
        spark.catalog.clearCache()


def outside_caches(plan: str) -> list[str]:
    """The plan's lines that are not part of a cached frame's own plan."""
    kept, cached_below = [], None
    for line in plan.splitlines():
        depth = indent(line)
        if cached_below is not None and depth > cached_below:
            continue
        cached_below = depth if "InMemoryRelation" in line else None
        kept.append(line)
    return kept


def scans_events(line: str) -> bool:
    """A scan of the bronze table of the events (``bronze.read``: ``BRONZE/events``)."""
    return "FileScan parquet" in line and re.search(r"Location: [^[]*\[[^\]]*/events\]", line) is not None


def test_no_output_of_the_batch_job_runs_python(plans):
    for name, plan in plans.items():
        found = [word for word in PYTHON_OPERATORS if word in plan]
        assert not found, f"{name} runs {found} in its plan:\n{plan}"


def indent(line: str) -> int:
    return len(line) - len(line.lstrip(" +-:"))


def cached_events(plan: str) -> list[str]:
    """The plans of the cached frames that read the events, attribute ids left out (each plan that uses a
    cached frame numbers its columns anew)."""
    found, lines = [], plan.splitlines()
    for number, line in enumerate(lines):
        if "InMemoryRelation" in line:
            depth = indent(line)
            below = list(itertools.takewhile(lambda text, depth=depth: indent(text) > depth, lines[number + 1:]))
            if any(scans_events(text) for text in below):
                found.append(re.sub(r"#\d+L?", "", "\n".join(text[depth:] for text in [line, *below])))
    return found


def shuffled_below(plan: str) -> list[tuple[str, list[str]]]:
    """Each ``Exchange hashpartitioning`` line of ``plan`` and the lines of the plan it shuffles."""
    found, lines = [], plan.splitlines()
    for number, line in enumerate(lines):
        if "Exchange hashpartitioning" in line:
            depth = indent(line)
            found.append((line.strip(" +-:"), list(
                itertools.takewhile(lambda text, depth=depth: indent(text) > depth, lines[number + 1:]))))
    return found


def test_every_output_takes_the_events_from_one_cached_deduplication_that_shuffles_whole_rows_only_of_copies(plans):
    """Whole event rows cross a shuffle only if their message id's 64-bit candidate key was counted more than
    once (a broadcast semi join); every row's key crosses one shuffle, as a long, in a partial count."""
    readers = {name: plan for name, plan in plans.items() if scans_events(plan)}
    assert set(readers) == {"rollups", "setpoint_changes", "delivery_latency", "sla", "quarantine", "firmware",
                            "firmware_updates"}
    cached = set()
    for name, plan in readers.items():
        assert not [line for line in outside_caches(plan) if scans_events(line)], f"{name} reads the events itself:\n{plan}"
        cached |= {text for text in cached_events(plan) if text.startswith("InMemoryRelation [message_id")}
    assert len(cached) == 1, "\n\n".join(cached)  # one cached frame of deduplicated events serves them all
    (events,) = cached
    shuffles = shuffled_below(events)
    assert len(shuffles) == 2, events  # the candidate keys, then the candidates' rows (three dedups)
    (keys,) = [below for line, below in shuffles if line.startswith("Exchange hashpartitioning(_candidate_key")]
    assert keys[0].strip(" +-:").startswith("HashAggregate(keys=[_candidate_key], functions=[partial_count(1)]"), keys
    (rows,) = [below for line, below in shuffles if line.startswith("Exchange hashpartitioning(message_id")]
    scan = next(number for number, line in enumerate(rows) if scans_events(line))
    assert [line for line in rows[:scan] if "BroadcastHashJoin" in line and "LeftSemi" in line], "\n".join(rows)
    assert "LeftAnti" in events  # the rest pass by the window, unshuffled


def test_the_cached_events_hold_only_what_the_outputs_read(plans):
    """The copy order's file name and send time stop at the window that uses them, a reading's raw payload
    is never read, nor its device field (compaction checked it): shuffling, sorting and caching them was
    most of the bytes and of the time of the deduplication."""
    (columns,) = {re.sub(r"#\d+L?", "", line.split("[", 1)[1].split("]", 1)[0])
                  for plan in plans.values() for line in plan.splitlines() if "InMemoryRelation [message_id" in line}
    cached = {name.strip() for name in columns.split(",")}
    assert not cached & {"landing_file", "t_device", "received_at", "output", "properties"}, cached
    assert "sent_ms" in cached  # the latency's clock offset: receive - send
    assert {"message_id", "payload", "t_temperature", "_first_event", "_first_reading", "_first_reject"} <= cached
    scan = next(line for plan in plans.values() for line in plan.splitlines() if scans_events(line))
    assert "payload" in scan  # for the quarantine's rejects: nulled for the rest before the shuffle


def test_the_change_log_shuffles_no_reading_that_cannot_be_a_change(plans):
    """The set-point change log orders only the readings that can be changes (``setpoints._changes_batch``):
    each shuffle in its plan is fed by an aggregate, which shrinks the readings before it, or by the
    semi-join against the broadcast few buckets that picks those readings; none by the cached readings
    themselves (``lag`` over all of them shuffled and sorted every reading for ~1 change in 200)."""
    plan = plans["setpoint_changes"]
    lines = outside_caches(plan)
    feeds = []
    for number, line in enumerate(lines):
        if re.search(r"\bExchange hashpartitioning", line):
            feeds.append(next(text.lstrip(" +-:") for text in lines[number + 1:]
                              if not re.match(r"[ +\-:]*(Project|Filter) ", text)))
    assert len(feeds) >= 2, plan
    assert all(feed.startswith("HashAggregate(") or feed.startswith("BroadcastHashJoin") and "LeftSemi" in feed
               for feed in feeds), "\n".join(feeds)
    assert any(feed.startswith("BroadcastHashJoin") for feed in feeds), "\n".join(feeds)
    assert "SortAggregate" not in plan  # the summary is a hash aggregate, partial before its shuffle


def random_queue_samples(rng: random.Random, queues: int) -> list[dict]:
    rows = []
    for queue in range(queues):
        sent = depth = 0
        times = sorted(rng.sample(range(0, 40 * 60_000, 7_000), rng.randint(1, 30)))
        for time_ms in times:
            for _ in range(rng.choice([1, 1, 1, 2])):  # a metrics message landed twice
                if rng.random() < 0.1:
                    sent = rng.randint(0, 3)  # the gateway restarted
                else:
                    sent += rng.randint(0, 5)
                depth = max(0, depth + rng.randint(-3, 3))
                rows.append({
                    "gateway_id": f"gw{queue % 3}", "endpoint": rng.choice(["upstream", "alerts"]) if queue > 3 else "upstream",
                    "priority": queue, "sample_ms": T0 + time_ms, "sent": sent, "expired": rng.choice([None, 0, 1, 5]),
                    "dropped": rng.randint(0, 2), "retries": sent // 2, "dead_lettered": rng.choice([None, 0, 2]),
                    "depth": depth, "oldest_age_s": rng.choice([None, 0.0, 1.5, 30.25]),
                    "received_ms": T0 + time_ms + 500, "boot": "", "seq": T0 + time_ms,
                })
    return rows


def test_queue_counters_in_sql_equal_the_streaming_step(spark):
    import pandas as pd
    from pyspark.testing import assertDataFrameEqual

    from pipeline.jobs import delivery
    from pipeline.jobs.schemas import QUEUE_COUNTERS_OUTPUT

    rows = random_queue_samples(random.Random(17), 40)
    columns = "gateway_id string, endpoint string, priority int, sample_ms long, " + ", ".join(
        f"{name} long" for name in delivery.COUNTERS) + ", depth long, oldest_age_s double, received_ms long, " \
        "boot string, seq long"
    samples = spark.createDataFrame([tuple(row[c.split()[0]] for c in columns.split(", ")) for row in rows], columns)
    window_ms = 5 * 60_000
    got = delivery._queue_counters_batch(samples, window_ms)  # the output's computed columns (its one schema)

    fold = delivery.counters_fold(window_ms)
    frame = pd.DataFrame(rows)
    expected = []
    for key, group in frame.groupby(["gateway_id", "endpoint", "priority"], sort=True):
        out, _ = fold.step(key, None, fold.in_order(group[list(fold.columns)]))
        expected.append(out)
    want = pd.concat(expected, ignore_index=True)[QUEUE_COUNTERS_OUTPUT.names]
    assert len(want) > 100
    python_rows = [[None if pd.isna(value) else value.item() if hasattr(value, "item") else value for value in row]
                   for row in want.astype(object).itertuples(index=False)]
    want = spark.createDataFrame(python_rows, QUEUE_COUNTERS_OUTPUT.ddl)
    assertDataFrameEqual(got, want)


@pytest.mark.parametrize(("master", "cores"), [("local", 1), ("local[2]", 2), ("local[3,4]", 3), ("local[16]", 16)])
def test_a_local_master_gets_four_shuffle_partitions_per_core_and_adaptive_coalescing(master, cores):
    settings = local_settings(local_cores(master))
    assert settings["spark.sql.shuffle.partitions"] == str(4 * cores)
    assert settings["spark.sql.adaptive.enabled"] == "true"
    assert settings["spark.driver.memory"] == "4g"  # 1g ran out of memory deduplicating 10M events
    options = settings["spark.driver.extraJavaOptions"].split()
    assert "-XX:+UseParallelGC" in options  # 12-14 % less JVM CPU than G1
    assert {option.partition("=")[0] for option in options} >= {  # C2 for the per-row code only: JIT -48 %
        "-XX:Tier4InvocationThreshold", "-XX:Tier4MinInvocationThreshold", "-XX:Tier4CompileThreshold",
        "-XX:Tier4BackEdgeThreshold"}
    assert settings["spark.sql.adaptive.coalescePartitions.parallelismFirst"] == "false"  # merge the small ones
    assert settings["spark.sql.inMemoryColumnarStorage.compressed"] == "false"  # a third of filling the cache
    assert local_cores("local[*]") == os.cpu_count()


def test_the_local_java_options_start_this_machine_s_java():
    """A mistyped or retired -XX flag stops the JVM from starting, i.e. every local run of the pipeline."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    assert java, "no java on PATH (Spark needs one)"
    started = subprocess.run([java, *LOCAL_JAVA_OPTIONS.split(), "-version"], capture_output=True, text=True, timeout=60)
    assert started.returncode == 0, started.stderr


def test_windowed_outputs_group_by_a_long_window_start_not_a_timestamp_struct(plans):
    """``F.window`` builds a struct of two timestamps per input row (``precisetimestampconversion``) and
    filters the rows against it; the windowed outputs compute their window's start by arithmetic
    (``windows.window_start_ms``) and its timestamps once per output row."""
    for name in ("rollups", "delivery_latency", "queue_counters", "sla"):
        assert "precisetimestampconversion" not in plans[name].lower(), f"{name}:\n{plans[name]}"


def test_rollups_aggregate_before_their_one_shuffle(plans):
    """The readings reach the rollups in the order they were read (the deduplication shuffles only the ids
    that have copies), so one shuffle, a partial aggregate's by window and thermostat, is all they need:
    no repartition of the raw readings (``rollups.rollups``)."""
    exchanges = [line.strip(" +-:") for line in outside_caches(plans["rollups"]) if "Exchange" in line]
    assert len(exchanges) == 1, "\n".join(exchanges)
    assert re.match(r"Exchange hashpartitioning\(\w+#\d+L, gateway_id#\d+, device_id#\d+, \d+\)",
                    exchanges[0]), exchanges
