"""The link rig: a box between the gateway's uplink and the cloud that changes the link on serial commands.

`shaping` holds the link model, `relay` the userspace TCP shaper, `netns` and `bridge` the kernel backends
(tc and nftables on a veth pair, or on a rig box's two ports; `kernel` what they share, `claim` the one-rig-
per-port-set lock and `journal` the record that undoes a crashed rig). `protocol` is the sans-I/O serial
protocol, `serial_line` the line kept open across hang-ups. `program` is the rig process
(``python -m hil_tests.rig``), `client` the host side and `launcher` starts a local rig for the bench.
PROTOCOL.md documents the commands and what each backend does.
"""
