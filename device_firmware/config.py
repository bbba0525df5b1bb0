"""The device configuration: `config.json` merged over DEFAULTS, the one home of the defaults.

`images/firmware/build.py` reads DEFAULTS from this file (it is a plain literal) to write the
bundle's `config.template.json`, and the tests' rig overrides only what it changes, so the
defaults are written once. The thermostat imports this module at boot and unloads it afterwards:
on a 64 KB heap, boot-only bytecode is worth giving back.
"""

import json

DEFAULTS = {
    "broker": {"host": "127.0.0.1", "port": 1883, "user": None, "password": None, "keepalive": 30},
    "wifi": {"ssid": None, "password": None, "backoff_min_ms": 1000, "backoff_max_ms": 60000},
    "set_point": {"default": 20.0, "min": 5.0, "max": 30.0},
    "hysteresis_c": 0.5,
    "alerts": {"low_c": 5.0, "high_c": 35.0},
    "timing": {"control_ms": 1000, "telemetry_ms": 10000, "backoff_min_ms": 500,
               "backoff_max_ms": 30000, "request_timeout_ms": 5000},
    "state_file": "setpoint.json",
    "hardware": {"kind": "simulated"},
    # Over-the-air updates: the ECDSA P-256 public key (hex of X||Y) that must have signed the
    # manifest (null: sha256 only). Read by ota.py when it needs it.
    "update": {"key": None},
}


def load_config(path: str) -> dict:
    """The JSON config file merged over DEFAULTS (one level deep); `thermostat` is required."""
    with open(path) as f:
        config = json.load(f)
    if not isinstance(config.get("thermostat"), str) or not config["thermostat"]:
        raise ValueError("config: 'thermostat' (the device name) is required")
    merged = {}
    for name, default in DEFAULTS.items():
        value = config.get(name, default)
        if isinstance(default, dict):
            if not isinstance(value, dict):
                raise ValueError("config: '%s' must be an object" % name)
            value = dict(default, **value)
        merged[name] = value
    merged["thermostat"] = config["thermostat"]
    return merged
