# Unit tests of device_firmware/mqtt5_codec.py, run by runner.py under MicroPython.
import binascii

import mqtt5_codec as codec
from check import eq, raises


def h(text: str) -> bytes:
    return binascii.unhexlify(text.replace(" ", ""))


def frame_all(data: bytes, chunk: int, size: int = 256) -> list:
    """Feed data to a Framer `chunk` bytes at a time; return (type, flags, body bytes) of each packet."""
    framer = codec.Framer(size)
    packets = []
    for i in range(0, len(data), chunk):
        piece = data[i:i + chunk]
        space = framer.space()
        space[:len(piece)] = piece
        framer.added(len(piece))
        while True:
            packet = framer.next_packet()
            if packet is None:
                break
            packets.append((packet[0], packet[1], bytes(packet[2])))
    return packets


def test_varint_boundaries():
    buf = bytearray(4)
    for value, wire in ((0, "00"), (127, "7f"), (128, "8001"), (16383, "ff7f"), (16384, "808001"),
                        (2097151, "ffff7f"), (2097152, "80808001"), (268435455, "ffffff7f")):
        end = codec.put_varint(buf, 0, value)
        eq(bytes(buf[:end]), h(wire))
        eq(codec.varint_size(value), end)
        eq(codec.get_varint(buf, 0, end), (value, end))
    raises(ValueError, codec.varint_size, 268435456)


def test_varint_longer_than_four_bytes_is_an_error():
    raises(codec.MQTTProtocolError, codec.get_varint, h("ffffffff7f"), 0, 5)


def test_varint_incomplete_needs_more():
    eq(codec.get_varint(h("ff"), 0, 1), (None, 1))


def test_connect_minimal_matches_spec_layout():
    packer = codec.Packer(64)
    eq(bytes(packer.connect("c1", 60, True)), h("10 0f 0004 4d515454 05 02 003c 00 0002 6331"))


def test_connect_with_properties_and_credentials():
    packer = codec.Packer(128)
    packet = bytes(packer.connect(b"c", 10, False, {codec.SESSION_EXPIRY: 3600, codec.RECEIVE_MAXIMUM: 8},
                                  user="u", password=b"p"))
    eq(packet[9], 0xC0)  # flags: user 0x80 | password 0x40
    eq(packet[12], 8)  # MicroPython dicts are unordered: compare the decoded block
    eq(codec.get_props(packet, 12, 21), ({codec.SESSION_EXPIRY: 3600, codec.RECEIVE_MAXIMUM: 8}, 21))
    eq(packet[21:], h("0001 63 0001 75 0001 70"))
    eq(packet[1], len(packet) - 2)


def test_publish_qos1_with_properties_round_trips_through_framer():
    packer = codec.Packer(256)
    props = {codec.RESPONSE_TOPIC: "r/t", codec.CORRELATION_DATA: b"\x00\xff",
             codec.USER_PROPERTY: [("__ts", "1:2:n"), ("k", "v")], codec.CONTENT_TYPE: "application/json"}
    wire = bytes(packer.publish("a/b", b"payload", 1, True, 0x1234, props))
    eq(wire[0], 0x33)
    (kind, flags, body), = frame_all(wire, 100)
    eq(kind, codec.PUBLISH)
    topic, payload, qos, pid, retain, got = codec.decode_publish(flags, body)
    eq((topic, payload, qos, pid, retain), (b"a/b", b"payload", 1, 0x1234, True))
    eq(got, props)


def test_publish_qos0_has_no_packet_id():
    wire = bytes(codec.Packer(64).publish("t", b"x", 0, False, 0))
    eq(wire, h("30 05 0001 74 00 78"))


def test_large_publish_uses_multi_byte_remaining_length():
    packer = codec.Packer(400)
    wire = bytes(packer.publish("t", b"x" * 300, 0, False, 0))
    eq(wire[:3], h("30 b0 02"))  # 304 = 0x130 -> b0 02
    (kind, flags, body), = frame_all(wire, 7, 400)
    eq(codec.decode_publish(flags, body)[1], b"x" * 300)


def test_packet_too_big_for_send_buffer_raises_before_writing():
    packer = codec.Packer(32)
    before = bytes(packer.buf)
    raises(ValueError, packer.publish, "t", b"x" * 40, 0, False, 0)
    eq(bytes(packer.buf), before)


def test_framer_assembles_byte_by_byte_and_several_per_read():
    wire = h("d000") + bytes(codec.Packer(64).publish("t", b"x", 1, False, 7)) + h("4002 0007")
    for chunk in (1, 2, 3, len(wire)):
        eq([p[0] for p in frame_all(wire, chunk)], [codec.PINGRESP, codec.PUBLISH, codec.PUBACK])


def frame_oversized(wire: bytes, chunk: int, size: int) -> list:
    """Like frame_all, but decodes each PUBLISH at once (its views die with the next read):
    (topic, payload bytes or ("oversized", size, head bytes)) per PUBLISH, type for the others."""
    framer = codec.Framer(size)
    seen = []
    i = 0
    while i < len(wire):
        space = framer.space()  # a socket read: at most what the buffer has room for
        piece = wire[i:i + min(chunk, len(space))]
        i += len(piece)
        space[:len(piece)] = piece
        framer.added(len(piece))
        while True:
            packet = framer.next_packet()
            if packet is None:
                break
            kind, flags, body, length = packet
            if kind != codec.PUBLISH:
                seen.append(kind)
                continue
            topic, payload, _, _, _, _ = codec.decode_publish(flags, body, length)
            if isinstance(payload, codec.Oversized):
                seen.append((topic, ("oversized", payload.size, bytes(payload.head))))
            else:
                seen.append((topic, bytes(payload)))
    return seen


def test_framer_hands_out_the_head_of_a_packet_larger_than_its_buffer_and_skips_the_rest():
    big = bytes(codec.Packer(2048).publish("big", bytes(range(256)) * 6, 1, False, 9))
    small = bytes(codec.Packer(64).publish("s", b"after", 0, False, 0))
    wire = small + big + h("d000") + small
    for chunk in (1, 7, 64, 100, len(wire)):
        seen = frame_oversized(wire, chunk, 64)
        head = 64 - 3 - (2 + 3 + 2 + 1)  # buffer - fixed header - (topic, packet id, no properties)
        eq(seen, [(b"s", b"after"), (b"big", ("oversized", 1536, bytes(range(head)))), codec.PINGRESP,
                  (b"s", b"after")])


def test_publish_payload_is_a_view_into_the_receive_buffer_not_a_copy():
    framer = codec.Framer(64)
    wire = bytes(codec.Packer(64).publish("t", b"value", 0, False, 0))
    framer.space()[:len(wire)] = wire
    framer.added(len(wire))
    kind, flags, body, length = framer.next_packet()
    payload = codec.decode_publish(flags, body, length)[1]
    eq(type(payload), memoryview)
    framer.buf[len(wire) - 5] = ord("V")
    eq(bytes(payload), b"Value")


def test_puback_short_form_means_success():
    eq(codec.decode_puback(h("0007")), (7, 0, {}))
    eq(bytes(codec.Packer(16).puback(7)), h("40 02 0007"))


def test_puback_failure_with_reason_string():
    pid, reason, props = codec.decode_puback(h("0009 87 06 1f 0003 6e6f70"))
    eq((pid, reason, props), (9, 0x87, {codec.REASON_STRING: "nop"}))


def test_subscribe_and_suback():
    eq(bytes(codec.Packer(32).subscribe(3, "a/#", 1)), h("82 09 0003 00 0003 612f23 01"))
    eq(codec.decode_suback(h("0003 00 01 80")), (3, [1, 0x80], {}))


def test_connack_with_properties():
    present, reason, props = codec.decode_connack(h("01 00 08 13 001e 27 00000400"))
    eq((present, reason), (True, 0))
    eq(props, {codec.SERVER_KEEP_ALIVE: 30, codec.MAXIMUM_PACKET_SIZE: 1024})


def test_connack_refused():
    eq(codec.decode_connack(h("00 87 00"))[1], 0x87)


def test_disconnect_forms():
    eq(codec.decode_disconnect(b""), (0, {}))
    eq(codec.decode_disconnect(h("8e")), (0x8E, {}))
    eq(bytes(codec.Packer(16).disconnect()), h("e0 00"))  # reason 0, no properties: the short form
    eq(bytes(codec.Packer(16).disconnect(0x04)), h("e0 01 04"))
    eq(bytes(codec.Packer(16).pingreq()), h("c0 00"))


def test_unknown_property_is_a_protocol_error():
    raises(codec.MQTTProtocolError, codec.get_props, h("02 7f 00"), 0, 3)


def test_truncated_property_block_is_a_protocol_error():
    raises(codec.MQTTProtocolError, codec.get_props, h("05 08 0003 61"), 0, 5)


def test_truncated_publish_topic_is_a_protocol_error():
    raises(codec.MQTTProtocolError, codec.decode_publish, 0, memoryview(h("0005 6162")))


def test_publish_qos3_is_a_protocol_error():
    raises(codec.MQTTProtocolError, codec.decode_publish, 6, memoryview(h("0001 61 00")))


def test_every_property_kind_round_trips():
    props = {0x01: 1, 0x02: 70000, 0x03: "ct", 0x08: "rt", 0x09: b"\x00", 0x0B: 300, 0x11: 5, 0x12: "id",
             0x13: 30, 0x15: "m", 0x16: b"d", 0x17: 1, 0x18: 9, 0x19: 1, 0x1A: "ri", 0x1C: "sr", 0x1F: "rs",
             0x21: 10, 0x22: 11, 0x23: 12, 0x24: 1, 0x25: 0, 0x26: [("a", "b")], 0x27: 1024, 0x28: 1,
             0x29: 1, 0x2A: 0}
    buf = bytearray(256)
    size = codec.props_size(props)
    end = codec.put_props(buf, 0, props, size)
    decoded = dict(props)
    decoded[0x0B] = [300]  # subscription identifiers decode to a list: a PUBLISH may carry several
    eq(codec.get_props(buf, 0, end), (decoded, end))


def test_packing_an_unknown_property_is_refused():
    raises(ValueError, codec.props_size, {0x7F: 1})


def receive(wire: bytes):
    """What MQTTClient makes of these bytes: every packet framed and decoded, or the first error."""
    framer = codec.Framer(256)
    decoded = []
    space = framer.space()
    space[:len(wire)] = wire
    framer.added(len(wire))
    while True:
        packet = framer.next_packet()
        if packet is None:
            return decoded
        decoded.append(codec.decode_packet(*packet))


def test_decode_packet_refuses_hostile_bytes_with_protocol_errors_only():
    # Mutations of packets a client receives, and plain garbage: the one exception allowed is
    # MQTTProtocolError (the thermostat drops the connection on it); anything else would reach the
    # main loop's last-resort handler as a fault.
    import random
    random.seed(13)
    packer = codec.Packer(128)
    seeds = [h("20 08 00 87 05 1f 0002 6e6f"), h("90 0a 0002 04 1f 0001 78 00 02 87"), h("40 08 000a 97 04 1f 0001 71"),
             h("e0 06 8e 04 1f 0001 78"), h("d0 00"),
             bytes(packer.publish("a/b", b"x", 1, True, 10, {codec.RESPONSE_TOPIC: "r", codec.CORRELATION_DATA: b"\x01",
                                                             codec.USER_PROPERTY: [("k", "v")]}))]
    for i in range(3000):
        wire = bytearray(seeds[i % len(seeds)])
        for _ in range(1 + random.getrandbits(2)):
            wire[random.randrange(len(wire))] = random.getrandbits(8)
        if i % 3 == 0:
            wire = wire[:random.randrange(len(wire) + 1)]
        if i % 7 == 0:
            wire = bytearray(random.getrandbits(8) for _ in range(random.randrange(1, 40)))
        try:
            receive(bytes(wire))
        except codec.MQTTProtocolError:
            pass
        except Exception as e:
            raise AssertionError("%r from %s" % (e, binascii.hexlify(wire)))
