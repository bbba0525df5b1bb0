"""Per-topic authorization from a mosquitto-compatible ACL file.

The file format and the decision rules are mosquitto 2.x's ``acl_file`` (mosquitto.conf(5)), so a site
keeps its file and its expectations; where we differ it is said below and in docs/broker-security.md.

Rules
-----
* ``user <name>`` starts the rules of one user; ``topic`` lines before any ``user`` line apply to clients
  that connected without a username.
* ``topic [read|write|readwrite|deny] <filter>`` grants (or, with ``deny``, refuses) access to the topics a
  filter matches; without an access word the access is ``readwrite``.
* ``pattern [read|write|readwrite|deny] <filter>`` applies to every client; a level that is exactly ``%c``
  stands for the client id, exactly ``%u`` for the username (a pattern with ``%u`` never applies to a
  client without a username), and - our extension, for the SDK topics that carry it - exactly ``%x`` for
  the client id in upper-case hex (RFC 4648 base16 of its UTF-8 bytes).
* Decision: the client's own rules first, ``deny`` rules before the others, and the first rule whose
  filter matches and carries the access decides; then the patterns the same way; otherwise denied.
* When patterns exist, a client id or username containing ``+`` or ``#`` is denied everything, so it
  cannot widen a pattern.
* A client id that is another client's ``%x`` (``414243`` for ``ABC``) gets no ``%c`` topic that overlaps
  the other's ``%x`` topics (``clients/%c/#`` beside ``clients/%x/#``): otherwise it reads and forges the
  other's SDK replies. ``%x`` takes precedence because every hex string is a valid client id, while few
  client ids are upper-case hex of printable UTF-8 (a numeric id of even length can be, ``2026`` is
  `` &``: such a client uses its ``clients/%x/`` topics, as the SDKs do).
* ``can_receive`` is the delivery-time read check mosquitto makes for every message sent to a client, so a
  subscription to ``#`` only ever carries the topics the client may read.
* ``can_subscribe`` is stricter than mosquitto 2.0, which grants every SUBSCRIBE and only filters at
  delivery: a filter is refused (SUBACK 0x87) unless a read rule covers every topic it can match
  (``sensors/#`` is covered by ``sensors/#`` or ``#``, not by ``sensors/a``); delivery is still checked. A
  client learns at once that its subscription is useless instead of waiting for messages forever.
* ``client_patterns`` (``[broker.auth] acl_client_patterns``) are patterns added after the file's own, by
  default each client's ``clients/<id>/...`` topics and its state store notification topics, so a site's
  ACL file keeps request/response clients working without writing them. A substituted value never opens
  the state store's notification space (``clients/statestore/...``): only a rule that names it does, so a
  client called ``statestore`` does not get everyone's notifications through ``clients/%c/#``.

Theory of operation
-------------------
The checks run for every PUBLISH and every delivery, so decisions are cached per (client id, username,
topic, access); the cache is emptied when it reaches ``DECISION_CACHE_SIZE`` entries or
``DECISION_CACHE_BYTES`` of estimated size, and a key whose text (client id, username and topic) is over
1 KiB is decided every time, never cached (``cache_bounds``: a topic can be 64 KB). An ``Acl`` is otherwise
immutable: SIGHUP builds a new one with ``Acl.load`` and the server swaps the reference (a bad file raises
``AclFileError`` and the old rules stay).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntFlag
from pathlib import Path

from appliance.broker.cache_bounds import BoundedCache
from appliance.broker.routing.topic_tree import (
    SHARE_PREFIX,
    TopicError,
    split_shared,
    topic_matches,
    validate_topic_filter,
)
from appliance.startup_error import StartupError

#: Cached decisions before the cache is emptied; bounds memory when topics are unique per message.
DECISION_CACHE_SIZE = 65536
#: Estimated bytes of cached decisions (``cache_bytes``) before the cache is emptied.
DECISION_CACHE_BYTES = 8 * 1024 * 1024
#: What one decision costs besides its key's text (measured with tracemalloc): the key tuple, the dict
#: slot and the topic's str header.
DECISION_ENTRY_BYTES = 200
#: The state store's notification topics (``clients/statestore/v1/<system id>/<HEX(client id)>/...``):
#: a ``%c``/``%u``/``%x`` substitution never reaches into them, only a rule that names them literally.
NOTIFICATION_SPACE = "clients/statestore/"


#: The one ``$SYS`` topic a client may publish to: a bridge's connection status (mosquitto's notifications).
BRIDGE_STATE_FILTER = "$SYS/broker/connection/+/state"


def reserved_for_the_broker(topic: str) -> bool:
    """Whether clients may not publish to ``topic``, whatever the ACL says (and without one): ``$SYS``
    is the broker's own report (its counters, what it dropped), which a device must not forge or replace
    (a retained ``$SYS`` message would stand until the broker's next report); ``$share`` names shared
    subscriptions, never a topic. mosquitto's ``acl__check_dollar`` (src/security.c) has the same rule,
    with the same exception for a bridge's ``$SYS/broker/connection/<name>/state``. Callers test
    ``topic[0] == "$"`` first (the common topic pays nothing more)."""
    if topic.startswith("$SYS"):
        return not topic_matches(BRIDGE_STATE_FILTER, topic)
    return topic.startswith("$share")


class AclFileError(StartupError, ValueError):
    """An ACL file that cannot be read, or a malformed line of it (``line``)."""


class Access(IntFlag):
    """What a rule grants; ``DENY`` (no bits) refuses everything its filter matches."""

    DENY = 0
    READ = 1
    WRITE = 2
    READWRITE = 3


_ACCESS_WORDS = {"read": Access.READ, "write": Access.WRITE, "readwrite": Access.READWRITE, "deny": Access.DENY}
# Subscribe checks use the read rules but compare filters by coverage instead of matching.
_SUBSCRIBE = 4


@dataclass(frozen=True, slots=True)
class TopicAclRule:
    """One ``topic`` or ``pattern`` line; ``line`` is its 1-based line number for messages."""

    access: Access
    topic_filter: str
    line: int


def _deny_first(rules: Sequence[TopicAclRule]) -> tuple[TopicAclRule, ...]:
    """mosquitto evaluates ``deny`` rules before the others, each group in file order."""
    return tuple(rule for rule in rules if rule.access == Access.DENY) + tuple(
        rule for rule in rules if rule.access != Access.DENY
    )


def filter_covers(rule_filter: str, topic_filter: str) -> bool:
    """Whether every topic ``topic_filter`` can match is also matched by ``rule_filter``."""
    if topic_filter.startswith("$") and rule_filter[:1] in ("+", "#"):
        return False
    rule_levels = rule_filter.split("/")
    sub_levels = topic_filter.split("/")
    for index, level in enumerate(rule_levels):
        if level == "#":
            return True
        if index >= len(sub_levels):
            return False
        sub_level = sub_levels[index]
        if level == "+":
            if sub_level == "#":
                return False
        elif level != sub_level:
            return False
    return len(rule_levels) == len(sub_levels)


class Acl:
    """The rules of one ACL file. Build with ``Acl.parse``/``Acl.load``, or ``Acl.allow_all()``."""

    def __init__(
        self,
        anonymous: Sequence[TopicAclRule],
        users: dict[str, Sequence[TopicAclRule]],
        patterns: Sequence[TopicAclRule],
        enforced: bool = True,
    ) -> None:
        self.anonymous = _deny_first(anonymous)
        self.users = {name: _deny_first(rules) for name, rules in users.items()}
        self.patterns = _deny_first(patterns)
        #: False when no ACL file is configured: everything is allowed.
        self.enforced = enforced
        #: The patterns with a ``%x`` level: the topics they give a client may not go to another through ``%c``.
        self._hex_patterns = tuple(rule for rule in self.patterns if "%x" in rule.topic_filter.split("/"))
        self._decisions: BoundedCache[tuple[str, str | None, str, int], bool] = BoundedCache(
            DECISION_CACHE_SIZE, DECISION_CACHE_BYTES)

    @classmethod
    def allow_all(cls) -> Acl:
        """No ACL file configured: every client may publish, subscribe and receive anything."""
        return cls((), {}, (), enforced=False)

    @classmethod
    def load(cls, path: Path, client_patterns: Sequence[str] = ()) -> Acl:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise AclFileError(path, f"cannot read ACL file: {exc}") from exc
        return cls.parse(text, str(path), client_patterns)

    @classmethod
    def parse(cls, text: str, source: str = "<acl file>", client_patterns: Sequence[str] = ()) -> Acl:
        """Parse the mosquitto ACL format; ``AclFileError`` names ``source`` and the line number.
        ``client_patterns`` (``[access] filter``, as after ``pattern``) follow the file's patterns."""
        anonymous: list[TopicAclRule] = []
        users: dict[str, list[TopicAclRule]] = {}
        patterns: list[TopicAclRule] = []
        current: list[TopicAclRule] = anonymous
        for number, raw_line in enumerate(text.splitlines(), start=1):
            line = raw_line.rstrip()
            if line.startswith("#"):
                continue
            words = line.split(" ")
            while words and words[0] == "":
                words.pop(0)
            if not words:
                continue
            keyword, rest = words[0], " ".join(words[1:]).strip(" ")
            if keyword == "user":
                if not rest:
                    raise AclFileError(source, "'user' needs a user name", line=number)
                current = users.setdefault(rest, [])
            elif keyword in ("topic", "pattern"):
                rule = _parse_rule(keyword, rest, source, number)
                (patterns if keyword == "pattern" else current).append(rule)
            else:
                raise AclFileError(source, f"expected 'user', 'topic' or 'pattern', got {keyword!r}", line=number)
        patterns.extend(parse_pattern(text) for text in client_patterns)
        return cls(anonymous, dict(users), patterns)

    def can_publish(self, client_id: str, username: str | None, topic: str) -> bool:
        """Write access to a topic name (PUBLISH, and a will message at CONNECT)."""
        return self._decide(client_id, username, topic, Access.WRITE)

    def can_receive(self, client_id: str, username: str | None, topic: str) -> bool:
        """Read access to a topic name, checked when a message (or retained message) is delivered."""
        return self._decide(client_id, username, topic, Access.READ)

    def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        """Whether a read rule covers the whole filter (a ``$share/{group}/`` prefix is ignored)."""
        if topic_filter.startswith(SHARE_PREFIX):
            try:
                topic_filter = split_shared(topic_filter)[1]
            except TopicError:
                return False
        return self._decide(client_id, username, topic_filter, _SUBSCRIBE)

    def _decide(self, client_id: str, username: str | None, topic: str, access: int) -> bool:
        if not self.enforced:
            return True
        key = (client_id, username, topic, access)
        decision = self._decisions.entries.get(key)
        if decision is None:
            decision = self._evaluate(client_id, username, topic, access)
            key_chars = len(topic) + len(client_id) + (len(username) if username is not None else 0)
            self._decisions.put(key, decision, key_chars, DECISION_ENTRY_BYTES)
        return decision

    @property
    def cache_bytes(self) -> int:
        """Estimated bytes held by the decision cache (keys' text plus ``DECISION_ENTRY_BYTES`` each), for
        the metrics page."""
        return self._decisions.held_bytes

    def _evaluate(self, client_id: str, username: str | None, topic: str, access: int) -> bool:
        subscribe = access == _SUBSCRIBE
        wanted = Access.READ if subscribe else access
        rules = self.anonymous if username is None else self.users.get(username, ())
        for rule in rules:
            verdict = _apply(rule, rule.topic_filter, topic, wanted, subscribe)
            if verdict is not None:
                return verdict
        if not self.patterns:
            return False
        if "+" in client_id or "#" in client_id or (username is not None and ("+" in username or "#" in username)):
            return False
        hex_owner = _hex_owner(client_id) if self._hex_patterns else None
        for rule in self.patterns:
            concrete = _substitute(rule.topic_filter, client_id, username)
            if concrete is None:
                continue
            if hex_owner is not None and "%c" in rule.topic_filter.split("/") and self._claimed_by_hex(hex_owner, concrete):
                continue
            verdict = _apply(rule, concrete, topic, wanted, subscribe)
            if verdict is not None:
                return verdict
        return False


    def _claimed_by_hex(self, owner: str, concrete: str) -> bool:
        """Whether ``concrete`` (a ``%c`` pattern filled with a hex-shaped client id) overlaps a topic a ``%x``
        pattern gives client ``owner``, whose hex id it is."""
        for rule in self._hex_patterns:
            owned = _substitute(rule.topic_filter, owner, None)
            if owned is not None and filters_overlap(owned, concrete):
                return True
        return False


def _hex_owner(client_id: str) -> str | None:
    """The client id whose ``%x`` this client id is (non-empty even-length upper-case hex of UTF-8), or None.
    Such an id filled into ``%c`` would give its client the other one's ``%x`` topics (``clients/%c/#`` and
    ``clients/%x/#``: client ``414243`` writing and reading the replies of client ``ABC``), so a ``%c``
    pattern that overlaps them does not apply to it: the ``%x`` owner keeps its topics."""
    if not client_id or len(client_id) % 2 or client_id.strip("0123456789ABCDEF"):
        return None
    try:
        owner = bytes.fromhex(client_id).decode("utf-8")
    except UnicodeDecodeError:
        return None
    # A client id with control characters is no client's in practice, while numeric ids such as a serial
    # number ``0012`` are common: those keep their ``%c`` topics (fewer ids pay for the rule).
    return owner if owner.isprintable() else None


def filters_overlap(first: str, second: str) -> bool:
    """Whether some topic name matches both filters."""
    first_levels, second_levels = first.split("/"), second.split("/")
    for one, other in zip(first_levels, second_levels, strict=False):
        if one == "#" or other == "#":
            return True
        if one != other and "+" not in (one, other):
            return False
    longer = max(first_levels, second_levels, key=len)
    shorter = min(len(first_levels), len(second_levels))
    return len(first_levels) == len(second_levels) or (len(longer) == shorter + 1 and longer[-1] == "#")


def parse_pattern(text: str) -> TopicAclRule:
    """One configured pattern (``[access] filter``, as after ``pattern`` in a file); ``AclFileError``."""
    return _parse_rule("pattern", text.strip(" "), "acl_client_patterns", 0)


def _parse_rule(keyword: str, rest: str, source: str, number: int) -> TopicAclRule:
    """One ``topic``/``pattern`` rule; ``number`` is its line in ``source`` (0: a setting, no line)."""
    line = number or None
    if not rest:
        raise AclFileError(source, f"'{keyword}' needs a topic filter", line=line)
    first, _, remainder = rest.partition(" ")
    remainder = remainder.strip(" ")
    if remainder:
        if first not in _ACCESS_WORDS:
            raise AclFileError(source, f"access must be read, write, readwrite or deny, got {first!r}", line=line)
        access, topic_filter = _ACCESS_WORDS[first], remainder
    else:
        access, topic_filter = Access.READWRITE, first
    try:
        validate_topic_filter(topic_filter)
    except TopicError as exc:
        raise AclFileError(source, str(exc), line=line) from exc
    return TopicAclRule(access, topic_filter, number)


def _substitute(pattern: str, client_id: str, username: str | None) -> str | None:
    """The pattern with whole ``%c``/``%u``/``%x`` levels replaced; None if it cannot apply to this client."""
    if "%" not in pattern:
        return pattern
    levels = pattern.split("/")
    for index, level in enumerate(levels):
        if level == "%c":
            value: str | None = client_id
        elif level == "%u":
            value = username
        elif level == "%x":
            value = base64.b16encode(client_id.encode("utf-8")).decode("ascii")
        else:
            continue
        # A value spanning levels can never equal one level, as in mosquitto's level-wise comparison.
        if value is None or "/" in value:
            return None
        levels[index] = value
    concrete = "/".join(levels)
    if concrete.startswith(NOTIFICATION_SPACE) and not pattern.startswith(NOTIFICATION_SPACE):
        return None
    return concrete


def _apply(rule: TopicAclRule, rule_filter: str, topic: str, wanted: int, subscribe: bool) -> bool | None:
    """True/False if this rule decides, None if it does not apply."""
    if topic.startswith("$") and not rule_filter.startswith("$"):
        return None
    if subscribe:
        # A deny rule refuses a subscription it overlaps entirely; a partial overlap is left to delivery.
        applies = filter_covers(rule_filter, topic)
    else:
        applies = topic_matches(rule_filter, topic)
    if not applies:
        return None
    if rule.access == Access.DENY:
        return False
    if rule.access & wanted:
        return True
    return None
