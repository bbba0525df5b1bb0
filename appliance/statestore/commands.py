"""Request payloads <-> typed commands, with the protocol's exact ``-ERR`` strings for every bad request.

The parser runs in a fixed order so that each bad payload has exactly one answer:

1. not exactly one RESP3 value, not an array, an empty array, or an element that is not a bulk string
   -> ``syntax error``;
2. a verb that is not GET, SET, DEL, VDEL or KEYNOTIFY -> ``unknown command``;
3. too few or too many arguments for the verb -> ``wrong number of arguments``;
4. an empty key -> ``the key length is zero``;
5. bad SET or KEYNOTIFY options -> ``syntax error``.

Case: the protocol document tells clients to send upper-case verbs and options, yet its own examples
send ``set``/``get``/``del``/``vdel``. We accept verbs and options in any ASCII case (what Redis does, and
what keeps the document's examples working) and always *send* upper case ourselves. docs/statestore.md
records the decision.

``NEX`` takes no argument and compares with the value being set: that is what the SDK clients send
(``SET k v NEX PX 10000``), unlike the document's ``NEX <value>``. ``PX`` takes a positive whole number of
milliseconds; ``PX 0``, negative or fractional values are a ``syntax error`` (a key that expires at once
would be a DEL in disguise, and Redis refuses it too).

Pure: no I/O. The client library uses the ``encode`` methods, so both ends share one definition.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from appliance.statestore import errors, resp3
from appliance.statestore.errors import StateStoreError

MAX_PX_DIGITS = 15  # ~31,000 years: anything longer overflows the store's millisecond arithmetic


class Condition(enum.Enum):
    ALWAYS = "always"
    NX = "NX"  # only if the key does not exist
    NEX = "NEX"  # only if the key does not exist or already holds the value being set


@dataclass(frozen=True, slots=True)
class SetCommand:
    key: bytes
    value: bytes
    condition: Condition = Condition.ALWAYS
    expire_ms: int | None = None

    def encode(self) -> bytes:
        parts = [b"SET", self.key, self.value]
        if self.condition is not Condition.ALWAYS:
            parts.append(self.condition.value.encode("ascii"))
        if self.expire_ms is not None:
            parts += [b"PX", str(self.expire_ms).encode("ascii")]
        return resp3.encode_array(parts)


@dataclass(frozen=True, slots=True)
class GetCommand:
    key: bytes

    def encode(self) -> bytes:
        return resp3.encode_array([b"GET", self.key])


@dataclass(frozen=True, slots=True)
class DelCommand:
    key: bytes

    def encode(self) -> bytes:
        return resp3.encode_array([b"DEL", self.key])


@dataclass(frozen=True, slots=True)
class VDelCommand:
    key: bytes
    value: bytes

    def encode(self) -> bytes:
        return resp3.encode_array([b"VDEL", self.key, self.value])


@dataclass(frozen=True, slots=True)
class KeyNotifyCommand:
    key: bytes
    stop: bool = False

    def encode(self) -> bytes:
        return resp3.encode_array([b"KEYNOTIFY", self.key] + ([b"STOP"] if self.stop else []))


Command = SetCommand | GetCommand | DelCommand | VDelCommand | KeyNotifyCommand

# verb -> (fewest, most) array items including the verb itself
ARITY: dict[bytes, tuple[int, int]] = {
    b"GET": (2, 2),
    b"DEL": (2, 2),
    b"VDEL": (3, 3),
    b"KEYNOTIFY": (2, 3),
    b"SET": (3, 7),  # SET key value [NX|NEX] [PX ms]
}


def parse_command(payload: bytes) -> Command:
    """Parse one request payload, or raise ``StateStoreError`` with the exact ``-ERR`` string."""
    try:
        value = resp3.decode(payload)
    except resp3.Resp3Error:
        raise StateStoreError(errors.SYNTAX_ERROR) from None
    if not isinstance(value, list) or not value or not all(isinstance(item, bytes) for item in value):
        raise StateStoreError(errors.SYNTAX_ERROR)
    args: list[bytes] = value  # type: ignore[assignment]  # checked just above
    verb = args[0].upper()
    if verb not in ARITY:
        raise StateStoreError(errors.UNKNOWN_COMMAND)
    fewest, most = ARITY[verb]
    if not fewest <= len(args) <= most:
        raise StateStoreError(errors.WRONG_NUMBER_OF_ARGUMENTS)
    key = args[1]
    if not key:
        raise StateStoreError(errors.KEY_LENGTH_ZERO)
    if verb == b"GET":
        return GetCommand(key)
    if verb == b"DEL":
        return DelCommand(key)
    if verb == b"VDEL":
        return VDelCommand(key, args[2])
    if verb == b"KEYNOTIFY":
        if len(args) == 3 and args[2].upper() != b"STOP":
            raise StateStoreError(errors.SYNTAX_ERROR)
        return KeyNotifyCommand(key, stop=len(args) == 3)
    return _parse_set(key, args[2], args[3:])


def _parse_set(key: bytes, value: bytes, options: list[bytes]) -> SetCommand:
    condition = Condition.ALWAYS
    expire_ms: int | None = None
    index = 0
    while index < len(options):
        option = options[index].upper()
        if option in (b"NX", b"NEX") and condition is Condition.ALWAYS:
            condition = Condition.NX if option == b"NX" else Condition.NEX
            index += 1
        elif option == b"PX" and expire_ms is None and index + 1 < len(options):
            expire_ms = _parse_px(options[index + 1])
            index += 2
        else:  # unknown option, NX with NEX, a repeated option, or PX without its number
            raise StateStoreError(errors.SYNTAX_ERROR)
    return SetCommand(key, value, condition, expire_ms)


def _parse_px(text: bytes) -> int:
    if not text.isdigit() or len(text) > MAX_PX_DIGITS or int(text) == 0:
        raise StateStoreError(errors.SYNTAX_ERROR)
    return int(text)
