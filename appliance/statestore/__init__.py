"""The state store: a key-value service spoken to over MQTT 5 request/response with RESP3 payloads.

``service`` is the ``BrokerService`` (the only part that knows MQTT); ``protocol`` the envelope it shares
with its clients; ``resp3`` the payload encoding, ``commands`` the requests, ``errors`` the ``-ERR``
strings; ``store`` the SQLite store, versioned by ``hlc`` clocks; ``notify`` KEYNOTIFY; ``acl`` who may
touch which keys; ``config`` the ``[statestore]`` section; ``cli`` the shell command; ``client`` the
client library (it imports nothing of the server).
"""
