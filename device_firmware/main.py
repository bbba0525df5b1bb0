# Boards run main.py at boot; the application lives in thermostat.py (compiled to .mpy).
import thermostat

thermostat.main()
