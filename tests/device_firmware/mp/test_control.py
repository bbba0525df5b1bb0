# control.heap_headroom reports the largest block that can be allocated: one that size fits, one a few
# blocks larger does not. (It reported free/4 or free/8: every try that fitted stayed allocated while the
# collector was off, so later tries met a smaller heap.)
import gc

from check import eq
from control import heap_headroom, heater_should_be_on


def fits(size):
    gc.collect()
    try:
        bytearray(size)
        return True
    except MemoryError:
        return False


def test_the_largest_block_is_the_largest_that_fits():
    keep = [bytearray(64) for _ in range(200)]  # some structure in the heap
    keep = [block for i, block in enumerate(keep) if i % 3]
    free, largest = heap_headroom()
    assert 0 < largest <= free, (free, largest)
    eq(fits(largest), True)
    eq(fits(largest + 64), False)


def test_hysteresis():
    eq([heater_should_be_on(t, 20.0, 0.5, on) for t, on in ((19.5, False), (19.6, False), (19.6, True), (20.5, True))],
       [True, False, True, False])
