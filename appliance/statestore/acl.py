"""Authorization of state store requests: which user may read or write which key prefixes.

No rules means no restrictions (the embedded default: a loopback-only gateway with anonymous clients).
As soon as one rule exists the store is closed by default and a request is allowed only if some rule for
its user (or for ``*``, any user including anonymous ones) has a prefix of the key and grants the access.
GET and KEYNOTIFY need ``read``; SET, DEL and VDEL need ``write``. A refusal is ``-ERR not authorized``.

Pure: matching is on bytes, so binary keys work (prefixes are configured as UTF-8 text).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from appliance.config.errors import ConfigError
from appliance.config.schema import join, setting

ANY_USER = "*"
ACCESS_KINDS = ("read", "write")


@dataclass(frozen=True, slots=True)
class AclRule:
    """As configured (plain strings, so ``appliance check-config`` prints it as written)."""

    user: str = setting(doc='a username, or "*" for every user, anonymous included')
    prefix: str = setting("", doc="key prefix (UTF-8) the rule covers")
    access: tuple[Literal["read", "write"], ...] = setting((), shown_default="required", doc="what the rule grants")

    def checked(self, given: Mapping[str, Any], path: str) -> AclRule:
        if not self.access:
            raise ConfigError(join(path, "access"), f"expected a non-empty list of {', '.join(ACCESS_KINDS)}")
        return dataclasses.replace(self, access=tuple(sorted(set(self.access))))


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
