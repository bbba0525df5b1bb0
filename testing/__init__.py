"""What the test suite, the benchmarks (``bench/``) and the HIL bench (``hil_tests/``) share: processes
started and stopped cleanly (the gateway, mosquitto), in-process brokers, the MQTT collector
(``collector``: one client that subscribes and keeps what it receives), a device that publishes and
waits for each PUBACK (``device``), certificates, and waiting on a condition without sleeping as proof
(``waiting``)."""
