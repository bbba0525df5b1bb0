"""The MQTT wire format, sans-I/O, for 3.1.1 and 5.

``packets`` are the control packets, the same for both versions; ``reader`` frames and parses bytes into
them incrementally; ``writer`` encodes them for a protocol level (the one place 3.1.1 loses what it cannot
say); ``properties`` are MQTT 5's properties and which packet may carry which; ``reasons`` the reason
codes and ``MqttProtocolError``, the one error bad input raises.
"""
