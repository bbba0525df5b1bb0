# The firmware version: images/firmware/build.py names the bundle after it, telemetry reports it.
VERSION = "0.1.0"
