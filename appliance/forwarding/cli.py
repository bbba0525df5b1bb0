"""``appliance routes check | reload | show | dead-letters``.

``check`` validates a manifest offline (and, with ``--message``, shows which routes a sample message
takes). ``reload`` asks the running gateway - found through ``gateway.json`` in its data dir - to reload
its manifest (SIGHUP) and reports the outcome the gateway writes to ``forwarding-routes.json``; ``show``
prints that file: the routes actually running. ``dead-letters`` lists, one JSON object a line, the messages
an endpoint kept refusing (docs/forwarding.md), newest last; ``--clear`` removes them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from appliance import run_state
from appliance.blocking_clock import SYSTEM_CLOCK
from appliance.cli_args import add_config_arguments, config_from_args
from appliance.forwarding.conditions import DictMessage
from appliance.forwarding.manifest import ManifestError, load_manifest
from appliance.forwarding.messages import message_from_publish
from appliance.forwarding.queues import MessageStore
from appliance.forwarding.routes import RoutedMessage, explain
from appliance.forwarding.service import STATUS_FILE, STORE_FILE


def _data_dir(args: argparse.Namespace) -> Path:
    return config_from_args(args).data_dir


def sample_message(sample: dict[str, Any]) -> RoutedMessage:
    """A ``--message`` sample: ``{"topic": ..., "properties": {...}, "content_type": ..., "body": ...}`` is
    read as a device publish (the topic's property bag included); without ``topic``, ``source``,
    ``properties`` and ``system`` are taken as they are."""
    body = sample.get("body")
    payload = b"" if body is None else body.encode() if isinstance(body, str) else json.dumps(body).encode()
    if "topic" in sample:
        content_type = sample.get("content_type", "application/json" if body is not None and not isinstance(body, str) else None)
        message = message_from_publish(sample["topic"], payload, list(sample.get("properties", {}).items()), content_type)
        if message is None:
            raise ValueError(f"{sample['topic']!r} is not a telemetry topic (docs/message-format.md)")
        return message
    return DictMessage(
        sample.get("properties", {}),
        {k.lstrip("$"): v for k, v in sample.get("system", {}).items()},
        payload,
        "application/json" if body is not None else None,
        sample.get("source", "/messages/events"),
    )


def cmd_check(args: argparse.Namespace) -> int:
    try:
        manifest = load_manifest(Path(args.manifest))
    except ManifestError as exc:
        print(f"appliance routes: {exc}", file=sys.stderr)
        return 1
    print(f"{args.manifest}: {len(manifest.routes)} routes, global TTL {manifest.global_ttl_s}s")
    for route in manifest.routes:
        ttl, origin = manifest.ttl_origin(route)
        print(f"  {route.name}: priority {route.priority}, TTL {ttl}s ({origin}) -> {route.endpoint.id}: {route.text}")
    if args.message:
        try:
            message = sample_message(json.loads(args.message))
        except (ValueError, TypeError, AttributeError) as exc:
            print(f"appliance routes: --message: {exc}", file=sys.stderr)
            return 1
        results = manifest.evaluator().evaluate(message)
        for result in results:
            print(f"  routed: {result.endpoint.id} priority {result.priority} TTL {result.ttl_s}s")
        if not results:
            print("  routed nowhere: no route takes this message")
        for route in manifest.routes:
            reason = explain(route, message)
            if reason is not None:
                print(f"  not {route.name}: {reason}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    status_file = _data_dir(args) / STATUS_FILE
    try:
        sys.stdout.write(status_file.read_text())
    except OSError as exc:
        print(f"appliance routes: no running gateway status at {status_file}: {exc.strerror}", file=sys.stderr)
        return 1
    return 0


def cmd_dead_letters(args: argparse.Namespace) -> int:
    path = _data_dir(args) / STORE_FILE
    if not path.exists():
        print(f"appliance routes: no forwarding store at {path}", file=sys.stderr)
        return 1
    store = MessageStore(path)
    try:
        if args.clear:
            print(f"removed {store.clear_dead_letters()} dead letters", file=sys.stderr)
            return 0
        for letter in store.dead_letters(args.limit):
            m = letter.message
            print(json.dumps({
                "seq": letter.seq, "endpoint": letter.endpoint, "priority": letter.priority, "reason": letter.reason,
                "enqueued_ms": letter.enqueued_ms, "dead_ms": letter.dead_ms, "topic": m.topic, "device_id": m.device_id,
                "output": m.output, "content_type": m.content_type, "payload_bytes": len(m.payload),
            }))
    finally:
        store.close()
    return 0


def cmd_reload(args: argparse.Namespace) -> int:
    data_dir = _data_dir(args)
    status_file = data_dir / STATUS_FILE
    running = run_state.running(data_dir)
    try:
        if running is None:
            raise OSError(f"no live process in {run_state.FILE_NAME}")
        pid = running.pid
        before = json.loads(status_file.read_text())["updated_ms"]
        os.kill(pid, signal.SIGHUP)
    except (OSError, ValueError, KeyError) as exc:
        print(f"appliance routes: no running gateway with forwarding in {data_dir}: {exc}", file=sys.stderr)
        return 1
    deadline = SYSTEM_CLOCK.monotonic() + args.timeout
    while SYSTEM_CLOCK.monotonic() < deadline:
        try:
            status = json.loads(status_file.read_text())
        except (OSError, ValueError):
            status = {}
        if status.get("updated_ms", before) != before:
            if status.get("error"):
                print(f"appliance routes: reload rejected, previous routes still running: {status['error']}", file=sys.stderr)
                return 1
            print(f"reloaded: {len(status['routes'])} routes")
            return 0
        SYSTEM_CLOCK.sleep(0.05)
    print(f"appliance routes: the gateway (pid {pid}) did not report a reload within {args.timeout}s", file=sys.stderr)
    return 1


def register(subparsers: Any) -> None:
    routes = subparsers.add_parser("routes", help="store-and-forward routes: check, reload, show")
    sub = routes.add_subparsers(dest="routes_command", required=True)
    check = sub.add_parser("check", help="validate a $edgeHub manifest")
    check.add_argument("manifest")
    check.add_argument("--message", help='JSON sample: {"topic": ..., "properties": {...}, "body": ...} (as a device publishes) '
                       'or {"source": ..., "properties": {...}, "system": {...}, "body": ...}')
    check.set_defaults(handler=cmd_check)
    for name, handler, text in (
        ("reload", cmd_reload, "reload the running gateway's manifest"),
        ("show", cmd_show, "print the running routes"),
        ("dead-letters", cmd_dead_letters, "list the messages an endpoint kept refusing"),
    ):
        command = sub.add_parser(name, help=text)
        add_config_arguments(command, listen=False)
        if name == "reload":
            command.add_argument("--timeout", type=float, default=10.0)
        if name == "dead-letters":
            command.add_argument("--limit", type=int, default=100, help="the newest N (default 100)")
            command.add_argument("--clear", action="store_true", help="remove them all (once handled; "
                                 "`appliance doctor` reports dead letters until then)")
        command.set_defaults(handler=handler)
