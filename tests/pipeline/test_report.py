"""The HTML report over the batch outputs: a page that shows every expected plot."""

import re
from pathlib import Path

import pytest

from pipeline.cli import main

pytestmark = pytest.mark.slow  # Spark jobs over the sample: seconds each


def test_report_page_references_one_png_per_plot(batch_outputs, tmp_path, capsys):
    settings, _ = batch_outputs
    assert main(["report", "--out", settings.out, "--report-dir", str(tmp_path / "report")]) == 0
    page = tmp_path / "report" / "index.html"
    text = page.read_text()
    images = re.findall(r'<img src="([^"]+)"', text)
    assert sorted(images) == sorted([
        "img/latency-gw1.png", "img/latency-gwf.png",
        "img/hil-r1-outage.png",
        "img/thermostat-gw1-t1.png", "img/thermostat-gw1-t2.png", "img/thermostat-gwf-tf.png",
    ])
    for image in images:
        assert (page.parent / image).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Delivery SLA" in text and "HIL runs" in text and "Quarantine" in text
    assert "temperature is missing or not a number" in text
    assert "report: thermostat plot 3/3" in capsys.readouterr().err


def test_report_on_no_outputs_says_so(tmp_path):
    from pipeline.report import render_report

    page = render_report(tmp_path / "nothing", tmp_path / "report")
    assert "No outputs under" in Path(page).read_text()
