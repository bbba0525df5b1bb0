"""The device firmware's tests: MicroPython modules under the real interpreter, the firmware against
mosquitto and against the gateway."""

from tests.device_firmware.fixtures import micropython, mosquitto, paho_peer  # noqa: F401

# mp/ holds MicroPython test modules; test_on_micropython.py runs them under micropython, not pytest.
collect_ignore = ["mp"]
