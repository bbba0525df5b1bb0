"""The two protocol versions every broker behaviour test runs under, as mosquitto's test/broker/NN-*.py
each run levels 4 and 5: one parameter list (ids ``mqtt311``/``mqtt5``) and the CONNECT arguments that
differ between them. A behaviour that exists in one version only says why in its test's docstring."""

from __future__ import annotations

from typing import Any

import pytest

from appliance.broker.codec import packets as pk
from appliance.broker.codec import properties as pr

LEVELS = [pytest.param(pk.MQTT_311, id="mqtt311"), pytest.param(pk.MQTT_5, id="mqtt5")]


def durable(level: int, expiry: int = 60) -> dict[str, Any]:
    """CONNECT arguments for a session that outlives its connection by ``expiry`` seconds (3.1.1: clean
    session off; it has no expiry property, so the session lives for the broker's ``max_session_expiry``)."""
    if level == pk.MQTT_5:
        return {"clean_start": False, "properties": {pr.SESSION_EXPIRY_INTERVAL: expiry}}
    return {"clean_start": False}
