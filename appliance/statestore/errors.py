"""The state store's ``-ERR`` strings, in one place, exactly as the protocol document spells them.

Clients match on these strings (the SDKs surface them verbatim), so they are constants, never built from
parts, and the parser, the store, the service and the client library all import them from here.
"""

from __future__ import annotations

TIMESTAMP_SKEW = (
    "the request timestamp is too far in the future; ensure that the client and broker system clocks are synchronized"
)
FENCING_TOKEN_REQUIRED = "a fencing token is required for this request"
FENCING_TOKEN_SKEW = (
    "the request fencing token timestamp is too far in the future; "
    "ensure that the client and broker system clocks are synchronized"
)
FENCING_TOKEN_LOWER = "the request fencing token is a lower version than the fencing token protecting the resource"
QUOTA_EXCEEDED = "the quota has been exceeded"
SYNTAX_ERROR = "syntax error"
NOT_AUTHORIZED = "not authorized"
UNKNOWN_COMMAND = "unknown command"
WRONG_NUMBER_OF_ARGUMENTS = "wrong number of arguments"
MISSING_TIMESTAMP = "missing timestamp"
MALFORMED_TIMESTAMP = "malformed timestamp"
KEY_LENGTH_ZERO = "the key length is zero"

ALL = (
    TIMESTAMP_SKEW,
    FENCING_TOKEN_REQUIRED,
    FENCING_TOKEN_SKEW,
    FENCING_TOKEN_LOWER,
    QUOTA_EXCEEDED,
    SYNTAX_ERROR,
    NOT_AUTHORIZED,
    UNKNOWN_COMMAND,
    WRONG_NUMBER_OF_ARGUMENTS,
    MISSING_TIMESTAMP,
    MALFORMED_TIMESTAMP,
    KEY_LENGTH_ZERO,
)


class StateStoreError(Exception):
    """A request the state store refuses; ``message`` is one of the strings above, sent as ``-ERR message``."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
