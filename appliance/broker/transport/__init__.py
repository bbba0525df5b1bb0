"""Bytes in and out: the only socket code of the broker, and the protocol state of one connection.

``server`` holds the TCP/TLS listeners and one protocol object per client; ``websocket`` carries MQTT
over RFC 6455; ``link`` is what the broker needs from a socket; ``connection`` what a connection has
agreed (sans-I/O); ``certificates`` reads the validity dates of the TLS certificates served or trusted.
"""
