"""Command line: ``appliance run | check-config | ...``.

Each subsystem contributes its own subcommands through a ``register(subparsers)`` function so this module
stays a table of contents rather than a second home for subsystem logic.

``appliance run`` is the gateway, a process that lives for months: it builds only its own subcommand and
imports none of the others' modules (the doctor, the state store and forwarding tools with jsonschema):
memory it would carry for nothing (measured in bench/RESULTS.md, "idle connections back under 48 MB").
The other subcommands, too, import only their own module (``SUBCOMMAND_MODULES``): importing all five
took a short command such as ``appliance passwd`` from 0.1 to 0.3 s of CPU. Only ``--help``, a mistyped
subcommand or none builds every subcommand, to list them.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence

from appliance.cli_args import add_config_arguments, config_from_args, overrides_from_args
from appliance.config import ConfigError


def cmd_run(args: argparse.Namespace) -> int:
    from appliance.gateway import run_gateway

    config = config_from_args(args)
    return run_gateway(config)


def cmd_check_config(args: argparse.Namespace) -> int:
    from appliance.config.reference import reference_table
    from appliance.config_check import check_config
    from appliance.gateway_config import ConfigFile

    if args.schema:
        sys.stdout.write(reference_table(ConfigFile))
        return 0
    config, problems = check_config(args.config, overrides_from_args(args))
    if config is None:
        for problem in problems:
            print(f"appliance: configuration error: {problem}", file=sys.stderr)
        print(f"appliance: {len(problems)} configuration error(s)", file=sys.stderr)
        return 2
    json.dump(config.to_dict(), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


#: The subcommands whose module registers them (``register(subparsers)``), by name, in the order ``--help``
#: lists them.
SUBCOMMAND_MODULES = {
    "doctor": "appliance.doctor",
    "firmware": "appliance.firmware.cli",
    "routes": "appliance.forwarding.cli",
    "passwd": "appliance.broker.security.passwd_cli",
    "state": "appliance.statestore.cli",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every subcommand, or only ``command`` if it is one (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="appliance", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    known = command in ("run", "check-config", *SUBCOMMAND_MODULES)

    if not known or command == "run":
        run = sub.add_parser("run", help="run the gateway")
        add_config_arguments(run)
        run.set_defaults(handler=cmd_run)
    if not known or command == "check-config":
        check = sub.add_parser("check-config", help="validate a configuration file and every file it names; print "
                               "the result, or every error")
        add_config_arguments(check)
        check.add_argument(
            "--schema", action="store_true", help="print every setting (type, default, bounds) as docs/configuration.md lists them"
        )
        check.set_defaults(handler=cmd_check_config)
    for name, module in SUBCOMMAND_MODULES.items():
        if not known or command == name:
            importlib.import_module(module).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    try:
        return int(args.handler(args))
    except ConfigError as exc:
        print(f"appliance: configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
