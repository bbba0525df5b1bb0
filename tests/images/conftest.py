"""The firmware image builder's tests (``images/firmware``) boot what they build under micropython."""

from tests.device_firmware.fixtures import micropython, mosquitto, paho_peer  # noqa: F401
