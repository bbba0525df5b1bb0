"""What the broker does with each packet a client sends, sans-I/O.

``dispatch`` is the one switch from packet type to handler (mosquitto's ``read_handle.c``); ``connect``
(CONNECT, AUTH), ``publish`` (PUBLISH and the QoS 1/2 acknowledgement flows) and ``subscribe``
(SUBSCRIBE, UNSUBSCRIBE) are the handlers. A handler changes session and routing state and queues the
packets to send; it never touches a socket, the clock or SQLite directly.
"""
