"""Authorization of state store requests: which user may read or write which key prefixes.

No rules means no restrictions (the embedded default: a loopback-only gateway with anonymous clients).
As soon as one rule exists the store is closed by default and a request is allowed only if some rule for
its user (or for ``*``, any user including anonymous ones) has a prefix of the key and grants the access.
GET and KEYNOTIFY need ``read``; SET, DEL and VDEL need ``write``. A refusal is ``-ERR not authorized``.

Pure: matching is on bytes, so binary keys work (prefixes are configured as UTF-8 text).
"""

from __future__ import annotations

from dataclasses import dataclass

ANY_USER = "*"
ACCESS_KINDS = ("read", "write")


@dataclass(frozen=True, slots=True)
class AclRule:
    """As configured (plain strings, so ``appliance check-config`` prints it as written)."""

    user: str
    prefix: str
    access: tuple[str, ...]


class KeyAuthorizer:
    def __init__(self, rules: tuple[AclRule, ...]) -> None:
        self.rules = [(rule.user, rule.prefix.encode("utf-8"), frozenset(rule.access)) for rule in rules]

    def allows(self, username: str | None, key: bytes, access: str) -> bool:
        if not self.rules:
            return True
        return any(
            (user in (ANY_USER, username)) and access in kinds and key.startswith(prefix)
            for user, prefix, kinds in self.rules
        )
