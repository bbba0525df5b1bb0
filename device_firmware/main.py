# Boards run main.py at boot (deploy.py writes the same line as main.py source). From the first
# over-the-air update on, fwboot.py writes this file in the form the version to boot needs (fwboot.write):
# an accepted update only adds its directory to sys.path. Nothing of fwboot is loaded or looked for here.
import app  # noqa: F401
