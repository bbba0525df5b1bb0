"""The hardware-in-the-loop bench: the link rig (`hil_tests.rig`) and the end-to-end scenarios."""
