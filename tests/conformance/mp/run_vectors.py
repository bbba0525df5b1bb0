# Runs conformance cases through the firmware's codecs under the real MicroPython, one process for all.
# Usage: micropython run_vectors.py <job.json>, with MICROPYPATH pointing at device_firmware/.
# The job (written by tests/conformance/test_firmware_codecs.py from the vector files, defaults filled in)
# lists cases per suite; for each, one JSON line {"suite", "id", "outcome"} is printed, then "DONE".
# This file only calls the firmware and reports what it made of each case; every comparison with the
# vectors is made in pytest. A failure nobody foresaw is reported as {"crash": ...}, never hidden.
import binascii
import json
import sys
from collections import OrderedDict

import hlc
import mqtt5_codec as codec
import resp3
import statestore

_TYPES = {codec.CONNACK: "CONNACK", codec.PUBLISH: "PUBLISH", codec.PUBACK: "PUBACK", codec.SUBACK: "SUBACK",
          codec.PINGRESP: "PINGRESP", codec.DISCONNECT: "DISCONNECT"}


def hexed(data):
    return {"hex": binascii.hexlify(bytes(data)).decode()}


def unhex(value):
    return binascii.unhexlify(value["hex"]) if isinstance(value, dict) else value.encode()


def emit(suite, case_id, outcome):
    print(json.dumps({"suite": suite, "id": case_id, "outcome": outcome}))


def crash(e):
    return {"crash": "%s: %s" % (type(e).__name__, e)}


# --- MQTT ----------------------------------------------------------------------------------------------

def properties(props):
    """[[id, value], ...] by id; repeated ones (lists) in their wire order. (MicroPython's sort is
    not stable, so ids are sorted and each one's values expanded in order.)"""
    pairs = []
    for pid in sorted(props):
        value = props[pid]
        for item in value if isinstance(value, list) else (value,):
            if isinstance(item, tuple):
                item = list(item)
            elif isinstance(item, (bytes, bytearray, memoryview)):
                item = hexed(item)
            pairs.append([pid, item])
    return pairs


def fields(kind, decoded):
    name = _TYPES[kind]
    if kind == codec.CONNACK:
        present, reason, props = decoded
        return {"type": name, "session_present": present, "reason_code": reason, "properties": properties(props)}
    if kind == codec.PUBLISH:
        topic, payload, qos, pid, retain, props = decoded
        return {"type": name, "topic": bytes(topic).decode(), "payload": hexed(payload), "qos": qos,
                "packet_id": pid if qos else None, "retain": retain, "properties": properties(props)}
    if kind == codec.PUBACK:
        pid, reason, props = decoded
        return {"type": name, "packet_id": pid, "reason_code": reason, "properties": properties(props)}
    if kind == codec.SUBACK:
        pid, reasons, props = decoded
        return {"type": name, "packet_id": pid, "reason_codes": reasons, "properties": properties(props)}
    if kind == codec.DISCONNECT:
        reason, props = decoded
        return {"type": name, "reason_code": reason, "properties": properties(props)}
    return {"type": name}


def frame(chunks):
    """What the client makes of these reads: Framer, then decode_packet, as MQTTClient does."""
    framer = codec.Framer(1024)
    outcome = {"incomplete": True}
    try:
        for chunk in chunks:
            space = framer.space()
            space[:len(chunk)] = chunk
            framer.added(len(chunk))
            packet = framer.next_packet()
            if packet is not None:
                outcome = {"packet": fields(packet[0], codec.decode_packet(*packet))}
                if framer.next_packet() is not None or framer.start != framer.end:
                    return {"crash": "bytes left after the packet"}
    except codec.MQTTProtocolError as e:
        return {"error": e.args[0]}  # the MQTT 5 reason code
    except Exception as e:
        return crash(e)
    return outcome


def mqtt_decode(case):
    data = binascii.unhexlify(case["hex"])
    whole = frame([data])
    byte_by_byte = frame([data[i:i + 1] for i in range(len(data))])
    if whole != byte_by_byte:
        return {"crash": "whole %r but byte by byte %r" % (whole, byte_by_byte)}
    return whole


def encode_props(pairs):
    """An insertion-ordered dict, so the packer writes them in the vector's order."""
    props = OrderedDict()
    for pid, value in pairs:
        if isinstance(value, list):  # a user property
            props.setdefault(pid, []).append(tuple(value))
        elif pid in props:
            return None  # a second subscription identifier: the packer takes one
        else:
            props[pid] = unhex(value) if isinstance(value, dict) else value
    return props


def mqtt_encode(case):
    """The packet built by the firmware's Packer, or {"skip": why} when its API cannot say it."""
    p = case["packet"]
    kind = p["type"]
    props = encode_props(p.get("properties", []))
    packer = codec.Packer(1024)
    if props is None:
        return {"skip": "the firmware sends at most one subscription identifier"}
    if kind == "CONNECT":
        if p["will"] is not None:
            return {"skip": "the firmware sends no will"}
        password = None if p["password"] is None else unhex(p["password"])
        wire = packer.connect(p["client_id"], p["keep_alive"], p["clean_start"], props, p["username"], password)
    elif kind == "PUBLISH":
        if p["dup"]:
            return {"skip": "the firmware never resends, so never sets DUP"}
        wire = packer.publish(p["topic"], unhex(p["payload"]), p["qos"], p["retain"], p["packet_id"] or 0, props)
    elif kind == "SUBSCRIBE":
        subs = p["subscriptions"]
        if len(subs) != 1 or subs[0]["no_local"] or subs[0]["retain_as_published"] or subs[0]["retain_handling"]:
            return {"skip": "the firmware subscribes one filter at a time, with QoS as its only option"}
        wire = packer.subscribe(p["packet_id"], subs[0]["topic_filter"], subs[0]["qos"], props)
    elif kind == "PUBACK":
        if props:
            return {"skip": "the firmware sends PUBACK without properties"}
        wire = packer.puback(p["packet_id"], p["reason_code"])
    elif kind == "DISCONNECT":
        if props:
            return {"skip": "the firmware sends DISCONNECT without properties"}
        wire = packer.disconnect(p["reason_code"])
    elif kind == "PINGREQ":
        wire = packer.pingreq()
    else:
        return {"skip": "a client does not send %s" % kind}
    return {"hex": binascii.hexlify(bytes(wire)).decode()}


# --- RESP3, HLC, state store ---------------------------------------------------------------------------

def value(v):
    if isinstance(v, str):
        return {"simple": v}
    if isinstance(v, resp3.Resp3Error):
        return {"error": str(v)}
    if isinstance(v, resp3.TooLong):
        return {"too_long": v.size}
    if isinstance(v, int):
        return {"integer": v}
    if isinstance(v, (bytes, memoryview)):
        return {"bulk_hex": binascii.hexlify(bytes(v)).decode()}
    if isinstance(v, list):
        return [value(item) for item in v]
    return v


def resp3_decode(case):
    data = binascii.unhexlify(case["hex"])
    outcomes = []
    for payload in (data, memoryview(bytearray(data))):  # bytes, and in place as the client reads replies
        try:
            outcomes.append({"value": value(statestore.decode_payload(payload))})
        except ValueError:
            outcomes.append({"error": True})
        except Exception as e:
            outcomes.append(crash(e))
    if outcomes[0] != outcomes[1]:
        return {"crash": "bytes gave %r, a memoryview %r" % tuple(outcomes)}
    return outcomes[0]


def resp3_encode(case):
    return {"hex": binascii.hexlify(resp3.encode_command(*[unhex(arg) for arg in case["command"]])).decode()}


def hlc_parse(case):
    try:
        return {"hlc": list(hlc.parse(case["text"]))}
    except ValueError:
        return {"error": True}
    except Exception as e:
        return crash(e)


def hlc_format(case):
    clock = hlc.HLC(case["hlc"][2])
    clock.wall, clock.counter = case["hlc"][0], case["hlc"][1]
    return {"text": str(clock)}


def notify_topic(case):
    return {"topic": statestore.notify_topic(case["client_id"], unhex(case["key"]))}


def notification(case):
    payload = memoryview(bytearray(binascii.unhexlify(case["payload_hex"])))
    try:
        key, operation, v = statestore.parse_notification(case["topic"], payload)
    except ValueError:
        return {"error": True}
    except Exception as e:
        return crash(e)
    return {"key": hexed(key), "operation": operation, "value": None if v is None else hexed(v)}


def response_topic(case):
    return {"topic": statestore.response_topic(case["client_id"])}


SUITES = {"mqtt_decode": mqtt_decode, "mqtt_encode": mqtt_encode, "resp3_decode": resp3_decode,
          "resp3_encode": resp3_encode, "hlc_parse": hlc_parse, "hlc_format": hlc_format,
          "notify_topic": notify_topic, "notification": notification, "response_topic": response_topic}


def main(path):
    with open(path) as f:
        job = json.load(f)
    for suite in job:
        run = SUITES[suite]
        for case in job[suite]:
            try:
                outcome = run(case)
            except Exception as e:  # a runner failure is reported with the case, not lost
                outcome = crash(e)
            emit(suite, case["id"], outcome)
    print("DONE")


main(sys.argv[1])
