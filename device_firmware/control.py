"""What both programs a thermostat boots into do every turn: the thermostat (`thermostat.py`) and,
while an over-the-air update is installed, the updater (`ota_updater.py`), which runs INSTEAD of the
thermostat, so it cannot import it (that module's code and names are what a 64 KB heap cannot hold
beside the updater). Pure decisions and measurements, no state: one home for both.
"""

import gc


def heater_should_be_on(temp: float, set_point: float, hysteresis: float, on: bool) -> bool:
    """Switch on below set_point - hysteresis, off above set_point + hysteresis, else hold."""
    if temp <= set_point - hysteresis:
        return True
    if temp >= set_point + hysteresis:
        return False
    return on


def heap_headroom() -> tuple:
    """(gc.mem_free(), largest free block) after a collection. The largest block is found by a
    binary search of allocations, each freed (collected) before the next: the unix port's
    micropython.mem_info(1) only prints its heap map to stdout. (It used to search with the
    collector off, so every block that fitted stayed allocated and shrank the next try: the answer
    came out as free/4 or free/8, not the largest block.)"""
    gc.collect()
    free = gc.mem_free()
    low, high = 0, free
    while high - low > 16:
        mid = (low + high) // 2
        try:
            bytearray(mid)  # kept by nobody; its slot on the stack is reused before the collection below
            low = mid
        except MemoryError:
            high = mid
        gc.collect()
    return free, low
