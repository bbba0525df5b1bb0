# Unit tests of the I/O-free part of device_firmware/statestore.py under MicroPython.
import statestore
from check import eq, raises


def test_topics():
    eq(statestore.SYSTEM_TOPIC, "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke")
    # The spec's own example.
    eq(statestore.notify_topic("client-id1", "SOMEKEY"),
       "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/636C69656E742D696431/command/notify/534F4D454B4559")
    eq(statestore.notify_topic("t-01", "t-01\\setPoint").endswith("/command/notify/742D30315C736574506F696E74"), True)
    rt = statestore.response_topic("t-01")
    eq(rt, "clients/t-01/services/statestore/_any_/command/invoke/response")
    eq(rt.startswith("clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8"), False)


def test_parse_notification_set_and_delete():
    topic = statestore.notify_topic("c", "k\\setPoint").encode()
    eq(statestore.parse_notification(topic, b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$2\r\n21\r\n"),
       (b"k\\setPoint", "SET", b"21"))
    eq(statestore.parse_notification(topic, b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n"), (b"k\\setPoint", "DELETE", None))


def test_parse_notification_rejects_malformed():
    topic = statestore.notify_topic("c", "k")
    for bad in (b"+OK\r\n", b"*2\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n", b"*2\r\n$3\r\nFOO\r\n$3\r\nSET\r\n",
                b"*2\r\n$6\r\nNOTIFY\r\n$4\r\nMOVE\r\n", b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUX\r\n$1\r\n1\r\n"):
        raises(ValueError, statestore.parse_notification, topic, bad)
    raises(ValueError, statestore.parse_notification, "other/topic", b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n")


def test_user_property_lookup():
    props = {0x26: [("a", "1"), ("__ts", "5:0:s")]}
    eq(statestore.user_property(props, "__ts"), "5:0:s")
    eq(statestore.user_property({}, "__ts"), None)
