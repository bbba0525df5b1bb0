"""The link rig: a box between the gateway's uplink and the cloud that changes the link on serial commands.

`shaping` holds the link model, `relay` the userspace TCP shaper and `netns` the kernel backend (tc and
nftables on a veth pair). `protocol` is the sans-I/O serial protocol. `program` is the rig process
(``python -m hil_tests.rig``), `client` the host side and `launcher` starts a local rig for the bench.
PROTOCOL.md documents the commands and what each backend does.
"""
