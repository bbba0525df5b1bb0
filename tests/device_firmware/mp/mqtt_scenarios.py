# MicroPython side of tests/device_firmware/test_mqtt5_mosquitto.py: one scenario per run, driving
# device_firmware/mqtt5.py against a real mosquitto and printing what happened, one event a line.
# Usage: micropython mqtt_scenarios.py <scenario> <host> <port> [client id]
import json
import sys
import time

import mqtt5
from mqtt5_codec import CORRELATION_DATA, RESPONSE_TOPIC, USER_PROPERTY, CONTENT_TYPE, PINGRESP

scenario, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
client_id = sys.argv[4] if len(sys.argv) > 4 else "fw-" + scenario


def show(props) -> dict:
    out = {}
    for key, value in props.items():
        out[str(key)] = [list(p) for p in value] if key == USER_PROPERTY else (
            value.hex() if isinstance(value, bytes) else value)
    return out


def echo():
    """Print every message; answer requests (response topic) like an RPC server; stop on fw/in/stop."""
    client = mqtt5.MQTTClient(client_id, host, port, keepalive=30)
    done = []

    def on_message(topic, payload, props):
        payload = bytes(payload)  # a view into the receive buffer: copy what outlives the call
        print("MSG " + json.dumps({"topic": topic.decode(), "payload": payload.decode(), "props": show(props)}))
        if RESPONSE_TOPIC in props:
            client.publish(props[RESPONSE_TOPIC], b"re:" + payload, qos=1,
                           props={CORRELATION_DATA: props.get(CORRELATION_DATA, b""), USER_PROPERTY: [("from", "fw")]})
        if topic == b"fw/in/stop":
            done.append(1)

    client.set_callback(on_message)
    print("CONNACK present=%s" % client.connect())
    print("SUBSCRIBED granted=%d" % client.subscribe("fw/in/#", 1))
    while not done:
        client.wait_msg()
    client.publish("fw/out/q0", b"zero", qos=0)
    client.publish("fw/out/q1", b"one", qos=1, props={USER_PROPERTY: [("a", "1"), ("a", "2")], CONTENT_TYPE: "text/plain"})
    client.disconnect()
    print("BYE")


def keepalive():
    client = mqtt5.MQTTClient(client_id, host, port, keepalive=1)
    client.connect()
    print("CONNECTED")
    try:
        while True:
            client.check_msg()
            if client.wait_msg(50) == PINGRESP:
                print("PINGRESP")
    except OSError as e:
        print("DEAD errno=%d" % e.args[0])


def session():
    phase = sys.argv[5]
    client = mqtt5.MQTTClient(client_id, host, port, session_expiry=60)
    client.set_callback(lambda t, p, pr: print("MSG %s %s" % (t.decode(), bytes(p).decode())))
    print("CONNACK present=%s" % client.connect(clean_session=False))
    if phase == "1":
        client.subscribe("fw/s", 1)
        client.disconnect()
        print("BYE")
    else:
        client.wait_msg(5000)
        client.disconnect()


def reconnect():
    client = mqtt5.MQTTClient(client_id, host, port, keepalive=30, timeout_ms=1000)
    client.set_callback(lambda t, p, pr: print("MSG %s %s" % (t.decode(), bytes(p).decode())))
    client.connect()
    client.subscribe("fw/r", 1)
    print("READY")
    while True:
        try:
            client.wait_msg()
        except OSError as e:
            print("LOST errno=%d" % e.args[0])
            while True:
                try:
                    client.connect()
                    break
                except OSError:
                    time.sleep_ms(50)
            print("RECONNECTED")
            client.subscribe("fw/r", 1)
            print("READY")


def refused_connect():
    try:
        mqtt5.MQTTClient(client_id, host, port).connect()
        print("CONNECTED")
    except mqtt5.MQTTException as e:
        print("CONNECT refused code=0x%02x" % e.code)


def refusals():
    client = mqtt5.MQTTClient(client_id, host, port)
    client.connect()
    for topic in ("fw/allowed", "denied/x"):
        try:
            client.publish(topic, b"x", qos=1)
            print("PUBACK %s ok" % topic)
        except mqtt5.MQTTException as e:
            print("PUBACK %s refused code=0x%02x" % (topic, e.code))
    try:
        client.publish("fw/big", b"x" * 2000)
    except ValueError as e:
        print("TOO BIG %s" % e)
    client.ping()
    print("PING answered=%s" % (client.wait_msg(2000) == PINGRESP))
    client.disconnect()
    print("BYE")


{"echo": echo, "keepalive": keepalive, "session": session, "reconnect": reconnect, "refusals": refusals,
 "refused_connect": refused_connect}[scenario]()
