# Unit tests of device_firmware/hlc.py under MicroPython: format and the HLC paper's rules.
import hlc
from check import eq, raises


class Clock:
    def __init__(self, now: int):
        self.now = now

    def __call__(self) -> int:
        return self.now


def test_format_is_zero_padded_like_the_real_clients():
    clock = hlc.HLC("StateStore", clock=lambda: 1696374425000)
    clock.send()
    clock.send()
    eq(str(clock), "001696374425000:00001:StateStore")


def test_parse_accepts_padded_and_unpadded():
    eq(hlc.parse("001696374425000:00001:StateStore"), (1696374425000, 1, "StateStore"))
    eq(hlc.parse(b"1696374425000:0:Client1"), (1696374425000, 0, "Client1"))
    eq(hlc.parse("1:2:node:with:colons"), (1, 2, "node:with:colons"))


def test_parse_rejects_malformed():
    for bad in ("", "1:2", "a:1:n", "1:b:n", "1:2:", "-1:0:n"):
        raises(ValueError, hlc.parse, bad)


def test_send_uses_wall_clock_then_counts_when_it_stands_still():
    clock = Clock(1000)
    h = hlc.HLC("dev", clock)
    eq(h.send(), "000000000001000:00000:dev")
    eq(h.send(), "000000000001000:00001:dev")
    clock.now = 900  # wall clock stepped back: the HLC does not
    eq(h.send(), "000000000001000:00002:dev")
    clock.now = 1001
    eq(h.send(), "000000000001001:00000:dev")


def test_receive_from_peer_ahead_adopts_its_time():
    clock = Clock(1000)
    h = hlc.HLC("dev", clock)
    h.send()
    h.receive("000000000001500:00007:StateStore")
    eq((h.wall, h.counter), (1500, 8))
    eq(h.send(), "000000000001500:00009:dev")


def test_receive_equal_walls_takes_max_counter_plus_one():
    clock = Clock(1000)
    h = hlc.HLC("dev", clock)
    h.send(); h.send(); h.send()  # 1000:2
    h.receive("1000:1:x")
    eq((h.wall, h.counter), (1000, 3))
    h.receive("1000:9:x")
    eq((h.wall, h.counter), (1000, 10))


def test_receive_older_peer_increments_own_counter():
    clock = Clock(1000)
    h = hlc.HLC("dev", clock)
    h.send()
    h.receive("500:4:x")
    eq((h.wall, h.counter), (1000, 1))


def test_receive_when_local_clock_is_ahead_of_both_resets_counter():
    clock = Clock(1000)
    h = hlc.HLC("dev", clock)
    h.receive("900:4:x")
    eq((h.wall, h.counter), (1000, 0))


def test_receive_refuses_peer_too_far_ahead():
    clock = Clock(1000)
    h = hlc.HLC("dev", clock)
    raises(ValueError, h.receive, "61001:0:x")
    eq(h.wall, 0)


def test_wall_ms_is_unix_epoch_milliseconds():
    now = hlc.wall_ms()
    eq(now > 1600000000000, True)  # after 2020: epoch 1970, milliseconds


def test_parse_takes_at_most_18_digits_per_number_like_the_gateway():
    eq(hlc.parse("999999999999999999:999999999999999999:n"), (999999999999999999, 999999999999999999, "n"))
    raises(ValueError, hlc.parse, "1234567890123456789:0:n")
    raises(ValueError, hlc.parse, "1:1234567890123456789:n")
