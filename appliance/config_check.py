"""``appliance check-config``: everything ``appliance run`` would refuse or silently ignore, in one run.

The settings are parsed with every error collected (``appliance.config.schema.collecting_errors``), then
every file the configuration names is opened as the gateway would open it: each TLS listener's certificate
and key (they exist, parse and belong together) and CA bundle, the password file and the ACL file (every
bad line, not the first), the forwarding manifest (every schema and route problem, with the route
checker), and the upstream link's CA bundle, client certificate and key. A file is checked even when
another section has an error, so one run lists everything to fix. Each problem is one line naming the
setting (``broker.auth.acl_file: /etc/acl:3: ...``).
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

from appliance.broker.config import AuthConfig, BrokerConfig
from appliance.broker.security.acl import Acl
from appliance.broker.security.auth import parse_password_file
from appliance.config.errors import ConfigError
from appliance.config.schema import SectionRejected, collecting_errors, field_types, parse_section
from appliance.forwarding.config import ForwardingConfig
from appliance.forwarding.manifest import ManifestError, load_manifest, manifest_problems, read_manifest_document
from appliance.gateway_config import ConfigFile, GatewayConfig, build, read_raw


def check_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> tuple[GatewayConfig | None, list[str]]:
    """The configuration (None if its settings have errors) and every problem found, settings and files."""
    try:
        raw, source, base_dir = read_raw(path, overrides)
    except ConfigError as exc:
        return None, [str(exc)]
    config: GatewayConfig | None = None
    with collecting_errors() as errors:
        try:
            config = build(raw, source, base_dir)
        except ConfigError as exc:
            if not isinstance(exc, SectionRejected):  # raised outside a section: not recorded yet
                errors.append(exc)
    problems = [str(error) for error in errors]
    broker, forwarding = (config.broker, config.forwarding) if config else _sections_that_parse(raw, base_dir)
    if broker is not None:
        problems += broker_file_problems(broker)
    if forwarding is not None:
        problems += forwarding_file_problems(forwarding)
    return (config if not problems else None), problems


def _sections_that_parse(raw: dict[str, Any], base_dir: Path) -> tuple[BrokerConfig | None, ForwardingConfig | None]:
    """The broker and forwarding sections on their own, so their files are checked despite errors elsewhere
    (their own errors are reported already)."""
    types = field_types(ConfigFile)
    sections: dict[str, Any] = {}
    for name in ("broker", "forwarding"):
        try:
            sections[name] = parse_section(types[name], raw.get(name, {}), name, base_dir)
        except ConfigError:
            sections[name] = None
    return sections["broker"], sections["forwarding"]


def broker_file_problems(broker: BrokerConfig) -> list[str]:
    problems = []
    for index, listener in enumerate(broker.listeners):
        where = f"broker.listeners[{index}]"
        if listener.certfile is not None or listener.keyfile is not None:
            problems += _certificate_and_key(where, "certfile", listener.certfile, "keyfile", listener.keyfile,
                                             ssl.PROTOCOL_TLS_SERVER)
        if listener.cafile is not None:
            problems += _ca_bundle(f"{where}.cafile", listener.cafile)
    return problems + auth_file_problems(broker.auth)


def auth_file_problems(auth: AuthConfig) -> list[str]:
    problems = []
    if auth.password_file is not None:
        problems += [f"broker.auth.password_file: {problem}"
                     for problem in _every_line_problem(auth.password_file, "password file", parse_password_file)]
    if auth.acl_file is not None:
        problems += [f"broker.auth.acl_file: {problem}"
                     for problem in _every_line_problem(auth.acl_file, "ACL file", Acl.parse)]
    return problems


def forwarding_file_problems(forwarding: ForwardingConfig) -> list[str]:
    problems = []
    if forwarding.manifest is not None:
        try:
            document = read_manifest_document(forwarding.manifest)
            found: list[ManifestError | str] = list(manifest_problems(document, str(forwarding.manifest)))
            if not found and forwarding.enabled and not load_manifest(forwarding.manifest).routes:
                # What `appliance doctor` calls a problem: every device message accepted and dropped.
                found.append("forwarding is enabled but the manifest has no routes: no message would be routed")
        except ManifestError as exc:
            found = [exc]
        problems += [f"forwarding.manifest: {forwarding.manifest}: {problem}" for problem in found]
    elif forwarding.enabled:
        problems.append("forwarding.manifest: forwarding is enabled but names no manifest: no message would be routed")
    upstream = forwarding.upstream
    if upstream.cert_file is not None or upstream.key_file is not None:
        problems += _certificate_and_key("forwarding.upstream", "cert_file", upstream.cert_file, "key_file",
                                         upstream.key_file, ssl.PROTOCOL_TLS_CLIENT)
    if upstream.ca_file is not None:
        problems += _ca_bundle("forwarding.upstream.ca_file", upstream.ca_file)
    return problems


def _missing(setting: str, path: Path) -> str | None:
    if not path.exists():
        return f"{setting}: {path} does not exist"
    if not path.is_file():
        return f"{setting}: {path} is not a file"
    try:
        path.open("rb").close()
    except OSError as exc:
        return f"{setting}: {path} cannot be read: {exc.strerror}"
    return None


def _certificate_and_key(where: str, cert_name: str, cert: Path | None, key_name: str, key: Path | None,
                         protocol: ssl._SSLMethod) -> list[str]:
    """Both given, both readable, and the key belongs to the certificate (``load_cert_chain`` checks all)."""
    problems = [f"{where}.{name}: needed with {other}" for name, value, other in
                ((cert_name, cert, key_name), (key_name, key, cert_name)) if value is None]
    problems += [problem for name, value in ((cert_name, cert), (key_name, key)) if value is not None
                 if (problem := _missing(f"{where}.{name}", value)) is not None]
    if problems or cert is None or key is None:
        return problems
    try:
        ssl.SSLContext(protocol).load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        reason = "the key does not belong to the certificate" if "KEY_VALUES_MISMATCH" in str(exc) else \
            f"not a PEM certificate chain and its private key ({exc.reason or exc})"
        return [f"{where}.{cert_name}: {cert} with {key}: {reason}"]
    return []


def _ca_bundle(setting: str, path: Path) -> list[str]:
    missing = _missing(setting, path)
    if missing is not None:
        return [missing]
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=path)
    except ssl.SSLError as exc:
        return [f"{setting}: {path} holds no PEM CA certificate ({exc.reason or exc})"]
    return []


def _every_line_problem(path: Path, what: str, parse: Callable[[str, str], object]) -> list[str]:
    """Every bad line of a line-oriented file: the parser stops at the first (``source:line: ...``), so
    that line is blanked and the file parsed again, until it parses."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        reason = f"{exc.strerror}" if isinstance(exc, OSError) else f"not UTF-8 ({exc.reason})"
        return [f"cannot read the {what} {path}: {reason}"]
    source = str(path)
    line_of = re.compile(re.escape(source) + r":(\d+): ")
    problems: list[str] = []
    while True:
        try:
            parse("\n".join(lines), source)
            return problems
        except ValueError as exc:
            problems.append(str(exc))
            match = line_of.match(str(exc))
            if match is None or not lines[int(match.group(1)) - 1]:
                return problems  # not about one line: nothing more can be told
            lines[int(match.group(1)) - 1] = ""


