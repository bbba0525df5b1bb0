"""What the test suite, the benchmarks (``bench/``) and the HIL bench (``hil_tests/``) share: processes
started and stopped cleanly (the gateway, mosquitto), in-process brokers, MQTT clients that collect what
they receive, certificates, and waiting on a condition without sleeping as proof."""
