"""The command-line arguments every gateway command shares (``--config``, ``--data-dir``, ``--listen``)
and how they become a configuration, in one place: ``appliance run``, ``check-config``, ``doctor`` and
``routes`` read the same file the same way, so a command never looks at another data directory than the
gateway it talks about."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from appliance.gateway_config import GatewayConfig, load_config


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host or "127.0.0.1", int(port)


def add_config_arguments(parser: argparse.ArgumentParser, *, listen: bool = True) -> None:
    """``--config`` and ``--data-dir``; ``--listen`` too for the commands that open listeners."""
    parser.add_argument("--config", "-c", help="configuration file (TOML or JSON); default: the embedded one")
    if listen:
        parser.add_argument("--listen", type=parse_listen, metavar="HOST:PORT", help="replace the listeners with one TCP listener")
    parser.add_argument("--data-dir", help="where the gateway keeps its databases (default ./var)")


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """``--listen`` and ``--data-dir`` override the file so several gateways can run side by side. A
    relative ``--data-dir`` is taken from the current directory, as any path typed on a command line."""
    overrides: dict[str, Any] = {}
    if getattr(args, "listen", None):
        host, port = args.listen
        overrides["broker"] = {"listeners": [{"type": "tcp", "host": host, "port": port}]}
    if getattr(args, "data_dir", None):
        overrides["gateway"] = {"data_dir": str(Path(args.data_dir).absolute())}
    return overrides


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    """The configuration the arguments name (raises ``ConfigError`` naming the bad field)."""
    return load_config(args.config, overrides_from_args(args))
