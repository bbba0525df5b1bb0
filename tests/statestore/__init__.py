"""Tests of the state store: pure parts, the SQLite store, the service, and the gateway over real MQTT 5."""
