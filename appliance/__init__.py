"""Edge gateway appliance: MQTT broker, state store, store-and-forward and hardware glue."""

__version__ = "0.1.0"
