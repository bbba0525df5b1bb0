"""How a command-line tool reaches its gateway's broker: the address and TLS settings the gateway's config
gives its listener, and credentials that never have to be typed on a command line.

``appliance state`` and ``appliance firmware`` connect like a device does. Where to: the first ``tcp``
listener of the gateway's config (else the first ``tls`` one), at the port the running gateway bound
(``gateway.json`` in its data directory: ``port = 0`` means any free port) or else the configured one; a
wildcard bind address is reached on loopback. With a ``tls`` listener the tool speaks TLS, trusting the
listener's ``cafile`` and its own certificate (a self-signed gateway certificate is its own CA) besides
the system's. ``--host``/``--port``/``--tls`` override, for a gateway elsewhere.

Credentials, first found wins, per item:

1. ``--username`` (a name is no secret); ``--password`` still works but warns: every user of the box
   sees a command line through ``ps``;
2. the environment: ``APPLIANCE_USERNAME``, ``APPLIANCE_PASSWORD``;
3. a credentials file, ``--credentials FILE`` or ``APPLIANCE_CREDENTIALS``: TOML with ``username``,
   ``password`` and, for a listener that requires client certificates, ``certfile``/``keyfile`` (and a
   ``cafile``), paths relative to the file. It holds a secret, so one that others may read is refused,
   as ssh refuses such a key.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import ssl
import stat
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance import run_state
from appliance.broker.config import ListenerConfig
from appliance.cli_args import add_config_arguments, config_from_args
from appliance.config.errors import ConfigError
from appliance.gateway_config import GatewayConfig

CREDENTIALS_ENV = "APPLIANCE_CREDENTIALS"
USERNAME_ENV = "APPLIANCE_USERNAME"
PASSWORD_ENV = "APPLIANCE_PASSWORD"
CREDENTIAL_FIELDS = ("username", "password", "cafile", "certfile", "keyfile")
WILDCARD_HOSTS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}


class ConnectionSettingsError(ConfigError):
    """Settings a tool cannot connect with (the message says which and why); ``appliance.cli`` reports it
    as any configuration error (exit status 2)."""

    def __init__(self, message: str) -> None:
        super().__init__("", message)


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    """Everything a client needs to reach the broker, resolved."""

    host: str
    port: int
    username: str | None
    password: str | None
    tls: ssl.SSLContext | None
    client_id: str | None
    timeout: float

    def describe(self) -> str:
        return f"{self.host}:{self.port}{' (TLS)' if self.tls is not None else ''}"


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config``/``--data-dir`` (the gateway), then overrides of what its config says."""
    add_config_arguments(parser, listen=False)
    group = parser.add_argument_group("connection (default: the gateway config's listener)")
    group.add_argument("--host", help="broker address (default: the listener's; a wildcard bind is loopback)")
    group.add_argument("--port", type=int, help="broker port (default: the listener's, as the running gateway bound it)")
    group.add_argument("--client-id", help="MQTT client id (default: random)")
    group.add_argument("--username", help=f"user name (default: ${USERNAME_ENV} or the credentials file)")
    group.add_argument("--password", help=f"visible to every user through ps: prefer ${PASSWORD_ENV} or --credentials")
    group.add_argument("--credentials", type=Path, metavar="FILE",
                       help=f"TOML file with username, password, certfile, keyfile, cafile (default: ${CREDENTIALS_ENV})")
    group.add_argument("--tls", action="store_true", default=None, help="connect with TLS (default: if the listener is tls)")
    group.add_argument("--cafile", type=Path, help="CA bundle the broker's certificate must chain to")
    group.add_argument("--certfile", type=Path, help="client certificate (PEM), for a listener that requires one")
    group.add_argument("--keyfile", type=Path, help="the client certificate's key (PEM)")
    group.add_argument("--insecure", action="store_true", help="TLS without verifying the broker's certificate")
    group.add_argument("--timeout", type=float, default=10.0, metavar="S")


def read_credentials(path: Path) -> dict[str, Any]:
    """The credentials file's fields, paths made absolute against its folder."""
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConnectionSettingsError(f"credentials file {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConnectionSettingsError(f"credentials file {path}: not UTF-8 ({exc.reason})") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConnectionSettingsError(f"credentials file {path}: others may read it (mode {stat.S_IMODE(mode):o});"
                                      f" chmod 600 {path}")
    try:
        fields = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConnectionSettingsError(f"credentials file {path}: not valid TOML: {exc}") from exc
    unknown = sorted(set(fields) - set(CREDENTIAL_FIELDS))
    if unknown:
        raise ConnectionSettingsError(f"credentials file {path}: unknown field {unknown[0]!r}"
                                      f" (known: {', '.join(CREDENTIAL_FIELDS)})")
    for name, value in fields.items():
        if not isinstance(value, str):
            raise ConnectionSettingsError(f"credentials file {path}: {name} must be a string")
    for name in ("cafile", "certfile", "keyfile"):
        if name in fields:
            fields[name] = path.parent / fields[name]
    return fields


def tool_listener(config: GatewayConfig) -> tuple[int, ListenerConfig]:
    """The listener a tool uses (its index in the config, for the running gateway's bound port)."""
    indexed = list(enumerate(config.broker.listeners))
    for wanted in ("tcp", "tls"):
        for index, listener in indexed:
            if listener.type == wanted:
                return index, listener
    raise ConnectionSettingsError(f"{config.source}: no tcp or tls listener to connect to (only websocket)")


def bound_port(config: GatewayConfig, index: int) -> int | None:
    """The port the gateway running on the config's data directory bound for listener ``index``."""
    running = run_state.running(config.data_dir)
    if running is None or index >= len(running.listeners):
        return None
    port = running.listeners[index].rpartition(":")[2]
    return int(port) if port.isdigit() else None


def tls_context(listener: ListenerConfig | None, cafile: Path | None, certfile: Path | None, keyfile: Path | None,
                insecure: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=cafile)
    if cafile is None and listener is not None:
        for trusted in (listener.cafile, listener.certfile):
            if trusted is not None:  # not readable by this user: the system's CAs may still do
                with contextlib.suppress(OSError, ssl.SSLError):
                    context.load_verify_locations(cafile=trusted)
    if certfile is not None:
        try:
            context.load_cert_chain(certfile, keyfile)
        except (OSError, ssl.SSLError) as exc:
            raise ConnectionSettingsError(f"client certificate {certfile}: {exc}") from exc
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def connection_from_args(args: argparse.Namespace) -> ConnectionSettings:
    """Resolve the arguments, environment, credentials file and gateway config into one ``ConnectionSettings``
    (raises ``ConfigError``, ``ConnectionSettingsError`` among them: ``appliance.cli`` prints it, exit 2)."""
    config = config_from_args(args)
    index, listener = tool_listener(config)
    credentials_path = args.credentials or (Path(os.environ[CREDENTIALS_ENV]) if os.environ.get(CREDENTIALS_ENV) else None)
    stored = read_credentials(credentials_path) if credentials_path is not None else {}
    if args.password is not None:
        print("appliance: --password is visible to every user of this machine (ps);"
              f" use ${PASSWORD_ENV} or --credentials FILE", file=sys.stderr)
    username = args.username or os.environ.get(USERNAME_ENV) or stored.get("username")
    password = args.password or os.environ.get(PASSWORD_ENV) or stored.get("password")
    host = args.host or WILDCARD_HOSTS.get(listener.host, listener.host)
    port = args.port or (bound_port(config, index) if args.host is None else None) or listener.port
    if port == 0:
        raise ConnectionSettingsError(f"{config.source}: the listener's port is 0 (any free port) and no gateway"
                                      f" runs on {config.data_dir}; give --port")
    use_tls = args.tls if args.tls is not None else (listener.type == "tls" and args.host is None)
    cafile = args.cafile or stored.get("cafile")
    certfile = args.certfile or stored.get("certfile")
    keyfile = args.keyfile or stored.get("keyfile")
    tls = tls_context(listener if args.host is None else None, cafile, certfile, keyfile, args.insecure) if use_tls else None
    return ConnectionSettings(host, port, username, password, tls, args.client_id, args.timeout)
