# Boards run main.py at boot (deploy.py writes the same line as main.py source); `app` boots the thermostat.
import app  # noqa: F401
