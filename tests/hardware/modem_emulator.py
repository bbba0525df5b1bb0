"""A cellular modem on the far side of a pty pair, for driving ``appliance.hardware.modem`` for real.

The driver opens the pty's slave end with pyserial exactly as it would open ``/dev/ttyUSB2``; this thread
owns the master end and answers AT commands the way Quectel/SIMCom modems do: echo until ``ATE0``,
``\\r\\n``-framed replies, URCs at any time. Knobs make it misbehave the ways field modems do: garbage
bytes, replies split into several writes, URCs in the middle of a reply, and hanging (reading but never
answering) until it is power-cycled, after which it boots and says ``RDY``.
"""

from __future__ import annotations

import os
import select
import threading
import time
import tty


class ModemEmulator:
    def __init__(self) -> None:
        self._master, self._slave = os.openpty()
        tty.setraw(self._slave)  # no line discipline echo before pyserial configures the port
        self.port = os.ttyname(self._slave)
        self._stop_read, self._stop_write = os.pipe()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="modem-emulator", daemon=True)
        self._buffer = b""
        # Behaviour knobs, changed by tests at any time.
        self.echo = True
        self.csq = "21,99"
        self.creg = 1
        self.cereg = 1
        self.cops = '0,0,"Emu Mobile",7'
        self.hung = False
        self.garbage = b""  # sent before every reply
        self.split_replies = False  # send replies a few bytes per write
        self.urc_inside_reply: str | None = None  # sent between a reply's info line and its OK
        self.stays_dead = False  # a power cycle does not revive it
        self.powered = True
        self.boots = 0
        self.commands: list[str] = []

    def start(self) -> ModemEmulator:
        self._thread.start()
        return self

    def close(self) -> None:
        os.write(self._stop_write, b"x")
        self._thread.join(timeout=5)
        for fd in (self._master, self._slave, self._stop_read, self._stop_write):
            os.close(fd)

    # -- power, as seen through the relay ----------------------------------------------------------

    def power_off(self) -> None:
        with self._lock:
            self.powered = False

    def power_on(self) -> None:
        with self._lock:
            self.powered = True
            if self.stays_dead:
                return
            self.hung = False
            self.echo = True
            self.boots += 1
        self._write(b"\r\nRDY\r\n")

    def send_urc(self, line: str) -> None:
        self._write(f"\r\n{line}\r\n".encode())

    # -- the AT side -------------------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            ready, _, _ = select.select([self._master, self._stop_read], [], [])
            if self._stop_read in ready:
                return
            try:
                data = os.read(self._master, 1024)
            except OSError:
                return
            self._buffer += data
            while b"\r" in self._buffer:
                line, self._buffer = self._buffer.split(b"\r", 1)
                self._command(line.decode("ascii", errors="replace").strip())

    def _command(self, command: str) -> None:
        with self._lock:
            if not self.powered or self.hung:
                return
            self.commands.append(command)
            echo = self.echo
        if not command:
            return
        reply = self._reply(command.upper())
        out = (command.encode() + b"\r" if echo else b"") + self.garbage + reply
        self._write(out, split=self.split_replies)

    def _reply(self, command: str) -> bytes:
        info: list[str] = []
        result = "OK"
        if command in ("AT", "AT+CREG=1", "AT+CEREG=1"):
            pass
        elif command == "ATE0":
            self.echo = False
        elif command == "AT+CSQ":
            info = [f"+CSQ: {self.csq}"]
        elif command == "AT+CREG?":
            info = [f"+CREG: 1,{self.creg}"]
        elif command == "AT+CEREG?":
            info = [f"+CEREG: 1,{self.cereg}"]
        elif command == "AT+COPS?":
            info = [f"+COPS: {self.cops}"]
        else:
            result = "ERROR"
        body = b"".join(f"\r\n{line}\r\n".encode() for line in info)
        if self.urc_inside_reply:
            body += f"\r\n{self.urc_inside_reply}\r\n".encode()
        return body + f"\r\n{result}\r\n".encode()

    def _write(self, data: bytes, split: bool = False) -> None:
        if not split:
            os.write(self._master, data)
            return
        for start in range(0, len(data), 3):
            os.write(self._master, data[start : start + 3])
            time.sleep(0.001)  # separate reads on the driver side, so lines really arrive in pieces
