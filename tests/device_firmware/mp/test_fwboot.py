# fwboot.py's transitions under MicroPython, file by file (test_ota.py runs them on resetting boards):
# the main.py each pointer gets, a rollback from a second update to the first one's directory, a
# trial that never reached its first telemetry, and main.py put back after a power cut between files.
import json
import os
import random
import sys

import fwboot
from check import eq, raises

TRIAL_NEXT = "__import__(\"fwboot\").start()\n"


def in_flash():
    path = "/tmp/mp-fwboot-%d" % random.getrandbits(24)
    os.mkdir(path)
    os.chdir(path)


def text(name):
    with open(name) as f:
        return f.read()


def test_each_pointer_gets_its_main_py_and_the_trial_its_way_back():
    in_flash()
    fwboot.write(["0.2.0", None, 0, None, "fw/a", None])
    eq(text("firmware.txt"), "0.2.0 - 0 - fw/a -")
    eq(text("main.py.trial").endswith(TRIAL_NEXT), True)
    trial = text("main.py")
    for line in ('os.rename("main.py.trial", "main.py")', 'sys.path.insert(0, "fw/a")', 'sys.modules["fwboot"] = None',
                 "    import app", '    __import__("fwboot").reset(e)'):
        eq(line in trial, True)
    eq(fwboot.read(), ["0.2.0", None, 0, None, "fw/a", None])
    fwboot.write(["0.2.0", None, None, None, "fw/a", None])  # accepted: nothing of fwboot at boot
    eq(text("main.py").split("\n", 1)[1], 'import sys\nsys.path.insert(0, "fw/a")\nimport app\n')
    fwboot.write([None, None, None, "0.2.0", None, None])  # the deployed version
    eq(text("main.py"), "import app\n")
    eq([n for n in os.listdir(".") if n.endswith(".new")], [])


def test_a_second_update_rolls_back_to_the_first_ones_directory():
    in_flash()
    fwboot.write(["0.3.0", "0.2.0", 0, None, "fw/b", "fw/a"])
    fwboot.back(fwboot.read(), "RuntimeError: broken")
    eq(text("firmware.txt"), "0.2.0 - - 0.3.0 fw/a -")
    eq(text("main.py").endswith('sys.path.insert(0, "fw/a")\nimport app\n'), True)
    eq(json.loads(text("update.json")), {"state": "rolled_back", "version": "0.3.0", "reason": "RuntimeError: broken"})


def test_a_trial_that_never_reached_its_first_telemetry_goes_back_at_the_next_boot():
    in_flash()
    fwboot.write(["0.2.0", None, 0, None, "fw/a", None])
    os.rename("main.py.trial", "main.py")  # what the trial boot's main.py does first
    eq(raises(SystemExit, fwboot.start).args, (3,))  # the reset (exit status 3 on unix)
    eq(text("firmware.txt"), "- - - 0.2.0 - -")
    eq(text("main.py"), "import app\n")
    eq(json.loads(text("update.json"))["reason"], "no telemetry after its trial boot")


def test_start_puts_back_the_main_py_of_a_pointer_not_on_trial():
    # A power cut after the pointer left the trial (accepted) but before main.py was written.
    in_flash()
    fwboot.write(["0.2.0", None, 0, None, "fw/a", None])
    os.rename("main.py.trial", "main.py")
    fwboot.write(["0.2.0", None, None, None, "fw/a", None])
    with open("main.py", "w") as f:
        f.write(TRIAL_NEXT)
    raises(SystemExit, fwboot.start)
    eq(text("firmware.txt"), "0.2.0 - - - fw/a -")
    eq(text("main.py").endswith('sys.path.insert(0, "fw/a")\nimport app\n'), True)
    eq("update.json" in os.listdir("."), False)


def test_an_exception_out_of_an_accepted_version_goes_on_and_a_damaged_pointer_boots_the_root():
    in_flash()
    fwboot.write(["0.2.0", None, None, None, "fw/a", None])
    error = ValueError("app")
    eq(raises(ValueError, fwboot.reset, error), error)
    with open("firmware.txt", "w") as f:
        f.write("0.2.0 - 0")
    eq(fwboot.read(), [None] * 6)
    sys.modules["fwboot"] = fwboot
    fwboot.accept()  # not on trial: nothing to accept, no reset
    eq("fwboot" in sys.modules, False)
