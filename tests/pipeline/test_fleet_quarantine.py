"""The streaming quarantine with several ingest writers: a malformed message and its redelivery land in two
writers' files, the first copy's file still open (its writer crashed) when a stream run reads the second.
Batch keeps the earliest received copy; streaming must write the same row, so it writes a reject only
once no earlier copy can still come (the receive horizon of ``ordered.py``), not in the first micro-batch
that brings one."""

import pytest

from pipeline.envelope import Incoming
from tests.pipeline import fleet_truth as truth
from tests.pipeline.pipeline_data import MINUTE, T0, reading
from tests.pipeline.test_fleet_truth import read, streamed


@pytest.mark.slow  # two streaming runs and a batch
def test_a_redelivered_reject_is_streamed_as_its_earliest_copy_whatever_writer_seals_first(spark, tmp_path):
    from pipeline.jobs import batch, stream
    from pipeline.jobs.settings import JobSettings
    from pipeline.landing import LandingWriter

    landing, checkpoint = tmp_path / "landing", str(tmp_path / "checkpoint")
    settings = JobSettings(str(landing), str(tmp_path / "out"))
    malformed = reading("gwQ", "t1", 500, 10, 0, 0, False, payload=b"[oops", content_type=None)
    copy = Incoming(malformed.topic, malformed.payload, malformed.received_ms + 20_000, malformed.user_properties,
                    None, True)
    on_time = [reading("gwQ", "t1", n + 1, n, 20.0, 21.0, False) for n in range(60)]

    def sent(message, writer):
        return truth.Sent(message, writer)

    truth.land_files(landing, [sent(malformed, "ingest-a")], "ingest-a", crash=True)
    truth.land_files(landing, [sent(copy, "ingest-b")] + [sent(m, "ingest-b") for m in on_time], "ingest-b")
    stream.run_stream(spark, settings, checkpoint, once=True, progress=lambda _: None)
    with truth.ingest_clock(T0 + 61 * MINUTE):
        assert LandingWriter(landing, "ingest-a").recovered
    truth.land_files(landing, [sent(reading("gwQ", "t1", 1000 + n, 60 + n, 20.0, 21.0, False), "ingest-b")
                               for n in range(30)], "ingest-b")
    stream.run_stream(spark, settings, checkpoint, once=True, progress=lambda _: None)

    streamed_rows = streamed(settings.out, "quarantine")
    batch.run_batch(spark, JobSettings(str(landing), str(tmp_path / "batch")), progress=lambda _: None)
    batch_rows = read(str(tmp_path / "batch"), "quarantine")
    columns = ["stage", "reason", "message_id", "received_ms", "payload"]
    assert streamed_rows[columns].to_dict("records") == batch_rows[columns].to_dict("records")
    assert streamed_rows["received_ms"].tolist() == [malformed.received_ms]  # before: the copy's, 20 s later
