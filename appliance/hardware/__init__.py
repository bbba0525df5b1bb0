"""Gateway hardware: status LEDs, button and modem power relay (gpiozero), cellular modem (pyserial AT)."""
