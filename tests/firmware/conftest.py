"""The gateway's OTA service (``appliance/firmware``); its end-to-end tests update thermostats that run the
device firmware under micropython."""

from tests.device_firmware.fixtures import micropython, mosquitto, paho_peer  # noqa: F401
