"""The MQTT wire format, sans-I/O: packet types, an incremental reader and a writer for 3.1.1 and 5."""
