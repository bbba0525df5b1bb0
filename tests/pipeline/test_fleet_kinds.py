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


def test_the_firmware_plot_takes_any_version_strings():
    """Versions are the firmware's own strings (``build.py --version V``): ``0.2.0-rc1`` beside ``0.2.0.1``
    compared a word with a number and the report died with a TypeError. Numbers order as numbers."""
    import pandas as pd

    from pipeline.report import firmware_figure

    log = pd.DataFrame([
        {"gateway_id": "gw1", "device_id": "t1", "at_ms": 1_000, "running": "0.2.0.1"},
        {"gateway_id": "gw1", "device_id": "t1", "at_ms": 2_000, "running": "0.2.0-rc1"},
        {"gateway_id": "gw1", "device_id": "t2", "at_ms": 1_500, "running": "0.10.0"},
        {"gateway_id": "gw1", "device_id": "t2", "at_ms": 2_500, "running": "v1"},
        {"gateway_id": "gw1", "device_id": "t3", "at_ms": 2_600, "running": "1.²"},  # a digit int() refuses
    ])
    ax = firmware_figure(log, 12).axes[0]
    labels = [tick.get_text() for tick in ax.get_yticklabels()]
    assert labels.index("0.2.0.1") < labels.index("0.10.0") and set(labels) == set(log["running"])
