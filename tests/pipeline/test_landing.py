"""The landing zone on disk: partitions, sealing, and recovery after a crash mid-write."""

import os
import time

from pipeline.landing import (
    INPROGRESS_SUFFIX,
    LandingWriter,
    partition_of,
    read_records,
    sealed_files,
)
from tests.pipeline.pipeline_data import T0


def record(received_ms, n=0):
    return {"message_id": f"m{n}", "received_ms": received_ms}


def test_partition_is_the_utc_date_and_hour_of_receipt():
    assert partition_of(T0 - 1) == ("2025-12-31", "23")
    assert partition_of(T0) == ("2026-01-01", "00")


def now_ms():
    return int(time.time() * 1000)


def test_records_are_invisible_until_sealed(tmp_path):
    writer = LandingWriter(tmp_path, "ingest-a")
    writer.append("events", record(now_ms(), 1))
    writer.commit()
    assert sealed_files(tmp_path, "events") == []
    assert len(list(tmp_path.glob(f"events/*/*/.part-ingest-a-*{INPROGRESS_SUFFIX}"))) == 1
    writer.close()
    assert [r["message_id"] for r in read_records(tmp_path, "events")] == ["m1"]
    assert list(tmp_path.glob(f"events/*/*/*{INPROGRESS_SUFFIX}")) == []


def test_commit_seals_past_hours_into_their_partitions(tmp_path):
    writer = LandingWriter(tmp_path, "ingest-a")
    writer.append("events", record(T0, 1))
    writer.append("events", record(T0 - 1, 2))
    writer.commit()  # those hours are over: nothing more can land in them from this writer
    files = sealed_files(tmp_path, "events")
    assert [f.parent.relative_to(tmp_path).as_posix() for f in files] == [
        "events/date=2025-12-31/hour=23", "events/date=2026-01-01/hour=00"]
    assert sorted(r["message_id"] for r in read_records(tmp_path, "events")) == ["m1", "m2"]


def test_open_file_is_sealed_when_old_enough(tmp_path):
    writer = LandingWriter(tmp_path, "w", roll_seconds=60)
    writer.append("metrics", record(now_ms()))
    writer.roll_due(now_s=time.time() + 1)
    assert sealed_files(tmp_path, "metrics") == []
    writer.roll_due(now_s=time.time() + 61)
    assert len(sealed_files(tmp_path, "metrics")) == 1


def test_recovery_keeps_whole_lines_and_seals_only_its_own_files(tmp_path):
    writer = LandingWriter(tmp_path, "ingest-a")
    writer.append("events", record(now_ms(), 1))
    writer.commit()
    (path,) = tmp_path.glob(f"events/*/*/*{INPROGRESS_SUFFIX}")
    with path.open("ab") as handle:  # the process died in the middle of the next line
        handle.write(b'{"message_id": "m2", "recei')
    other = path.with_name(f".part-ingest-b-1-000001{INPROGRESS_SUFFIX}")
    other.write_bytes(b'{"message_id": "b"}\n')
    del writer  # never closed

    recovered = LandingWriter(tmp_path, "ingest-a").recovered
    assert len(recovered) == 1
    assert [r["message_id"] for r in read_records(tmp_path, "events")] == ["m1"]
    assert other.exists()  # another process's file: not ours to seal
    assert not path.exists()


def test_empty_file_is_removed_not_sealed(tmp_path):
    writer = LandingWriter(tmp_path, "w")
    writer._file_for("events", "2026-01-01", "00")
    writer.close()
    assert not any(name for _, _, names in os.walk(tmp_path) for name in names)
