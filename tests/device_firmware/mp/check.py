# Assertion helpers for the MicroPython tests (MicroPython has no unittest by default).


def eq(actual, expected) -> None:
    if actual != expected:
        raise AssertionError("%r != %r" % (actual, expected))


def raises(exc_type, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except exc_type as e:
        return e
    raise AssertionError("%s not raised" % exc_type.__name__)
