"""The gateway's MQTT 5 / 3.1.1 broker."""
