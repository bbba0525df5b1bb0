"""Command line: ``python -m pipeline ingest | compact | batch | stream | report | package``.

Each subcommand is a thin wrapper: it turns arguments into the settings object of the module that does
the work, so the same work is reachable from tests and the benchmark without going through argv.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from pipeline.records import DEFAULT_BATCH_FILTER, DEFAULT_METRICS_FILTER, KINDS


def cmd_ingest(args: argparse.Namespace) -> int:
    from pipeline.ingest import IngestConfig, run_ingest
    from pipeline.records import DEFAULT_EVENTS_FILTER

    config = IngestConfig(
        host=args.host,
        port=args.port,
        landing=args.landing,
        group=args.group,
        topics=args.topic or (DEFAULT_EVENTS_FILTER, args.metrics_topic, args.batch_topic),
        metrics_filter=args.metrics_topic,
        batch_filter=args.batch_topic,
        username=args.username,
        password=args.password or os.environ.get("PIPELINE_MQTT_PASSWORD"),
        tls=args.tls,
        cafile=args.cafile,
        certfile=args.cert,
        keyfile=args.key,
        session_expiry_s=args.session_expiry,
        max_batch=args.max_batch,
        max_delay_s=args.max_delay_ms / 1000,
        roll_seconds=args.roll_seconds,
    )
    if args.client_id:
        config.client_id = args.client_id
    return run_ingest(config)


def _settings(args: argparse.Namespace):
    """The job's settings, checked (``JobSettings.check``: ValueError) before anything starts Spark."""
    from pipeline.jobs.settings import JobSettings

    settings = JobSettings(
        landing=args.landing, out=args.out, window=args.window, lateness=args.lateness,
        upstream_endpoint=args.upstream_endpoint, hil=getattr(args, "hil", None),
        received_from=getattr(args, "received_from", None), received_to=getattr(args, "received_to", None),
        late_days=args.late_days, bronze=args.bronze, compact=not getattr(args, "no_compact", False),
        idle_timeout=None if args.idle_timeout == "never" else args.idle_timeout,
    )
    settings.check()
    return settings


def _spark(args: argparse.Namespace, app_name: str):
    from pipeline.spark import session

    return session(args.master, app_name, args.shuffle_partitions)


def cmd_batch(args: argparse.Namespace) -> int:
    from pipeline.jobs.batch import run_batch

    spark = _spark(args, "pipeline-batch")
    try:
        run_batch(spark, args.settings)
    finally:
        spark.stop()
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    import time

    from pipeline.jobs.bronze import compact
    from pipeline.jobs.settings import default_bronze
    from pipeline.jobs.source import StreamOptions

    spark = _spark(args, "pipeline-compact")
    try:
        started = time.monotonic()
        bronze = args.bronze or default_bronze(args.landing)
        done = compact(spark, args.landing, bronze, StreamOptions(args.max_files_per_trigger))
        print(f"bronze: {done.input_rows} new landing lines in {done.micro_batches} micro-batches -> {bronze} "
              f"in {time.monotonic() - started:.1f}s")
    finally:
        spark.stop()
    return 0


def cmd_rebuild_bronze(args: argparse.Namespace) -> int:
    from pipeline.jobs.bronze import RebuildRefused, rebuild
    from pipeline.jobs.settings import default_bronze

    spark = _spark(args, "pipeline-rebuild-bronze")
    try:
        bronze = args.bronze or default_bronze(args.landing)
        aside, done = rebuild(spark, args.landing, bronze, args.kind, force=args.force)
        print(f"bronze {args.kind}: rebuilt from {done.input_rows} landing lines; the old table is at {aside}")
    except RebuildRefused as error:
        print(f"rebuild-bronze: {error}", file=sys.stderr)
        return 1
    finally:
        spark.stop()
    return 0


def cmd_stream(args: argparse.Namespace) -> int:
    from pipeline.jobs.source import StreamOptions
    from pipeline.jobs.stream import run_stream

    spark = _spark(args, "pipeline-stream")
    try:
        run_stream(spark, args.settings, args.checkpoint, StreamOptions(args.max_files_per_trigger),
                   once=args.once, trigger_seconds=args.trigger_seconds)
    except KeyboardInterrupt:
        pass
    finally:
        spark.stop()
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from pipeline.report import render_report

    page = render_report(args.out, args.report_dir, max_plots=args.max_plots)
    print(f"report: {page}")
    return 0


def cmd_package(args: argparse.Namespace) -> int:
    from pipeline.package import build_package

    archive, launcher = build_package(args.out)
    print(f"spark-submit --py-files {archive} {launcher} compact|batch|stream ...")
    return 0


def _spark_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--landing", required=True, help="landing zone folder or URI (what ingest writes)")
    parser.add_argument("--bronze", help="the bronze table, folder or URI (default LANDING/_bronze)")
    parser.add_argument("--master", help="Spark master (default local[*]; under spark-submit, its --master)")
    parser.add_argument("--shuffle-partitions", type=int, help="spark.sql.shuffle.partitions (default 8 on local)")


def _job_arguments(parser: argparse.ArgumentParser) -> None:
    _spark_arguments(parser)
    parser.add_argument("--out", required=True, help="folder or URI for the Parquet outputs")
    parser.add_argument("--window", default="5 minutes", help="window of rollups and SLA tables")
    parser.add_argument("--lateness", default="10 minutes",
                        help="streaming: how far behind its own key's latest event time a row may arrive")
    parser.add_argument("--late-days", type=int, default=1,
                        help="days after its event a message may still arrive (batch --from: rewrites that many "
                             "days before --from too; stream: how long counted ids are remembered)")
    parser.add_argument("--upstream-endpoint", default="upstream", help="metrics endpoint that feeds the cloud")
    parser.add_argument("--idle-timeout", default="30 minutes",
                        help="streaming: write a key's last windows once the fleet's receive time is this far past "
                             "the key's last message ('never': wait for the key's own later data)")


def _date(text: str) -> str:
    import datetime

    try:
        return datetime.date.fromisoformat(text).isoformat()
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date (YYYY-MM-DD): {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipeline", description=__doc__.splitlines()[0])
    parser.add_argument("--log-level", default="INFO", help="of the pipeline's own messages")
    sub = parser.add_subparsers(dest="command", required=True)

    ingest = sub.add_parser("ingest", help="land upstream MQTT messages in the landing zone")
    ingest.add_argument("--host", default="127.0.0.1")
    ingest.add_argument("--port", type=int, default=1883)
    ingest.add_argument("--landing", required=True, help="landing zone folder")
    ingest.add_argument("--client-id", help="MQTT client id, stable across restarts (default ingest-<hostname>)")
    ingest.add_argument("--group", default="ingest", help="shared subscription group")
    ingest.add_argument("--topic", action="append",
                        help="topic filter (repeatable; default events, metrics and batches)")
    ingest.add_argument("--metrics-topic", default=DEFAULT_METRICS_FILTER, help="filter that marks metrics")
    ingest.add_argument("--batch-topic", default=DEFAULT_BATCH_FILTER, help="filter that marks upstream batches")
    ingest.add_argument("--username", "-u")
    ingest.add_argument("--password", "-P", help="visible to every user through ps: prefer $PIPELINE_MQTT_PASSWORD")
    ingest.add_argument("--tls", action="store_true", help="connect with TLS, trusting the system's CAs")
    ingest.add_argument("--cafile", help="CA file the broker's certificate must chain to (turns TLS on)")
    ingest.add_argument("--cert", help="client certificate (PEM), for a broker that requires one (turns TLS on)")
    ingest.add_argument("--key", help="the client certificate's private key (PEM)")
    ingest.add_argument("--session-expiry", type=int, default=3600, help="seconds the broker keeps our session")
    ingest.add_argument("--max-batch", type=int, default=500, help="PUBLISHes per commit at most (a batch counts once)")
    ingest.add_argument("--max-delay-ms", type=float, default=50, help="longest wait before a commit")
    ingest.add_argument("--roll-seconds", type=float, default=60, help="seal landing files this old")
    ingest.set_defaults(func=cmd_ingest)

    compact = sub.add_parser("compact", help="move newly sealed landing files into the bronze table (Parquet)")
    _spark_arguments(compact)
    compact.add_argument("--max-files-per-trigger", type=int, help="landing files per micro-batch at most")
    compact.set_defaults(func=cmd_compact)

    rebuild = sub.add_parser("rebuild-bronze",
                             help="rebuild one kind of the bronze table from its landing files (a corrupt Parquet file)")
    _spark_arguments(rebuild)
    rebuild.add_argument("--kind", required=True, choices=KINDS)
    rebuild.add_argument("--force", action="store_true", help="even if landing files it was made of are gone")
    rebuild.set_defaults(func=cmd_rebuild_bronze)

    batch = sub.add_parser("batch", help="compact, then recompute the outputs from the bronze table (all, or some days)")
    _job_arguments(batch)
    batch.add_argument("--hil", help="folder of HIL timelines (*.jsonl) to analyse")
    batch.add_argument("--no-compact", action="store_true",
                       help="read the bronze table as it is (a running stream or a cron compact keeps it up to date)")
    batch.add_argument("--from", dest="received_from", type=_date,
                       help="first receive date (YYYY-MM-DD) to process; default: the whole landing zone")
    batch.add_argument("--to", dest="received_to", type=_date, help="last receive date (default: --from)")
    batch.set_defaults(func=cmd_batch)

    stream = sub.add_parser("stream", help="update the outputs incrementally (Structured Streaming)")
    _job_arguments(stream)
    stream.add_argument("--checkpoint", required=True, help="checkpoint folder (one subfolder per output)")
    stream.add_argument("--once", action="store_true", help="process what has landed, then stop")
    stream.add_argument("--trigger-seconds", type=float, default=60, help="micro-batch interval")
    stream.add_argument("--max-files-per-trigger", type=int, help="landing files per micro-batch at most")
    stream.set_defaults(func=cmd_stream)

    report = sub.add_parser("report", help="render an HTML page with plots of the outputs")
    report.add_argument("--out", required=True, help="the jobs' output folder")
    report.add_argument("--report-dir", required=True, help="where index.html and its images go")
    report.add_argument("--max-plots", type=int, default=12, help="per kind of plot (thermostats, gateways, runs)")
    report.set_defaults(func=cmd_report)

    package = sub.add_parser("package", help="write the zip and launcher that spark-submit ships to a cluster")
    package.add_argument("--out", required=True, help="folder for pipeline.zip and run_pipeline.py")
    package.set_defaults(func=cmd_package)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command in ("batch", "stream"):  # usage errors before Spark starts: milliseconds, no work done
        try:
            args.settings = _settings(args)
        except ValueError as error:
            parser.error(f"{args.command}: {error}")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("pipeline").setLevel(args.log_level.upper())  # not py4j's chatter
    return args.func(args)
