"""``appliance doctor``: look at a running gateway's machine and say what is wrong in plain words.

Written for the person on site with a laptop and a serial console, not for a developer: each line is one
finding with a verdict (``ok``, ``PROBLEM``, ``unknown``), and the exit status is 1 if anything is a
problem. "unknown" is not a problem: a machine without ``timedatectl`` cannot prove its clock is wrong.

Each check is a plain function returning findings, so tests run them against real sockets, directories
and serial ptys. Store-and-forward is judged from the files the gateway keeps in its data directory
(``appliance.forwarding.doctor``): the link down longer than ``--link-down-after``, no routes or a
rejected manifest, a pump not running or stalled, a queue past half its TTL, a failing store, dead
letters. Every store's health also comes from the Prometheus page when the gateway serves one. The
modem check only opens the serial port with ``--probe-modem``: while the gateway runs it owns the port
(opened exclusively), and a second reader would steal its replies.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import socket
import stat
import subprocess
import urllib.request
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path

from appliance import run_state
from appliance.asyncio_runtime import wall_clock
from appliance.broker.config import ListenerConfig
from appliance.broker.transport.certificates import (
    NEAR_EXPIRY,
    CertificateFileError,
    date_problems,
)
from appliance.cli_args import add_config_arguments, config_from_args
from appliance.findings import Finding, Verdict
from appliance.forwarding import doctor as forwarding_doctor
from appliance.forwarding.config import UpstreamConfig
from appliance.forwarding.doctor import DEFAULT_THRESHOLDS, Thresholds
from appliance.gateway_config import GatewayConfig
from appliance.hardware.config import GpioConfig, ModemConfig
from appliance.hardware.factory_reset import DATABASE_FILES
from appliance.hardware.gpio import GpioUnavailable, pin_library
from appliance.hardware.modem import ModemClosed, ModemMonitor, ModemTimeout
from appliance.sqlite_files import DatabaseFileError, integrity_problems, refuse_emptied
from appliance.system_slot import BootedSlot, read_booted_slot

MIN_FREE_BYTES = 200 * 1024 * 1024
MIN_FREE_FRACTION = 0.05


def check_ports(listeners: Iterable[ListenerConfig], timeout: float = 1.0) -> list[Finding]:
    findings = []
    for listener in listeners:
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(listener.host, listener.host)
        where = f"{listener.type} listener {listener.host}:{listener.port}"
        try:
            with socket.create_connection((host, listener.port), timeout=timeout):
                findings.append(Finding("ports", Verdict.OK, f"{where} accepts connections"))
        except OSError as exc:
            findings.append(
                Finding(
                    "ports", Verdict.PROBLEM, f"nothing accepts connections on {where} ({exc.strerror or exc}): is the gateway running?"
                )
            )
    return findings


def check_certificates(listeners: Iterable[ListenerConfig], now: datetime | None = None,
                       upstream: UpstreamConfig | None = None) -> list[Finding]:
    """Every certificate a TLS listener serves or trusts, and the upstream link's own (client certificate,
    CA) when it uses TLS: expired, not yet valid, or expiring within ``certificates.NEAR_EXPIRY`` is a
    problem here (the gateway only warns at start). An expired upstream certificate keeps the cloud link
    down for ever, which the link check alone reports without the reason."""
    now = now or datetime.fromtimestamp(wall_clock(), UTC)
    findings = []
    files = {(path, role) for listener in listeners
             for path, role in ((listener.certfile, "certfile"), (listener.cafile, "cafile")) if path is not None}
    if upstream is not None and upstream.host is not None and upstream.tls:
        files |= {(path, f"upstream {role}") for path, role in ((upstream.cert_file, "cert_file"),
                                                                 (upstream.ca_file, "ca_file")) if path is not None}
    for path, role in sorted(files, key=lambda item: str(item[0])):
        try:
            problems = date_problems(path, role, now)
        except CertificateFileError as exc:
            findings.append(Finding("tls", Verdict.PROBLEM, str(exc)))
            continue
        findings += [Finding("tls", Verdict.PROBLEM, str(problem)) for problem in problems]
        if not problems:
            findings.append(
                Finding("tls", Verdict.OK, f"TLS {role} {path}: every certificate is valid for {NEAR_EXPIRY.days} days or more")
            )
    return findings


def check_data_dir(data_dir: Path) -> list[Finding]:
    if not data_dir.exists():
        return [
            Finding(
                "data dir",
                Verdict.PROBLEM,
                f"{data_dir} does not exist: the gateway creates it on first start, or check gateway.data_dir",
            )
        ]
    if not data_dir.is_dir():
        return [Finding("data dir", Verdict.PROBLEM, f"{data_dir} is not a directory")]
    findings = []
    if not os.access(data_dir, os.R_OK | os.W_OK | os.X_OK):
        findings.append(Finding("data dir", Verdict.PROBLEM, f"{data_dir} is not writable by this user (uid {os.getuid()})"))
    if data_dir.stat().st_mode & stat.S_IWOTH:
        findings.append(Finding("data dir", Verdict.PROBLEM, f"{data_dir} is writable by every user: run chmod o-w {data_dir}"))
    for name in DATABASE_FILES:
        database = data_dir / name
        if database.exists() and not os.access(database, os.R_OK | os.W_OK):
            findings.append(Finding("data dir", Verdict.PROBLEM, f"{database} cannot be read and written by this user"))
    if not findings:
        findings.append(Finding("data dir", Verdict.OK, f"{data_dir} is writable and not open to other users"))
    return findings


def check_clock(run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run) -> Finding:
    """Trusts systemd-timesyncd/chrony via ``timedatectl``; anything else is honestly "unknown"."""
    if shutil.which("timedatectl") is None:
        return Finding("clock", Verdict.UNKNOWN, "cannot tell whether the clock is synchronised (no timedatectl)")
    try:
        result = run(["timedatectl", "show", "--property=NTPSynchronized", "--value"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Finding("clock", Verdict.UNKNOWN, f"cannot tell whether the clock is synchronised ({exc})")
    answer = result.stdout.strip()
    if result.returncode != 0 or answer not in ("yes", "no"):
        reason = (result.stderr.strip().splitlines() or ["no answer"])[0]
        return Finding("clock", Verdict.UNKNOWN, f"cannot tell whether the clock is synchronised ({reason})")
    if answer == "no":
        return Finding(
            "clock",
            Verdict.PROBLEM,
            "the clock is not synchronised by NTP: the state store needs it within a minute of true time",
        )
    return Finding("clock", Verdict.OK, "the clock is synchronised by NTP")


def check_disk(data_dir: Path, min_free_bytes: int = MIN_FREE_BYTES, min_free_fraction: float = MIN_FREE_FRACTION) -> Finding:
    existing = data_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    usage = shutil.disk_usage(existing)
    free_mb = usage.free // (1024 * 1024)
    if usage.free < min_free_bytes or usage.free < usage.total * min_free_fraction:
        return Finding("disk", Verdict.PROBLEM, f"only {free_mb} MB free under {existing}: queued messages will soon be refused")
    return Finding("disk", Verdict.OK, f"{free_mb} MB free under {existing}")


def check_databases(data_dir: Path) -> list[Finding]:
    """``PRAGMA integrity_check`` on each database of the gateway that exists (read-only). The start
    runs only ``quick_check`` (fast, but blind to an index that disagrees with its table); this is the
    thorough one, for a person who suspects the disk."""
    findings = []
    for name in DATABASE_FILES:
        path = data_dir / name
        if not path.exists():
            continue
        try:
            refuse_emptied(path, "database")
        except DatabaseFileError as exc:
            findings.append(Finding("databases", Verdict.PROBLEM, str(exc)))
            continue
        problems = integrity_problems(path)
        if problems:
            findings.append(Finding(
                "databases", Verdict.PROBLEM,
                f"{path} is damaged: {'; '.join(problems)} - stop the gateway, move the file away (or restore a backup)",
            ))
        else:
            findings.append(Finding("databases", Verdict.OK, f"{path} passes SQLite's integrity check"))
    return findings


def check_modem(config: ModemConfig, probe: bool) -> list[Finding]:
    if not config.enabled:
        return [Finding("modem", Verdict.OK, "no modem configured")]
    device = Path(config.port)
    if not device.exists():
        return [Finding("modem", Verdict.PROBLEM, f"{device} does not exist: is the modem plugged in and powered?")]
    if not os.access(device, os.R_OK | os.W_OK):
        return [Finding("modem", Verdict.PROBLEM, f"{device} is not readable and writable by this user: add it to the dialout group")]
    if not probe:
        return [Finding("modem", Verdict.OK, f"{device} is present (add --probe-modem to talk to it when the gateway is stopped)")]
    return [asyncio.run(_probe_modem(config))]


async def _probe_modem(config: ModemConfig) -> Finding:
    monitor = ModemMonitor(config)
    try:
        status = await monitor.read_once()
    except (ModemTimeout, ModemClosed, OSError) as exc:
        return Finding("modem", Verdict.PROBLEM, f"the modem on {config.port} does not answer AT commands ({exc})")
    metrics = status.as_metrics()
    summary = f"signal {metrics['rssi_dbm']} dBm, operator {metrics['operator']}, {metrics['technology']}"
    if not status.registered:
        return Finding(
            "modem", Verdict.PROBLEM, f"the modem answers but is not registered on a network ({metrics['registration']}; {summary})"
        )
    return Finding("modem", Verdict.OK, f"registered ({metrics['registration']}); {summary}")


def check_gpio(config: GpioConfig) -> Finding:
    """Whether gpiozero finds a pin library here, as the gateway's does at start: without one the gateway
    runs on without LEDs, button and modem relay, which is worth telling the person on site."""
    if not config.enabled:
        return Finding("gpio", Verdict.OK, "no GPIO configured")
    try:
        library = pin_library()
    except GpioUnavailable as exc:
        return Finding("gpio", Verdict.PROBLEM, f"no GPIO on this machine ({exc}): the gateway runs without LEDs, button and relay")
    return Finding("gpio", Verdict.OK, f"GPIO pins through {library}")


def check_data_link(config: ModemConfig) -> list[Finding]:
    """The cellular data connection as NetworkManager sees it (the image dials with ModemManager and
    NetworkManager; the gateway only watches the modem). Without NetworkManager: unknown, not a problem."""
    if not config.enabled:
        return []
    if shutil.which("nmcli") is None:
        return [Finding("data link", Verdict.UNKNOWN, "cannot tell the cellular data link's state (no nmcli: no NetworkManager)")]
    try:
        result = subprocess.run(
            ["nmcli", "-t", "-f", "DEVICE,TYPE,STATE", "device", "status"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [Finding("data link", Verdict.UNKNOWN, f"cannot tell the cellular data link's state ({exc})")]
    if result.returncode != 0:
        reason = (result.stderr.strip().splitlines() or ["no answer"])[0]
        return [Finding("data link", Verdict.UNKNOWN, f"cannot tell the cellular data link's state ({reason})")]
    cellular = [line.split(":", 2) for line in result.stdout.splitlines() if line.count(":") >= 2 and line.split(":")[1] == "gsm"]
    if not cellular:
        return [Finding("data link", Verdict.PROBLEM,
                        "NetworkManager knows no cellular modem: is it plugged in and ModemManager running (mmcli -L)?")]
    findings = []
    for device, _, state in cellular:
        if state.startswith("connected"):
            findings.append(Finding("data link", Verdict.OK, f"cellular data link {device} is {state}"))
        else:
            findings.append(Finding("data link", Verdict.PROBLEM,
                                    f"cellular data link {device} is {state}: check the APN and SIM (docs/hardware.md, Setting the APN)"))
    return findings


def check_system_slot(slot: BootedSlot | None) -> list[Finding]:
    """The A/B root slot the machine booted (``rauc.slot=``) and the version RAUC installed there; nothing
    on a machine not booted through the image's boot script."""
    if slot is None:
        return []
    if slot.name is None:
        return [Finding("system slot", Verdict.PROBLEM, f"booted slot {slot.bootname}, which /etc/rauc/system.conf does not "
                                                        "name: RAUC can neither mark it good nor update the other slot")]
    version = slot.version or "as flashed (no bundle installed into it yet)"
    return [Finding("system slot", Verdict.OK, f"running root slot {slot.bootname} ({slot.name}), version {version}")]


def check_metrics(data_dir: Path, metrics_port: int | None, timeout: float = 2.0) -> list[Finding]:
    """Whether the running gateway's Prometheus page answers, where it says it serves it (``gateway.json``:
    a ``metrics_port`` of 0 is chosen at start), and whether every store it reports commits."""
    if metrics_port is None:
        return []
    running = run_state.running(data_dir)
    if running is None or running.metrics_url is None:
        return [Finding("metrics", Verdict.PROBLEM, f"no running gateway serves metrics for {data_dir} (no live {run_state.FILE_NAME})")]
    url = running.metrics_url
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            page = response.read().decode("utf-8", "replace")
    except OSError as exc:
        return [Finding("metrics", Verdict.PROBLEM, f"metrics on {url} do not answer ({exc})")]
    return [Finding("metrics", Verdict.OK, f"metrics on {url}"), *check_store_health(page)]


_STORE_HEALTHY = re.compile(r'^appliance_store_healthy\{store="([^"]*)"\} (\S+)$', re.MULTILINE)


def check_store_health(page: str) -> list[Finding]:
    """``appliance_store_healthy`` of each store on the gateway's Prometheus page: 0 while its commits fail."""
    findings = []
    for store, value in _STORE_HEALTHY.findall(page):
        if value == "1":
            findings.append(Finding("stores", Verdict.OK, f"the {store} store commits"))
        else:
            findings.append(Finding("stores", Verdict.PROBLEM, f"the {store} store cannot commit (a full or failing "
                                                               "disk?): the gateway refuses what it cannot store"))
    return findings


def check_forwarding(config: GatewayConfig, thresholds: Thresholds, now_ms: int | None = None) -> list[Finding]:
    """Store-and-forward, when enabled: the manifest, the running routes, the link, the queues, the pumps, the
    store and the dead letters (``appliance.forwarding.doctor``)."""
    if not config.forwarding.enabled:
        return []
    running = run_state.running(config.data_dir)
    pid = running.pid if running is not None else None
    now_ms = int(wall_clock() * 1000) if now_ms is None else now_ms
    return [
        *forwarding_doctor.check_manifest(config.forwarding),
        *forwarding_doctor.check_running_routes(config.data_dir, pid),
        *forwarding_doctor.check_metrics_document(config.data_dir, now_ms, pid, config.forwarding.metrics_interval_s,
                                                  thresholds),
        *forwarding_doctor.check_dead_letters(config.data_dir),
    ]


def run_checks(config: GatewayConfig, probe_modem: bool = False, thresholds: Thresholds = DEFAULT_THRESHOLDS) -> list[Finding]:
    return [
        *check_metrics(config.data_dir, config.metrics_port),
        *check_forwarding(config, thresholds),
        *check_ports(config.broker.listeners),
        *check_certificates(config.broker.listeners,
                            upstream=config.forwarding.upstream if config.forwarding.enabled else None),
        *check_data_dir(config.data_dir),
        *check_databases(config.data_dir),
        check_clock(),
        check_gpio(config.hardware.gpio),
        *check_modem(config.hardware.modem, probe_modem),
        *check_data_link(config.hardware.modem),
        check_disk(config.data_dir),
        *check_system_slot(read_booted_slot()),
    ]


def format_findings(findings: Iterable[Finding]) -> str:
    return "\n".join(f"{finding.verdict.value:<8} {finding.check:<9} {finding.message}" for finding in findings)


def cmd_doctor(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    thresholds = Thresholds(link_down_s=args.link_down_after, stalled_s=args.stalled_after)
    findings = run_checks(config, probe_modem=args.probe_modem, thresholds=thresholds)
    print(format_findings(findings))
    problems = sum(finding.verdict is Verdict.PROBLEM for finding in findings)
    print(f"\n{problems} problem(s) found" if problems else "\nno problems found")
    return 1 if problems else 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("doctor", help="check this machine for what would stop the gateway working")
    add_config_arguments(parser)
    parser.add_argument("--probe-modem", action="store_true", help="send AT commands to the modem (stop the gateway first)")
    parser.add_argument("--link-down-after", type=float, default=Thresholds().link_down_s, metavar="SECONDS",
                        help="a cloud link down longer than this is a problem (default %(default)s)")
    parser.add_argument("--stalled-after", type=float, default=Thresholds().stalled_s, metavar="SECONDS",
                        help="a pump whose head has not moved this long while its link is up is a problem "
                             "(default %(default)s)")
    parser.set_defaults(handler=cmd_doctor)
