"""``appliance doctor``'s data link check against a stand-in ``nmcli`` on PATH printing what NetworkManager
prints (``nmcli -t -f DEVICE,TYPE,STATE device status``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from appliance.doctor import Verdict, check_data_link
from appliance.hardware.config import ModemConfig

MODEM = ModemConfig(enabled=True)


@pytest.mark.parametrize(
    ("output", "verdict", "words"),
    [
        ("eth0:ethernet:unavailable\ncdc-wdm0:gsm:connected\nlo:loopback:connected (externally)\n", Verdict.OK,
         "cdc-wdm0 is connected"),
        ("cdc-wdm0:gsm:disconnected\n", Verdict.PROBLEM, "check the APN"),
        ("cdc-wdm0:gsm:connecting (prepare)\n", Verdict.PROBLEM, "connecting (prepare)"),
        ("eth0:ethernet:connected\n", Verdict.PROBLEM, "knows no cellular modem"),
    ],
)
def test_the_cellular_link_as_networkmanager_sees_it(
    stand_in: Callable[[str, str], None], output: str, verdict: Verdict, words: str
) -> None:
    stand_in("nmcli", f'[ "$*" = "-t -f DEVICE,TYPE,STATE device status" ] || exit 2\nprintf "{output}"\n')
    [finding] = check_data_link(MODEM)
    assert finding.verdict is verdict and words in finding.message, finding


def test_networkmanager_not_running_or_absent_is_unknown_and_no_modem_no_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stand_in: Callable[[str, str], None]
) -> None:
    stand_in("nmcli", "echo 'Error: NetworkManager is not running.' >&2; exit 8\n")
    [finding] = check_data_link(MODEM)
    assert finding.verdict is Verdict.UNKNOWN and "NetworkManager is not running" in finding.message
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    [finding] = check_data_link(MODEM)
    assert finding.verdict is Verdict.UNKNOWN and "no nmcli" in finding.message
    assert check_data_link(ModemConfig()) == []
