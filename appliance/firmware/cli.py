"""``appliance firmware publish|sign|status|public-key``: over-the-air updates of the thermostats from a shell.

``publish`` stores a bundle in the gateway's data directory (verified, optionally signed) and writes the
desired version into the state store keys the thermostats watch; ``status`` listens to the thermostats'
telemetry and prints, per thermostat, the version it runs and the state of its update. Output is one JSON
object per line on stdout, errors on stderr. Exit status: 0 done, 1 refused (a bad bundle, an unknown
version, a signature the fleet cannot verify, a stored version's signature that would change), 2 the state
store answered ``-ERR`` (or bad connection settings), 3 no connection or no answer in time.

A publish is all or nothing. Everything that can be refused is checked before anything changes: the
bundle, its signature against the fleet's keys (``[firmware] keys`` of the gateway's config: a version
they cannot verify every thermostat would refuse, so it is refused here unless ``--force``), and the state
store (connected, every group resolved, each target's current desired version read). Then the version is
stored and the targets pointed at it; if that fails half way, the keys already written get their old
values back and a version this publish stored is taken back. The state store is reached where the
gateway's config says, with credentials from the environment or a file (``appliance/tool_connection.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.blocking_clock import SYSTEM_CLOCK
from appliance.cli_args import add_config_arguments, config_from_args
from appliance.firmware.protocol import THERMOSTAT_NAME, desired_key, group_key, group_members
from appliance.firmware.repository import Bundle, BundleError, Repository, device_manifest, read_bundle
from appliance.firmware.signing import (
    SigningError,
    load_signing_key,
    public_key_hex,
    sign,
    signer_among,
    verifies,
)
from appliance.gateway_config import GatewayConfig
from appliance.statestore.cli import (
    EXIT_CONNECTION,
    EXIT_NOT_DONE,
    EXIT_OK,
    EXIT_SERVICE_ERROR,
    store_client,
)
from appliance.statestore.client import (
    ServiceError,
    StateStoreClient,
    StateStoreClientError,
    StatusError,
)
from appliance.tool_connection import ConnectionSettings, add_connection_arguments, connection_from_args

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
    publish.add_argument("--force", action="store_true",
                         help="publish even if no key of the config's [firmware] keys verifies it (thermostats"
                         " holding those keys will refuse it)")
    add_connection_arguments(publish)
    publish.set_defaults(handler=cmd_publish)

    signer = verbs.add_parser("sign", help="replace the signature of a stored version (deliberately: a version's"
                              " signature never changes through publish)")
    signer.add_argument("version")
    signer.add_argument("--key", type=Path, required=True, help="ECDSA P-256 private key (PEM)")
    signer.add_argument("--force", action="store_true", help="even if no key of [firmware] keys is this one")
    add_config_arguments(signer, listen=False)
    signer.set_defaults(handler=cmd_sign)

    status = verbs.add_parser("status", help="each thermostat's running version and update state (from telemetry)")
    status.add_argument("--wait", type=float, default=12.0, metavar="S",
                        help="listen to telemetry this long (default 12 s: thermostats report every 10 s)")
    add_connection_arguments(status)
    status.set_defaults(handler=cmd_status)

    key = verbs.add_parser(
        "public-key", help="print the public key of a signing key: the thermostats' config field update.key"
        " (device.json: {\"update\": {\"key\": \"<hex>\"}}) and the gateway's [firmware] keys",
        description="Print the public key (hex of X||Y) of an ECDSA P-256 signing key. It goes into each"
        " thermostat's config as update.key (device.json: {\"update\": {\"key\": \"<hex>\"}}): a thermostat with"
        " update.key installs only versions whose manifest.sig that key verifies. Put it in the gateway's"
        " config too, [firmware] keys = [\"<hex>\"], so publish refuses what the thermostats would.")
    key.add_argument("key", type=Path, help="the private key (PEM)")
    key.set_defaults(handler=cmd_public_key)


def repository(config: GatewayConfig) -> Repository:
    return Repository(config.data_dir / "firmware")


def emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def fail(message: str, status: int = EXIT_NOT_DONE) -> int:
    print(f"appliance firmware: {message}", file=sys.stderr)
    return status


@dataclass(frozen=True, slots=True)
class Release:
    """What a publish would store: the version, and its signature (new, or the one already stored)."""

    version: str
    manifest: bytes
    signature: bytes | None
    bundle: Bundle | None  # None: the version is already stored


def release_to_publish(args: argparse.Namespace, repo: Repository) -> Release:
    """The version and signature to publish; ``BundleError``/``SigningError`` say why not. A stored version
    keeps its signature: publishing it again signed by the same key changes nothing, by another key (or
    signed where it was not) is refused."""
    key = load_signing_key(args.key) if args.key is not None else None
    if args.bundle is None:
        if key is not None:
            raise BundleError("--key signs a bundle being published: give the bundle (or use `appliance firmware sign`)")
        if args.version is None:
            raise BundleError("give a bundle, or --version of one already published")
        manifest = repo.manifest(args.version)
        if manifest is None:
            raise BundleError(f"version {args.version} is not stored here (published: {', '.join(repo.versions()) or 'none'})")
        return Release(args.version, manifest, repo.signature(args.version), None)
    bundle = read_bundle(args.bundle)
    if args.version is not None and args.version != bundle.version:
        raise BundleError(f"{args.bundle} is version {bundle.version}, not {args.version}")
    manifest = device_manifest(bundle)
    if bundle.version not in repo.versions():
        return Release(bundle.version, manifest, sign(manifest, key) if key is not None else None, bundle)
    stored = repo.signature(bundle.version)
    if key is None or (stored is not None and verifies(manifest, stored, key.public_key())):
        return Release(bundle.version, manifest, stored, bundle)
    raise BundleError(
        f"version {bundle.version} is already published {'signed by another key' if stored else 'unsigned'}; the"
        " signature is part of a version and never changes (a thermostat holding the first key would refuse it):"
        f" build a new version, or replace it deliberately with `appliance firmware sign {bundle.version} --key ...`")


def fleet_verdict(config: GatewayConfig, release: Release) -> tuple[str | None, str | None]:
    """(the fleet key that verifies the release, or None; why the fleet cannot verify it, or None).
    Without ``[firmware] keys`` the gateway does not know what the thermostats hold: (None, None)."""
    keys = config.firmware.keys
    if not keys:
        return None, None
    if release.signature is None:
        return None, (f"version {release.version} is not signed, and the fleet ([firmware] keys of {config.source})"
                      " installs only signed versions: publish it with --key")
    signer = signer_among(release.manifest, release.signature, keys)
    if signer is None:
        return None, (f"version {release.version} is signed by a key that is not among the fleet's"
                      f" ([firmware] keys of {config.source}): every thermostat would refuse it")
    return signer, None


def warn_unchecked(config: GatewayConfig, release: Release, unverifiable: str | None) -> None:
    """What ``--force`` overrode, or that nothing could be checked, on stderr: a release the fleet may
    refuse must never leave without its operator having been told so."""
    if unverifiable is not None:
        print(f"appliance firmware: --force: {unverifiable}", file=sys.stderr)
    elif not config.firmware.keys:
        print(f"appliance firmware: {config.source} names no [firmware] keys: whether the thermostats accept"
              f" version {release.version} ({'signed' if release.signature else 'unsigned'}) is not checked here",
              file=sys.stderr)


class PublishFailed(Exception):
    """A publish that changed nothing (the message, and the exit status)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def client_failure(exc: Exception, connection: ConnectionSettings) -> PublishFailed:
    if isinstance(exc, ServiceError):
        return PublishFailed(f"-ERR {exc.message}", EXIT_SERVICE_ERROR)
    if isinstance(exc, StatusError):
        return PublishFailed(str(exc), EXIT_SERVICE_ERROR)
    return PublishFailed(f"cannot set the desired version through {connection.describe()}: {exc}", EXIT_CONNECTION)


def resolve_targets(client: StateStoreClient, args: argparse.Namespace) -> dict[str, bytes | None]:
    """Each target thermostat's desired-version key and its current value (to put back on failure)."""
    targets = list(args.target)
    for group in args.group:
        members = client.get(group_key(group)).value
        if members is None:
            raise PublishFailed(f"group {group}: the state store has no key {group_key(group)!r} listing its thermostats",
                                EXIT_NOT_DONE)
        try:
            targets += group_members(members)
        except ValueError as exc:
            raise PublishFailed(f"group {group}: {exc}", EXIT_NOT_DONE) from None
    return {desired_key(name): client.get(desired_key(name)).value for name in dict.fromkeys(targets)}


def point_targets(client: StateStoreClient, version: str, previous: dict[str, bytes | None]) -> list[tuple[str, bool]]:
    """Set every target's desired version; on a failure put back the ones already set, then re-raise."""
    done: list[tuple[str, bool]] = []
    try:
        for key in previous:
            done.append((key, client.set(key, version.encode()).applied))
    except (StateStoreClientError, OSError):
        for key, _ in done:
            old = previous[key]
            try:
                client.set(key, old) if old is not None else client.delete(key)
            except (StateStoreClientError, OSError) as exc:
                print(f"appliance firmware: could not put back {key!r} ({exc})", file=sys.stderr)
        raise
    return done


def cmd_publish(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    repo = repository(config)
    for name in args.target + args.group:
        if not THERMOSTAT_NAME.fullmatch(name):
            return fail(f"{name!r} is not a thermostat or group name (1-64 of A-Za-z0-9._-)")
    try:
        release = release_to_publish(args, repo)
    except (BundleError, SigningError) as exc:
        return fail(str(exc))
    signer, unverifiable = fleet_verdict(config, release)
    if unverifiable is not None and not args.force:
        return fail(f"{unverifiable} (--force publishes it anyway)")
    warn_unchecked(config, release, unverifiable)
    try:
        return publish(args, config, repo, release, signer)
    except PublishFailed as exc:
        return fail(str(exc), exc.status)


def publish(args: argparse.Namespace, config: GatewayConfig, repo: Repository, release: Release, signer: str | None) -> int:
    connection = connection_from_args(args) if args.target or args.group else None
    client = store_client(connection) if connection is not None else None
    try:
        previous: dict[str, bytes | None] = {}
        if client is not None and connection is not None:
            try:
                client.connect()
                previous = resolve_targets(client, args)
            except (StateStoreClientError, OSError) as exc:
                raise client_failure(exc, connection) from None
        try:
            created = release.bundle is not None and repo.store(release.bundle, release.signature)
        except BundleError as exc:  # published meanwhile, by another publish
            raise PublishFailed(str(exc), EXIT_NOT_DONE) from None
        emit(stored=release.version, path=str(repo.path(release.version)), new=created,
             files=len(release.manifest.splitlines()) - 1, signed=release.signature is not None,
             verified=None if not config.firmware.keys else signer is not None, key=signer)
        if client is None or connection is None:
            return EXIT_OK
        try:
            for key, applied in point_targets(client, release.version, previous):
                emit(key=key, version=release.version, applied=applied)
        except (StateStoreClientError, OSError) as exc:
            if created:
                repo.remove(release.version)
            raise client_failure(exc, connection) from None
    finally:
        if client is not None:
            client.close()
    return EXIT_OK


def cmd_sign(args: argparse.Namespace) -> int:
    """Replace a stored version's signature: thermostats that already checked the old one keep what they
    verified; every later download gets the new one."""
    config = config_from_args(args)
    repo = repository(config)
    manifest = repo.manifest(args.version)
    if manifest is None:
        return fail(f"version {args.version} is not stored here (published: {', '.join(repo.versions()) or 'none'})")
    try:
        key = load_signing_key(args.key)
    except SigningError as exc:
        return fail(str(exc))
    release = Release(args.version, manifest, sign(manifest, key), None)
    signer, unverifiable = fleet_verdict(config, release)
    if unverifiable is not None and not args.force:
        return fail(f"{unverifiable} (--force signs it anyway)")
    warn_unchecked(config, release, unverifiable)
    repo.replace_signature(args.version, release.signature or b"")
    emit(signed=args.version, key=public_key_hex(key), verified=None if not config.firmware.keys else signer is not None)
    return EXIT_OK


def collect_telemetry(connection: ConnectionSettings, wait: float) -> dict[str, dict[str, Any]]:
    """The latest telemetry of every thermostat heard within ``wait`` seconds. A refused login or
    subscription raises ``ConnectionError``: listening without them would report an empty fleet."""
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
    if connection.username is not None:
        client.username_pw_set(connection.username, connection.password)
    if connection.tls is not None:
        client.tls_set_context(connection.tls)
    listening = threading.Event()
    refusals: list[str] = []

    def on_connect(client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if reason.is_failure:
            refusals.append(f"connection refused: {reason}")
            listening.set()
        else:
            client.subscribe([(TELEMETRY_TOPIC, 0), (UPDATE_TOPIC, 0)])

    def on_subscribe(client: Any, userdata: Any, mid: int, reasons: list[Any], properties: Any) -> None:
        refusals.extend(f"subscription refused: {reason}" for reason in reasons if reason.is_failure)
        listening.set()

    client.on_message = on_message
    client.on_connect = on_connect
    client.on_subscribe = on_subscribe
    client.connect(connection.host, connection.port)
    client.loop_start()
    try:
        if not SYSTEM_CLOCK.wait(listening, connection.timeout):
            raise ConnectionError(f"no CONNACK and SUBACK within {connection.timeout:g} s")
        if refusals:
            raise ConnectionError("; ".join(refusals))
        SYSTEM_CLOCK.sleep(wait)  # listening for this long is the command's whole point
    finally:
        client.loop_stop()
        client.disconnect()
    with lock:
        return dict(latest)


def cmd_status(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    connection = connection_from_args(args)
    try:
        emit(stored=repository(config).versions())
        seen = collect_telemetry(connection, args.wait)
    except OSError as exc:
        return fail(f"cannot reach the gateway at {connection.describe()}: {exc}", EXIT_CONNECTION)
    desired: dict[str, str | None] = {}
    if seen:
        client = store_client(connection)
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
    except SigningError as exc:
        return fail(str(exc))
    return EXIT_OK
