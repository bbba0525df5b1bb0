"""``appliance passwd``: create, update and delete password file entries, like ``mosquitto_passwd``.

The options mirror mosquitto_passwd (``-c`` create, ``-b`` password on the command line, ``-D`` delete) so
operators' scripts carry over. The file is rewritten atomically (``auth.write_password_file``) and a file
that does not parse is left untouched with an error naming the line: an update never drops the users
the tool could not read. Comment lines are not kept when the file is rewritten.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from pathlib import Path

from appliance.broker.security.auth import (
    DEFAULT_ITERATIONS,
    PasswordFileError,
    PasswordHash,
    hash_password,
    read_password_file,
    write_password_file,
)


class PasswdError(Exception):
    """A refusal with a message for the operator; the file is unchanged."""


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "passwd",
        help="manage a broker password file (mosquitto_passwd compatible)",
        description="Add, update (-b or prompt) or delete (-D) a user in a mosquitto-format password file.",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("-c", dest="create", action="store_true", help="create a new file (replaces an existing one)")
    mode.add_argument("-D", dest="delete", action="store_true", help="delete the user")
    parser.add_argument("-b", dest="batch", action="store_true", help="take the password from the command line")
    parser.add_argument(
        "-I", "--iterations", type=int, default=DEFAULT_ITERATIONS, help=f"PBKDF2 rounds (default {DEFAULT_ITERATIONS})"
    )
    parser.add_argument("file", type=Path, help="password file")
    parser.add_argument("username")
    parser.add_argument("password", nargs="?", help="only with -b")
    parser.set_defaults(handler=cmd_passwd)


def cmd_passwd(args: argparse.Namespace) -> int:
    try:
        run(args)
    except PasswdError as exc:
        print(f"appliance passwd: {exc}", file=sys.stderr)
        return 1
    return 0


def run(args: argparse.Namespace) -> None:
    """Apply one command; raises ``PasswdError`` (file unchanged) on refusal."""
    username: str = args.username
    if not username or ":" in username or "\n" in username:
        raise PasswdError(f"user name {username!r} is empty or contains ':' or a newline")
    if args.iterations < 1:
        raise PasswdError("iterations must be at least 1")
    if args.batch != (args.password is not None) and not args.delete:
        raise PasswdError("give the password on the command line with -b, or leave out both to be prompted")
    if args.delete and args.password is not None:
        raise PasswdError("-D takes no password")
    entries = {} if args.create else _read_existing(args.file)
    if args.delete:
        if username not in entries:
            raise PasswdError(f"user {username!r} not found in {args.file}")
        del entries[username]
    else:
        password = args.password if args.batch else _prompt()
        entries[username] = hash_password(password, iterations=args.iterations)
    try:
        write_password_file(args.file, entries)
    except OSError as exc:
        raise PasswdError(f"cannot write {args.file}: {exc.strerror or exc}") from exc


def _read_existing(path: Path) -> dict[str, PasswordHash]:
    if not path.exists():
        raise PasswdError(f"{path} does not exist; use -c to create it")
    try:
        return read_password_file(path)
    except PasswordFileError as exc:
        raise PasswdError(f"{exc}; the file was not changed") from exc


def _prompt() -> str:
    try:
        first = getpass.getpass("Password: ")
        second = getpass.getpass("Reenter password: ")
    except EOFError as exc:
        raise PasswdError("no password given") from exc
    if first != second:
        raise PasswdError("passwords do not match")
    if not first:
        raise PasswdError("empty password")
    return first
