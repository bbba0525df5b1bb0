"""The envelope the state store and its clients share (the SDKs' RPC conventions), so a client needs no
import of the server: the request topic, the protocol version both sides stamp (``__protVer``) and the
rule for which versions are served."""

from __future__ import annotations

import re

from appliance.statestore.notify import SYSTEM_ID

REQUEST_TOPIC = f"statestore/v1/{SYSTEM_ID}/command/invoke"

# The SDKs' RPC protocol version (``__protVer``), as their command executors answer it, and the major
# versions we serve (``__supProtMajVer``, space separated). A request without ``__protVer`` is 1.0.
PROTOCOL_VERSION = "1.0"
SUPPORTED_MAJOR_VERSIONS = "1"
_VERSION_SYNTAX = re.compile(r"(\d+)\.(\d+)")

def supported_protocol_version(text: str | None) -> bool:
    """The SDK executors' rule: absent (or empty, as the Go executor reads it) is 1.0; otherwise
    ``<major>.<minor>`` with a major we serve."""
    if not text:
        return True
    match = _VERSION_SYNTAX.fullmatch(text)
    return match is not None and match.group(1) in SUPPORTED_MAJOR_VERSIONS.split()
