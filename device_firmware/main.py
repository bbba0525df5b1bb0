# Boards run main.py at boot (deploy.py writes the same line as main.py source). The first over-the-air
# update replaces this file with fwboot's form (ota_updater.MAIN_PY): from then on fwboot.py picks the
# version that boots. Until then nothing of it is loaded or even looked for (heap: docs/firmware.md).
import app  # noqa: F401
