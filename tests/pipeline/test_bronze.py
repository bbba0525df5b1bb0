"""The bronze table: each landing line compacted once, ever, whatever the file holds and however the
compaction dies; the jobs read the table, never the JSON again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.landing import sealed_files
from pipeline.records import EVENTS
from testing.campaigns import campaign
from testing.waiting import wait_until
from tests.pipeline.pipeline_data import metrics, reading, write_batch
from tests.pipeline.test_batch_edges import assert_matches_duckdb

if TYPE_CHECKING:  # imported where used: every `make test` worker collects this folder and runs no Spark
    import pandas as pd

ROOT = Path(__file__).resolve().parents[2]


def landing_lines(landing: Path) -> list[bytes]:
    """Every line compaction must keep: the non-blank lines of every sealed file (``sealed_files``)."""
    return [line for kind in ("events", "metrics", "quarantine") for path in sealed_files(landing, kind)
            for line in path.read_bytes().split(b"\n") if line.strip(b" ")]


def bronze_rows(spark, path) -> pd.DataFrame:
    from pipeline.jobs import bronze

    return bronze.read(spark, str(path)).select(
        "kind", "message_id", "landing_error", "payload", "landing_file").toPandas()


def minutes(count: int, first_seq: int = 1):
    return [reading("gw1", "t1", first_seq + m, m, 20.0 + m / 10, 21.0, m % 2 == 0) for m in range(count)]


def test_each_landing_file_is_compacted_once_with_its_payload_parsed(spark, tmp_path):
    from pipeline.jobs import bronze

    landing, table = tmp_path / "landing", tmp_path / "bronze"
    write_batch(landing, minutes(5) + [metrics("gw1", 1, {5: {"sent": 3}})], 0)
    first = bronze.compact(spark, str(landing), str(table))
    again = bronze.compact(spark, str(landing), str(table))
    write_batch(landing, minutes(3, first_seq=100), 1)
    later = bronze.compact(spark, str(landing), str(table))

    assert (first.input_rows, again.input_rows, later.input_rows) == (6, 0, 3)
    rows = bronze_rows(spark, table)
    assert len(rows) == len(landing_lines(landing)) == 9
    assert rows["message_id"].is_unique
    assert sorted(p.name for p in table.iterdir()) == ["events", "firmware", "metrics", "quarantine"]
    assert sorted(p.name for p in (table / "events").iterdir()) == ["_checkpoint", "_spark_metadata", "date=2026-01-01"]
    typed = bronze.read(spark, str(table), EVENTS).where("message_id = 'gw1:3'").first()
    assert (typed.t_temperature, typed.t_set_point, typed.t_heater, typed.t_device, typed.reason) == (
        20.2, 21.0, True, "t1", None)
    sample = bronze.read(spark, str(table), "metrics").first()
    assert sample.metrics_doc.endpoints["upstream"]["5"].sent == 3


def test_batch_reads_the_bronze_table_not_the_landing_files(spark, batch_outputs, sample):
    """``batch_outputs`` ran on the bronze table compaction made of the sample, from a landing zone with no
    file in it: the rows it wrote equal DuckDB's computation over the sample's landing files, which it
    never saw (duckdb_reference.py)."""
    settings, counts = batch_outputs
    assert not [path for path in Path(settings.landing).rglob("*") if path.is_file()]
    assert counts["rollups"] > 0 and counts["queue_counters"] > 0 and counts["quarantine"] > 0
    assert_matches_duckdb(spark, settings, sample / "landing")


def test_many_small_landing_files_make_a_few_parquet_files(spark, tmp_path):
    """The ingest seals a file a minute per kind: a compaction over hundreds of small files packs them into
    a few read tasks, and so writes a few Parquet files per date, not one per landing file or handful."""
    from pipeline.jobs import bronze

    landing, table = tmp_path / "landing", tmp_path / "bronze"
    small_files = 400
    for index in range(small_files):
        write_batch(landing, minutes(1, first_seq=1 + index), index)
    assert len(sealed_files(landing, EVENTS)) == small_files
    bronze.compact(spark, str(landing), str(table))

    events = bronze.read(spark, str(table), EVENTS)
    assert events.count() == small_files
    written = events.inputFiles()  # the table's files, through the sink's log
    assert 1 <= len(written) <= 4, f"{len(written)} Parquet files"  # two cores: two tasks, or a few more


def test_a_record_with_bytes_that_are_not_utf8_is_kept_as_readable_text(spark, tmp_path):
    """Invalid UTF-8 inside a record's fields is decoded as U+FFFD by the parser: the
    record is kept as a record, and every reader of the table can decode its text."""
    from pipeline.jobs import bronze

    landing, table = tmp_path / "landing", tmp_path / "bronze"
    write_batch(landing, minutes(1), 0)
    (events_file,) = sealed_files(landing, EVENTS)
    record = json.loads(events_file.read_text())
    record["message_id"] = "gw1:bad-BYTE"
    events_file.with_name("part-bytes.jsonl").write_bytes(json.dumps(record).encode().replace(b"BYTE", b"\xff") + b"\n")
    bronze.compact(spark, str(landing), str(table))

    rows = bronze_rows(spark, table)  # through Arrow: any invalid UTF-8 would fail here
    assert rows["landing_error"].isna().all()
    assert sorted(rows["message_id"]) == ["gw1:1", "gw1:bad-\ufffd"]


def test_a_record_after_leading_whitespace_is_a_record_and_an_array_of_records_is_not(spark, tmp_path):
    """Only "{" opens a record: most lines start with it (a one-byte test), a record indented by spaces or
    tabs is still one (the regular expression the other lines go through), an array of records is a bad line."""
    from pipeline.jobs import bronze

    landing, table = tmp_path / "landing", tmp_path / "bronze"
    write_batch(landing, minutes(1), 0)
    (events_file,) = sealed_files(landing, EVENTS)
    record = json.loads(events_file.read_text())
    lines = {}
    for number, indent in enumerate([" ", "\t", " \t "]):
        record["message_id"] = f"gw1:indented-{number}"
        lines[record["message_id"]] = indent + json.dumps(record)
    array = "[" + json.dumps(record) + "]"
    events_file.with_name("part-indented.jsonl").write_text("\n".join([*lines.values(), array]) + "\n")
    bronze.compact(spark, str(landing), str(table))

    rows = bronze_rows(spark, table)
    records = rows[rows["landing_error"].isna()]
    assert sorted(records["message_id"]) == sorted(["gw1:1", *lines])
    (bad,) = rows[rows["landing_error"].notna()].itertuples()
    assert (bad.landing_error, bad.payload) == (bronze.NOT_A_RECORD, array)


def test_the_table_keeps_no_statistics_of_raw_payloads(spark, tmp_path):
    """The raw payload is written without min/max statistics, which cost a comparison per row and serve no
    filter; the typed columns keep theirs."""
    import pyarrow.parquet as pq

    from pipeline.jobs import bronze

    landing, table = tmp_path / "landing", tmp_path / "bronze"
    write_batch(landing, minutes(5), 0)
    bronze.compact(spark, str(landing), str(table))
    (written,) = bronze.read(spark, str(table), EVENTS).inputFiles()
    metadata = pq.ParquetFile(written.removeprefix("file://")).metadata.row_group(0)
    columns = {metadata.column(n).path_in_schema: metadata.column(n) for n in range(metadata.num_columns)}
    assert columns["payload"].statistics is None or not columns["payload"].statistics.has_min_max
    assert columns["received_ms"].statistics.has_min_max


# A landing line as anything a file can hold: any text or bytes but the line breaks (a "\r" is one for
# Spark's line reader, as for Hadoop's), sometimes a real record cut short, sometimes a JSON array.
RECORD = json.dumps({"message_id": "gw1:1", "received_ms": 1_767_225_601_000, "payload": "{}"})
LINE = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\n\r"), max_size=60).map(str.encode),
    st.binary(max_size=60).map(lambda raw: raw.replace(b"\n", b"").replace(b"\r", b"")),
    st.integers(0, len(RECORD)).map(lambda cut: RECORD[:cut].encode()),
    st.sampled_from([b"[]", b"[" + RECORD.encode() + b"," + RECORD.encode() + b"]", b"\t", b"{}", b"null"]),
)


@campaign(2, deadline=None)
@given(files=st.lists(st.lists(LINE, max_size=30), min_size=4, max_size=12))
def test_any_landing_file_content_is_kept_line_for_line_never_fatal(spark, tmp_path_factory, files):
    """Hostile landing files: whatever a sealed file holds, compaction keeps each of its non-blank lines as
    one row - a record, or a bad line with its text, readable by pyarrow - and never stops.

    A compaction costs the same for one file or a dozen (seconds of a streaming query's start, commit and
    stop; the lines are nothing), so an example is many files: the simplest example (hypothesis' first,
    empty files) and one drawn at random of 4-12 files, as many as five examples of 1-3 files held."""
    from pipeline.jobs import bronze

    landing, table = tmp_path_factory.mktemp("landing"), tmp_path_factory.mktemp("bronze")
    write_batch(landing, minutes(3), 0)
    (events_file,) = sealed_files(landing, "events")
    for number, lines in enumerate(files):
        junk = events_file.with_name(f"part-junk-{number}.jsonl")
        junk.write_bytes(b"".join(line + b"\n" for line in lines))
    bronze.compact(spark, str(landing), str(table))

    rows = bronze_rows(spark, table)
    expected = landing_lines(landing)
    assert len(rows) == len(expected)  # a row per line: none lost, none split, none merged
    assert rows["message_id"].dropna().str.startswith("gw1:").all()  # records only from real records
    bad = rows[rows["landing_error"].notna()]
    assert bad["payload"].notna().all()
    kept = Counter(bad["payload"])
    for line, count in Counter(line for lines in files for line in lines if line.strip(b" ")).items():
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:  # Spark decodes it with replacement characters: counted above
            continue
        if text != RECORD:  # a bad line, raw, once per line
            assert kept[text] == count, text


@pytest.mark.slow  # two Spark processes: a minute or two on the 2-core machine
@pytest.mark.timeout(600)
def test_a_compaction_killed_mid_run_and_restarted_compacts_each_line_exactly_once(spark, tmp_path):
    from pyspark.sql import functions as F

    from pipeline.jobs import bronze

    landing, table = tmp_path / "landing", tmp_path / "bronze"
    files = 10
    for index in range(files):
        write_batch(landing, minutes(20, first_seq=1 + 100 * index), index)
    command = [sys.executable, "-m", "pipeline", "compact", "--landing", str(landing), "--bronze", str(table),
               "--master", "local[1]", "--max-files-per-trigger", "1"]
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    commits = table / "events" / "_checkpoint" / "commits"
    offsets = table / "events" / "_checkpoint" / "offsets"

    def planned(batch: int) -> bool:
        return (offsets / str(batch)).exists()

    killed = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        wait_until(lambda: planned(3) or killed.poll() is not None, timeout=300, what="the fourth micro-batch")
        os.killpg(killed.pid, signal.SIGKILL)  # the driver JVM and its Python: mid micro-batch 3
    finally:
        killed.wait(30)
    done_before = len([p for p in commits.iterdir() if p.name.isdigit()]) if commits.exists() else 0
    assert 0 < done_before < files, "the kill did not land mid-run"

    finished = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr[-5000:]
    rows = bronze_rows(spark, table)
    landed = [json.loads(line)["message_id"] for line in landing_lines(landing)]
    assert len(landed) == files * 20
    assert sorted(rows["message_id"]) == sorted(landed)  # each once: none lost, none twice
    parquet = [p for p in table.rglob("*.parquet")]
    assert rows.groupby("landing_file").size().eq(20).all()
    assert len(parquet) >= rows["landing_file"].nunique()  # a killed attempt's files may lie beside, unlisted
    assert bronze.read(spark, str(table)).where(F.col("landing_error").isNotNull()).count() == 0
