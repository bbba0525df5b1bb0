# Boards run main.py at boot (deploy.py writes the same lines as main.py source). fwboot picks the
# firmware version (the deployed one, or an update in firmware/<version>/); it stays loaded only while
# that version is on trial, and rolls it back if the app fails. `app` boots the thermostat.
import gc
import sys
import fwboot

if not fwboot.start():
    del sys.modules["fwboot"]
del fwboot
gc.collect()  # before the app: what fwboot left is gone, not pinned under the app's first objects
try:
    import app  # noqa: F401
except Exception as e:
    import fwboot
    fwboot.reset(e)
