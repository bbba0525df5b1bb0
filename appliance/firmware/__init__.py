"""Over-the-air firmware updates for the thermostats: bundles on the gateway, chunks over MQTT 5 (docs/firmware.md)."""
