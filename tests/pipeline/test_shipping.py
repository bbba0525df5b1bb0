"""Shipping the landing zone to storage the ingest cannot write to (docs/pipeline.md, "Getting the landing
zone there"): the documented filter selects the sealed files and never an open one.

``aws s3 sync/mv SRC DST --exclude '*' --include '*.jsonl'`` decides per file path relative to SRC, with
``fnmatch`` (``*`` crosses ``/``), the last matching filter winning; ``ship`` below applies that rule and
copies to a local folder standing in for the bucket, which the jobs' reader then sees as the ingest wrote it.
"""

import fnmatch
import shutil
import time
from pathlib import Path

from pipeline.landing import (
    INPROGRESS_SUFFIX,
    LandingWriter,
    read_records,
    sealed_files,
)
from pipeline.records import KINDS
from tests.pipeline.pipeline_data import T0

DOCUMENTED_FILTERS = [("exclude", "*"), ("include", "*.jsonl")]


def shipped(relative: str) -> bool:
    decision = True
    for verdict, pattern in DOCUMENTED_FILTERS:
        if fnmatch.fnmatch(relative, pattern):
            decision = verdict == "include"
    return decision


def ship(source: Path, target: Path) -> list[str]:
    names = sorted(path.relative_to(source).as_posix() for path in source.rglob("*") if path.is_file())
    for name in filter(shipped, names):
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / name, target / name)
    return [name for name in names if shipped(name)]


def test_the_documented_filter_ships_every_sealed_file_and_never_an_open_one(tmp_path):
    landing, bucket = tmp_path / "landing", tmp_path / "bucket"
    sealed = LandingWriter(landing, "ingest-a")
    for n, kind in enumerate(KINDS):
        sealed.append(kind, {"message_id": f"a{n}", "received_ms": T0 + n})
    sealed.close()
    still_open = LandingWriter(landing, "ingest-b", roll_seconds=3600)
    still_open.append("events", {"message_id": "b1", "received_ms": int(time.time() * 1000)})  # this hour
    still_open.commit()  # durable, acknowledged, and not sealed: the ingest's write-ahead log
    assert list(landing.rglob(f"*{INPROGRESS_SUFFIX}"))

    names = ship(landing, bucket)

    assert names == sorted(path.relative_to(landing).as_posix() for kind in KINDS
                           for path in sealed_files(landing, kind))
    assert not list(bucket.rglob(f"*{INPROGRESS_SUFFIX}")) and not list(bucket.rglob(".*"))
    for kind in KINDS:
        assert read_records(bucket, kind) == read_records(landing, kind)
    still_open.close()  # sealed now: the next run ships it
    ship(landing, bucket)
    assert [record["message_id"] for record in read_records(bucket, "events")] == ["a0", "b1"]
