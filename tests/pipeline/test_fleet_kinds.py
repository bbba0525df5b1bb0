"""Every landing kind is a kind of every command that names one: the ``firmware`` kind (the thermostats'
update status messages, issue 29 item 4) came after ``rebuild-bronze`` (item 6), whose ``--kind`` listed
the three kinds of its day, so a corrupt firmware bronze file could not be rebuilt from its landing files."""

import pytest

from pipeline.cli import build_parser
from pipeline.records import KINDS


@pytest.mark.parametrize("kind", KINDS)
def test_rebuild_bronze_takes_every_landing_kind(kind):
    args = build_parser().parse_args(["rebuild-bronze", "--landing", "landing", "--kind", kind])
    assert args.kind == kind
