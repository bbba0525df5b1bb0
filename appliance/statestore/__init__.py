"""The state store: a key-value service spoken to over MQTT 5 request/response with RESP3 payloads."""
