"""The gateway's MQTT 5 / 3.1.1 broker.

Layers, from the wire inwards (each a subpackage whose ``__init__`` names its parts):

- ``codec``: the MQTT wire format, sans-I/O.
- ``transport``: sockets, TLS, WebSocket, and the state of one connection.
- ``security``: passwords and per-topic ACLs.
- ``handlers``: one handler per packet type, behind one dispatch switch.
- ``sessions``: session state, keep-alive, wills, backpressure, how connections end.
- ``routing``: topics, subscriptions, retained messages, deliveries.
- ``persistence``: ``broker.db``, committed before anything is acknowledged.

``broker`` ties them together (dispatch, the flush that commits before it writes, the tick) and is the
``context.HandlerContext`` the handlers, sessions and persistence are given; ``api`` and
``request_envelope`` are the contract with the services that live in the broker's process; ``config`` is
the ``[broker]`` section; ``sys_topics`` the ``$SYS`` statistics; ``cache_bounds`` how every cache keyed
by what a client sends is bounded in bytes. Time and scheduling come from
``appliance.runtime``.
"""
