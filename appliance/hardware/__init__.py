"""Gateway hardware: status LEDs, button and modem power relay (gpiozero), cellular modem (pyserial AT).

``service`` is the ``BrokerService`` that runs it; ``gpio`` the LEDs, button and relay; ``modem`` the
asyncio driver of the modem over the sans-I/O ``at`` protocol, whose replies ``modem_status`` reads;
``factory_reset`` what the button's long press does; ``config`` the ``[hardware]`` section.
"""
