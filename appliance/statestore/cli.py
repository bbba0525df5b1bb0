"""``appliance state get|set|del|vdel|watch|lock KEY ...``: the state store from a shell.

Output is for scripts: one JSON object per line on stdout (``value`` as text when it is UTF-8, else
``value_base64``; ``version`` as the HLC string), errors on stderr. Exit status: 0 done, 1 "did not happen"
(GET miss, SET refused by NX/NEX, DEL of a missing key, VDEL mismatch, lock held by someone else), 2 the
state store answered ``-ERR`` or a failure status (the text is printed) - or the connection settings are
wrong -, 3 no connection or no answer in time. Where the gateway is and how to log in come from its config,
the environment or a credentials file (``appliance/tool_connection.py``), so no password needs to be typed
where ``ps`` shows it.
"""

from __future__ import annotations

import argparse
import base64
import json
import queue
import sys
from typing import Any

from appliance.blocking_clock import SYSTEM_CLOCK
from appliance.statestore.client import (
    DeleteResult,
    Notification,
    ServiceError,
    StateStoreClient,
    StateStoreClientError,
    StatusError,
)
from appliance.statestore.commands import Condition
from appliance.statestore.hlc import Hlc, HlcFormatError
from appliance.tool_connection import ConnectionSettings, add_connection_arguments, connection_from_args

EXIT_OK, EXIT_NOT_DONE, EXIT_SERVICE_ERROR, EXIT_CONNECTION = 0, 1, 2, 3


def register(subparsers: Any) -> None:
    state = subparsers.add_parser("state", help="talk to a gateway's state store")
    verbs = state.add_subparsers(dest="verb", required=True)

    def verb(name: str, help_text: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = verbs.add_parser(name, help=help_text)
        add_connection_arguments(parser)
        parser.add_argument("key", help="the key (UTF-8 text)")
        return parser

    verb("get", "print a key's value and version").set_defaults(handler=cmd_get)
    setter = verb("set", "set a key")
    setter.add_argument("value", help="the value; '-' reads it from stdin")
    condition = setter.add_mutually_exclusive_group()
    condition.add_argument("--nx", action="store_true", help="only if the key does not exist")
    condition.add_argument("--nex", action="store_true", help="only if missing or already equal to the value")
    setter.add_argument("--px", type=int, metavar="MS", help="expire after MS milliseconds")
    add_fencing_argument(setter)
    setter.set_defaults(handler=cmd_set)
    deleter = verb("del", "delete a key")
    add_fencing_argument(deleter)
    deleter.set_defaults(handler=cmd_del)
    vdeleter = verb("vdel", "delete a key only if it holds VALUE")
    vdeleter.add_argument("value")
    add_fencing_argument(vdeleter)
    vdeleter.set_defaults(handler=cmd_del)
    watcher = verb("watch", "print every change of a key until interrupted")
    watcher.add_argument("--count", type=int, help="stop after this many notifications")
    watcher.set_defaults(handler=cmd_watch)
    locker = verb("lock", "acquire a lease (SET NEX PX), print its fencing token, optionally hold it")
    locker.add_argument("--holder", required=True, help="this holder's name (the lock's value)")
    locker.add_argument("--ttl", type=int, default=10_000, metavar="MS", help="lease length (default 10000)")
    locker.add_argument("--wait", type=float, default=0.0, metavar="S", help="wait up to S seconds for the lock to be free")
    locker.add_argument("--hold", type=float, metavar="S", help="renew for S seconds, then release")
    locker.set_defaults(handler=cmd_lock)


def add_fencing_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fencing-token", type=parse_hlc, metavar="HLC", help="__ft, e.g. a lock's version")


def parse_hlc(text: str) -> Hlc:
    try:
        return Hlc.parse(text)
    except HlcFormatError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def emit(**fields: Any) -> None:
    out: dict[str, Any] = {}
    for name, value in fields.items():
        if isinstance(value, bytes):
            try:
                out[name] = value.decode("utf-8")
            except UnicodeDecodeError:
                out[f"{name}_base64"] = base64.b64encode(value).decode("ascii")
        elif isinstance(value, Hlc):
            out[name] = str(value)
        else:
            out[name] = value
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()


def store_client(connection: ConnectionSettings) -> StateStoreClient:
    return StateStoreClient(connection.host, connection.port, connection.client_id, username=connection.username,
                            password=connection.password, tls=connection.tls, timeout=connection.timeout)


def run(args: argparse.Namespace) -> int:
    """Connect, run the verb's handler, map client errors to exit statuses."""
    connection = connection_from_args(args)
    client = store_client(connection)
    try:
        client.connect()
    except (StateStoreClientError, OSError) as exc:
        print(f"appliance state: cannot connect to {connection.describe()}: {exc}", file=sys.stderr)
        return EXIT_CONNECTION
    try:
        return int(args.verb_handler(client, args))
    except ServiceError as exc:
        print(f"-ERR {exc.message}", file=sys.stderr)
        return EXIT_SERVICE_ERROR
    except StatusError as exc:  # answered, but with a failure status (storage failure, version)
        print(f"appliance state: {exc}", file=sys.stderr)
        return EXIT_SERVICE_ERROR
    except StateStoreClientError as exc:
        print(f"appliance state: {exc}", file=sys.stderr)
        return EXIT_CONNECTION
    finally:
        client.close()


def with_client(handler: Any) -> Any:
    def entry(args: argparse.Namespace) -> int:
        args.verb_handler = handler
        return run(args)

    return entry


def key_of(args: argparse.Namespace) -> bytes:
    key: str = args.key
    return key.encode("utf-8")


@with_client
def cmd_get(client: StateStoreClient, args: argparse.Namespace) -> int:
    result = client.get(key_of(args))
    emit(key=key_of(args), found=result.value is not None, value=result.value, version=result.version)
    return EXIT_OK if result.value is not None else EXIT_NOT_DONE


@with_client
def cmd_set(client: StateStoreClient, args: argparse.Namespace) -> int:
    value = sys.stdin.buffer.read() if args.value == "-" else args.value.encode("utf-8")
    condition = Condition.NX if args.nx else Condition.NEX if args.nex else Condition.ALWAYS
    result = client.set(key_of(args), value, condition=condition, expire_ms=args.px, fencing_token=args.fencing_token)
    emit(key=key_of(args), applied=result.applied, version=result.version)
    return EXIT_OK if result.applied else EXIT_NOT_DONE


@with_client
def cmd_del(client: StateStoreClient, args: argparse.Namespace) -> int:
    result: DeleteResult
    if getattr(args, "value", None) is not None:
        result = client.vdelete(key_of(args), args.value.encode("utf-8"), fencing_token=args.fencing_token)
    else:
        result = client.delete(key_of(args), fencing_token=args.fencing_token)
    emit(key=key_of(args), deleted=result.count, version=result.version)
    return EXIT_OK if result.count == 1 else EXIT_NOT_DONE


@with_client
def cmd_watch(client: StateStoreClient, args: argparse.Namespace) -> int:
    notes: queue.Queue[Notification] = queue.Queue()
    client.keynotify(key_of(args), notes.put)
    emit(key=key_of(args), watching=True)
    seen = 0
    while args.count is None or seen < args.count:
        note = notes.get()
        emit(key=note.key, operation="DELETE" if note.value is None else "SET", value=note.value, version=note.version)
        seen += 1
    return EXIT_OK


@with_client
def cmd_lock(client: StateStoreClient, args: argparse.Namespace) -> int:
    lease = client.lease(key_of(args), args.holder, args.ttl)
    if not lease.acquire(wait=args.wait):
        emit(key=key_of(args), acquired=False)
        return EXIT_NOT_DONE
    emit(key=key_of(args), acquired=True, fencing_token=lease.fencing_token, ttl_ms=args.ttl)
    if args.hold is None:
        return EXIT_OK
    end = SYSTEM_CLOCK.monotonic() + args.hold
    while SYSTEM_CLOCK.monotonic() < end:
        SYSTEM_CLOCK.sleep(min(args.ttl / 3000, max(0.0, end - SYSTEM_CLOCK.monotonic())))
        if SYSTEM_CLOCK.monotonic() < end and not lease.renew():
            emit(key=key_of(args), lost=True)
            return EXIT_NOT_DONE
    emit(key=key_of(args), released=lease.release())
    return EXIT_OK
