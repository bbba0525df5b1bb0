"""The documentation of the settings cannot drift from the schema: the reference table is generated from
it, the hand-written tables of defaults must agree with it, and every TOML example in docs/ loads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from appliance.cli import main
from appliance.config.reference import reference_table, settings
from appliance.gateway_config import ConfigFile, build, parse_text

DOCS = Path(__file__).resolve().parents[2] / "docs"
GENERATED = re.compile(r"<!-- generated: appliance check-config --schema -->\n(.*?)<!-- end of generated table -->", re.S)
DEFAULTS = {row.key: row.default for row in settings(ConfigFile)}


def test_the_reference_in_docs_is_the_schema(capsys: pytest.CaptureFixture[str]) -> None:
    found = GENERATED.search((DOCS / "configuration.md").read_text(encoding="utf-8"))
    assert found, "docs/configuration.md lost its generated table"
    assert found.group(1) == reference_table(ConfigFile), "regenerate it: appliance check-config --schema"
    assert main(["check-config", "--schema"]) == 0
    assert capsys.readouterr().out == found.group(1)


def default_tables() -> list[tuple[str, str, str, str]]:
    """(document, key path, default as documented, line) for each row of a ``| key | default | ... |``
    table under a heading that names its section, such as docs/broker.md's "Configuration: `[broker.limits]`"."""
    rows = []
    for document in sorted(DOCS.glob("*.md")):
        section, in_table = None, False
        for line in document.read_text(encoding="utf-8").splitlines():
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if line.startswith("#"):
                named = re.search(r"`\[([\w.]+)\]`", line)
                section, in_table = (named.group(1) if named else None), False
            elif not line.startswith("|"):
                in_table = False
            elif section and cells[:2] == ["key", "default"]:
                in_table = True
            elif in_table and not cells[0].startswith("-"):
                rows.append((document.name, f"{section}.{cells[0].strip('`')}", cells[1].strip("`"), line))
    return rows


@pytest.mark.parametrize(("document", "key", "documented", "line"), default_tables(), ids=lambda value: str(value)[:40])
def test_documented_defaults_are_the_schema_defaults(document: str, key: str, documented: str, line: str) -> None:
    assert key in DEFAULTS, f"{document} documents {key}, which the schema does not have"
    assert documented == DEFAULTS[key], f"{document}: {line}"


def test_the_default_tables_are_found() -> None:
    assert {key for _, key, _, _ in default_tables()} >= {"broker.limits.max_packet_size", "broker.limits.max_user_properties"}


#: Documents whose TOML is another file's: docs/hil.md shows the HIL bench file (hil_tests/bench.py).
OTHER_FORMATS = {"hil.md"}


def toml_examples() -> list[tuple[str, str]]:
    blocks = []
    for document in sorted(DOCS.glob("*.md")):
        if document.name not in OTHER_FORMATS:
            text = document.read_text(encoding="utf-8")
            blocks += [(document.name, block) for block in re.findall(r"```toml\n(.*?)```", text, re.S)]
    return blocks


@pytest.mark.parametrize(("document", "text"), toml_examples(), ids=lambda value: str(value)[:40])
def test_every_toml_example_in_the_docs_is_a_valid_configuration(document: str, text: str) -> None:
    build(parse_text(text, f"{document}.toml"), document, DOCS)


def test_the_toml_examples_are_found() -> None:
    assert {document for document, _ in toml_examples()} >= {"broker-security.md", "forwarding.md", "hardware.md"}


def test_every_setting_says_what_it_is_for() -> None:
    """A new setting is written once, with its doc; the reference has no blank rows."""
    assert [row.key for row in settings(ConfigFile) if not row.doc] == []
