"""Sessions and how connections live and end, sans-I/O.

``session`` is what a client's session still owes (in-flight messages, the offline queue, subscriptions);
``lifecycle`` ends connections and sessions (bad input, DISCONNECT, takeover, expiry, wills);
``keepalive`` holds every connection's deadline; ``will`` the wills waiting out their delay;
``backpressure`` holds publishers back for the clients they congest; ``backlog`` the packets of a
connection that wait their turn. Time comes through ``appliance.runtime.Runtime`` only.
"""
