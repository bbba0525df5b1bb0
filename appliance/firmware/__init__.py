"""Over-the-air firmware updates for the thermostats: bundles on the gateway, chunks over MQTT 5 (docs/firmware.md).

``service`` is the ``BrokerService`` that answers the thermostats, over the sans-I/O ``protocol``;
``repository`` keeps and verifies the bundles, ``signing`` signs and checks their manifests; ``config`` is
the ``[firmware]`` section and ``cli`` the operator's ``appliance firmware`` command.
"""
