# A tiny test runner for MicroPython: run every test_* function of one module and print
# "PASS name" or "FAIL name: error" lines, then "DONE"; pytest (tests/device_firmware/test_on_micropython.py)
# asserts on those lines. Usage: micropython runner.py <module>
import sys


def run(module_name: str) -> None:
    module = __import__(module_name)
    for name in sorted(dir(module)):
        if not name.startswith("test_"):
            continue
        try:
            getattr(module, name)()
            print("PASS", name)
        except Exception as e:  # report every failure, keep running the others
            print("FAIL %s: %r" % (name, e))
            sys.print_exception(e)
    print("DONE")


run(sys.argv[1])
