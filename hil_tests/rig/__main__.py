"""``python -m hil_tests.rig``: see `hil_tests.rig.program`."""

from hil_tests.rig.program import main

main()
