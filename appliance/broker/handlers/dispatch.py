"""Which handler takes which packet type: mosquitto's ``read_handle.c`` as a table.

The core (``broker.py``) looks every packet up here after checking it against the connection's state
table (``session.ALLOWED_PACKETS``); a packet type the state does not allow is a protocol error, and
``unexpected`` is where that error is made, together with the one for bad bytes that followed good
packets in the same read (``ReadFailure``, queued in their place so everything before them is handled
first).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from appliance.broker.codec import packets as pk
from appliance.broker.codec import reasons as rc
from appliance.broker.codec.reasons import ProtocolError
from appliance.broker.handlers.connect import handle_auth, handle_connect
from appliance.broker.handlers.publish import (
    handle_puback,
    handle_pubcomp,
    handle_publish,
    handle_pubrec,
    handle_pubrel,
)
from appliance.broker.handlers.subscribe import handle_subscribe, handle_unsubscribe
from appliance.broker.sessions import lifecycle
from appliance.broker.transport.link import Link

if TYPE_CHECKING:
    from appliance.broker.broker import Broker

Handler = Callable[["Broker", Link, Any, float], Awaitable[None] | None]

#: The dispatch table: packet type -> its handler (mosquitto's ``read_handle.c``).
HANDLERS: dict[int, Handler] = {
    pk.CONNECT: handle_connect,
    pk.PUBLISH: handle_publish,
    pk.PUBACK: handle_puback,
    pk.PUBREC: handle_pubrec,
    pk.PUBREL: handle_pubrel,
    pk.PUBCOMP: handle_pubcomp,
    pk.SUBSCRIBE: handle_subscribe,
    pk.UNSUBSCRIBE: handle_unsubscribe,
    pk.PINGREQ: lifecycle.handle_pingreq,
    pk.DISCONNECT: lifecycle.handle_disconnect,
    pk.AUTH: handle_auth,
}


class ReadFailure:
    """Bad bytes after good packets in one read, queued behind them: a packet type no state allows, so
    the dispatch loop reaches ``unexpected`` and raises the reader's error in its place."""

    __slots__ = ("error",)
    type = -1

    def __init__(self, error: ProtocolError) -> None:
        self.error = error


def unexpected(packet: pk.Packet | ReadFailure) -> ProtocolError:
    if isinstance(packet, ReadFailure):
        return packet.error
    return ProtocolError(rc.PROTOCOL_ERROR, f"unexpected packet type {packet.type}")
