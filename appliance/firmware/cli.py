"""``appliance firmware publish|status|public-key``: over-the-air updates of the thermostats from a shell.

``publish`` stores a bundle in the gateway's data directory (verified, optionally signed) and writes the
desired version into the state store keys the thermostats watch; ``status`` listens to the thermostats'
telemetry and prints, per thermostat, the version it runs and the state of its update. Output is one JSON
object per line on stdout, errors on stderr. Exit status: 0 done, 1 refused (a bad bundle, an unknown
version), 2 the state store answered ``-ERR``, 3 no connection or no answer in time.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from appliance.cli_args import add_config_arguments, config_from_args
from appliance.firmware.protocol import THERMOSTAT_NAME, desired_key, group_key, group_members
from appliance.firmware.repository import (
    BundleError,
    Repository,
    device_manifest,
    load_signing_key,
    public_key_hex,
    read_bundle,
    sign,
)
from appliance.statestore.cli import (
    EXIT_CONNECTION,
    EXIT_NOT_DONE,
    EXIT_OK,
    EXIT_SERVICE_ERROR,
    add_connection_arguments,
)
from appliance.statestore.client import (
    ServiceError,
    StateStoreClient,
    StateStoreClientError,
    StatusError,
)

TELEMETRY_TOPIC = "devices/+/messages/events/data"
UPDATE_TOPIC = "devices/+/messages/events/update"  # the updater's status (its own output)


def register(subparsers: Any) -> None:
    firmware = subparsers.add_parser("firmware", help="over-the-air updates of the thermostats")
    verbs = firmware.add_subparsers(dest="verb", required=True)

    publish = verbs.add_parser("publish", help="store a firmware bundle and set the version thermostats should run")
    publish.add_argument("bundle", nargs="?", type=Path, help="the .zip from images/firmware/build.py"
                         " (omit it to point thermostats at a version already stored)")
    publish.add_argument("--version", help="the version to publish (must match the bundle's)")
    publish.add_argument("--target", action="append", default=[], metavar="THERMOSTAT",
                         help="a thermostat that should run it (repeatable)")
    publish.add_argument("--group", action="append", default=[], metavar="GROUP",
                         help="a group whose thermostats should run it (repeatable): the state store key"
                         " group\\GROUP\\thermostats lists them")
    publish.add_argument("--key", type=Path, help="ECDSA P-256 private key (PEM) to sign the manifest with")
    add_gateway_arguments(publish)
    publish.set_defaults(handler=cmd_publish)

    status = verbs.add_parser("status", help="each thermostat's running version and update state (from telemetry)")
    status.add_argument("--wait", type=float, default=12.0, metavar="S",
                        help="listen to telemetry this long (default 12 s: thermostats report every 10 s)")
    add_gateway_arguments(status)
    status.set_defaults(handler=cmd_status)

    key = verbs.add_parser("public-key", help="print the public key of a signing key, for the devices' ota.key")
    key.add_argument("key", type=Path)
    key.set_defaults(handler=cmd_public_key)


def add_gateway_arguments(parser: argparse.ArgumentParser) -> None:
    add_connection_arguments(parser)
    add_config_arguments(parser, listen=False)


def repository(args: argparse.Namespace) -> Repository:
    return Repository(config_from_args(args).data_dir / "firmware")


def emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def fail(message: str, status: int = EXIT_NOT_DONE) -> int:
    print(f"appliance firmware: {message}", file=sys.stderr)
    return status


def store_client(args: argparse.Namespace) -> StateStoreClient:
    return StateStoreClient(args.host, args.port, args.client_id, username=args.username, password=args.password,
                            timeout=args.timeout)


def cmd_publish(args: argparse.Namespace) -> int:
    repo = repository(args)
    for name in args.target + args.group:
        if not THERMOSTAT_NAME.fullmatch(name):
            return fail(f"{name!r} is not a thermostat or group name (1-64 of A-Za-z0-9._-)")
    try:
        if args.bundle is not None:
            bundle = read_bundle(args.bundle)
            if args.version is not None and args.version != bundle.version:
                return fail(f"{args.bundle} is version {bundle.version}, not {args.version}")
            signature = sign(device_manifest(bundle), load_signing_key(args.key)) if args.key else None
            path = repo.store(bundle, signature)
            version = bundle.version
            emit(stored=version, path=str(path), files=len(bundle.modules), signed=signature is not None)
        elif args.key is not None:
            return fail("--key signs a bundle being published: give the bundle")
        elif args.version is None:
            return fail("give a bundle, or --version of one already published")
        elif args.version not in repo.versions():
            return fail(f"version {args.version} is not stored here (published: {', '.join(repo.versions()) or 'none'})")
        else:
            version = args.version
    except BundleError as exc:
        return fail(str(exc))
    if not args.target and not args.group:
        return EXIT_OK
    client = store_client(args)
    try:
        client.connect()
        targets = list(args.target)
        for group in args.group:
            members = client.get(group_key(group)).value
            if members is None:
                return fail(f"group {group}: the state store has no key {group_key(group)!r} listing its thermostats")
            try:
                targets += group_members(members)
            except ValueError as exc:
                return fail(f"group {group}: {exc}")
        for thermostat in dict.fromkeys(targets):
            key = desired_key(thermostat)
            result = client.set(key, version)
            emit(key=key, version=version, applied=result.applied)
    except ServiceError as exc:
        return fail(f"-ERR {exc.message}", EXIT_SERVICE_ERROR)
    except StatusError as exc:
        return fail(str(exc), EXIT_SERVICE_ERROR)
    except (StateStoreClientError, OSError) as exc:
        return fail(f"cannot set the desired version through {args.host}:{args.port}: {exc}", EXIT_CONNECTION)
    finally:
        client.close()
    return EXIT_OK


def collect_telemetry(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The latest telemetry of every thermostat heard within ``args.wait`` seconds."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    latest: dict[str, dict[str, Any]] = {}
    lock = threading.Lock()

    def on_message(client: Any, userdata: Any, message: Any) -> None:
        try:
            data = json.loads(message.payload)
        except ValueError:
            return
        if isinstance(data, dict) and isinstance(data.get("device"), str):
            with lock:
                latest[data["device"]] = data

    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    if args.username is not None:
        client.username_pw_set(args.username, args.password)
    client.on_message = on_message
    client.on_connect = lambda c, *rest: c.subscribe([(TELEMETRY_TOPIC, 0), (UPDATE_TOPIC, 0)])
    client.connect(args.host, args.port)
    client.loop_start()
    try:
        time.sleep(args.wait)  # listening for this long is the command's whole point
    finally:
        client.loop_stop()
        client.disconnect()
    with lock:
        return dict(latest)


def cmd_status(args: argparse.Namespace) -> int:
    try:
        emit(stored=repository(args).versions())
        seen = collect_telemetry(args)
    except OSError as exc:
        return fail(f"cannot reach the gateway at {args.host}:{args.port}: {exc}", EXIT_CONNECTION)
    desired: dict[str, str | None] = {}
    if seen:
        client = store_client(args)
        try:
            client.connect()
            for device in seen:
                value = client.get(desired_key(device)).value
                desired[device] = value.decode("utf-8", "replace") if value is not None else None
        except (StateStoreClientError, OSError) as exc:
            print(f"appliance firmware: desired versions unknown ({exc})", file=sys.stderr)
        finally:
            client.close()
    for device, data in sorted(seen.items()):
        emit(device=device, running=data.get("fw"), desired=desired.get(device), update=data.get("update"),
             registered=data.get("registered"), mem_free=data.get("mem_free"), mem_largest=data.get("mem_largest"))
    return EXIT_OK


def cmd_public_key(args: argparse.Namespace) -> int:
    try:
        emit(key=public_key_hex(load_signing_key(args.key)))
    except BundleError as exc:
        return fail(str(exc))
    return EXIT_OK
