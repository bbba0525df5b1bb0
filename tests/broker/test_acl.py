"""The mosquitto ACL file format and decision rules; the same file is run through a real mosquitto."""

from __future__ import annotations

import base64
import getpass
import uuid
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.broker.config import DEFAULT_ACL_CLIENT_PATTERNS
from appliance.broker.security.acl import Acl, AclFileError, filter_covers
from testing.campaigns import campaign
from testing.collector import Collector
from testing.processes import MosquittoProcess

ACL_TEXT = """\
# Rules before any user line: clients without a username.
topic read public/#
topic write anon/out

user alice
topic readwrite alice/#
topic deny alice/secret
topic read shared/+/data
topic write shared/in

user bob
topic read #
topic read $app/#

user carol
topic #

user root
topic readwrite #
topic readwrite $app/#

pattern readwrite devices/%c/#
pattern read users/%u/inbox
pattern deny devices/%c/locked
pattern read dev-%c/x
"""

# (username, client id, topic, action, allowed) - every row is also checked against mosquitto.
CASES = [
    (None, "anon1", "public/news", "read", True),
    (None, "anon1", "public/news", "write", False),
    (None, "anon1", "anon/out", "write", True),
    (None, "anon1", "anon/out", "read", False),
    (None, "anon1", "devices/anon1/temp", "read", True),
    (None, "anon1", "devices/anon1/temp", "write", True),
    (None, "anon1", "devices/other/temp", "read", False),
    (None, "anon1", "devices/anon1/locked", "write", False),
    (None, "anon1", "users/anon1/inbox", "read", False),
    ("alice", "a1", "alice/x", "write", True),
    ("alice", "a1", "alice/x/y", "read", True),
    ("alice", "a1", "alice", "read", True),
    ("alice", "a1", "alice/secret", "write", False),
    ("alice", "a1", "alice/secret", "read", False),
    ("alice", "a1", "shared/7/data", "read", True),
    ("alice", "a1", "shared/7/8/data", "read", False),
    ("alice", "a1", "shared/7/data", "write", False),
    ("alice", "a1", "shared/in", "write", True),
    ("alice", "a1", "public/news", "read", False),  # anonymous rules do not apply to users
    ("alice", "a1", "users/alice/inbox", "read", True),
    ("alice", "a1", "users/alice/inbox", "write", False),
    ("alice", "a1", "users/bob/inbox", "read", False),
    ("alice", "a1", "devices/a1/x", "write", True),
    ("alice", "a1", "devices/a1/locked", "write", False),
    ("bob", "b1", "anything/at/all", "read", True),
    ("bob", "b1", "anything/at/all", "write", False),
    ("bob", "b1", "$app/status", "read", True),
    ("carol", "c1", "x/y", "read", True),
    ("carol", "c1", "x/y", "write", True),
    ("carol", "c1", "$app/status", "read", False),  # '#' does not reach $ topics
    ("mallory", "m1", "public/news", "read", False),  # unknown user: only the patterns
    ("mallory", "m1", "devices/m1/x", "read", True),
]
# Where we deliberately differ from Debian's mosquitto 2.0.11, which substitutes %c/%u anywhere in a level;
# later mosquitto releases, and we, substitute only a level that is exactly %c or %u.
NOT_LIKE_MOSQUITTO_2_0_11 = [(None, "anon1", "dev-anon1/x", "read", False)]


@pytest.fixture(scope="module")
def acl() -> Acl:
    return Acl.parse(ACL_TEXT, "acl.txt")


@pytest.mark.parametrize(("username", "client_id", "topic", "action", "allowed"), CASES + NOT_LIKE_MOSQUITTO_2_0_11)
def test_decisions(acl: Acl, username: str | None, client_id: str, topic: str, action: str, allowed: bool) -> None:
    check = acl.can_receive if action == "read" else acl.can_publish
    assert check(client_id, username, topic) is allowed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("topic\n", "acl.txt:1: 'topic' needs a topic filter"),
        ("\n# c\ntopic reed a/b\n", "acl.txt:3: access must be read, write, readwrite or deny, got 'reed'"),
        ("user\n", "acl.txt:1: 'user' needs a user name"),
        ("topic read a/#/b\n", "acl.txt:1: topic filter 'a/#/b'"),
        ("pattern write a+\n", "acl.txt:1: topic filter 'a+'"),
        ("user a\ntopci read a\n", "acl.txt:2: expected 'user', 'topic' or 'pattern', got 'topci'"),
        ("topic wrte a b\n", "acl.txt:1: access must be"),  # a topic with a space needs an access word
    ],
)
def test_parse_errors_name_the_line(text: str, message: str) -> None:
    with pytest.raises(AclFileError) as caught:
        Acl.parse(text, "acl.txt")
    assert message in str(caught.value)


def test_format_details() -> None:
    acl = Acl.parse("  topic read   with space/x  \ntopic read\nuser  two words \ntopic   write out\n", "f")
    assert acl.can_receive("c", None, "with space/x")
    assert acl.can_publish("c", None, "read")  # one word after 'topic' is the topic, with readwrite
    assert acl.can_publish("c", "two words", "out")
    assert not acl.can_receive("c", "two words", "out")


def test_deny_wins_regardless_of_line_order() -> None:
    acl = Acl.parse("user u\ntopic readwrite a/#\ntopic deny a/b\n")
    assert not acl.can_publish("c", "u", "a/b") and acl.can_publish("c", "u", "a/c")


def test_user_rules_are_decided_before_pattern_denials() -> None:
    acl = Acl.parse("user u\ntopic readwrite x/#\npattern deny x/%c\n")
    assert acl.can_publish("c", "u", "x/c")  # mosquitto: a matching user rule decides first
    assert not acl.can_publish("c", "other", "x/c")


def test_wildcards_in_ids_void_patterns() -> None:
    acl = Acl.parse("topic read public\npattern readwrite devices/%c/#\npattern read users/%u\n")
    assert not acl.can_publish("ev+il", None, "devices/ev+il/x")
    assert not acl.can_receive("c", "u#", "users/u#")
    assert acl.can_receive("ev+il", None, "public")  # the client's own rules still apply


def test_client_id_with_a_slash_never_fills_a_level() -> None:
    acl = Acl.parse("pattern readwrite devices/%c\n")
    assert not acl.can_publish("a/b", None, "devices/a/b")
    assert acl.can_publish("ab", None, "devices/ab")


@pytest.mark.parametrize(
    ("rule", "subscription", "covered"),
    [
        ("a/#", "a/#", True),
        ("a/#", "a/b/+", True),
        ("a/#", "a", True),
        ("#", "+/x", True),
        ("#", "$SYS/#", False),
        ("a/+", "a/b", True),
        ("a/+", "a/+", True),
        ("a/+", "a/#", False),
        ("a/b", "a/+", False),
        ("a/+/c", "a/b/c/d", False),
        ("$SYS/#", "$SYS/broker/+", True),
        ("$SYS/broker/uptime", "$SYS/broker/#", False),
    ],
)
def test_filter_covers(rule: str, subscription: str, covered: bool) -> None:
    assert filter_covers(rule, subscription) is covered


def test_subscribe_needs_a_read_rule_covering_the_filter(acl: Acl) -> None:
    assert acl.can_subscribe("a1", "alice", "alice/#")
    assert acl.can_subscribe("a1", "alice", "shared/+/data")
    assert not acl.can_subscribe("a1", "alice", "shared/#")  # only partly readable
    assert not acl.can_subscribe("a1", "alice", "alice/secret")  # covered by a deny rule
    assert acl.can_subscribe("a1", "alice", "$share/group/alice/x")
    assert not acl.can_subscribe("a1", "alice", "$share/group")
    assert not acl.can_subscribe("anon1", None, "anon/out")  # write-only
    assert acl.can_subscribe("anon1", None, "devices/anon1/#")
    assert acl.can_subscribe("b1", "bob", "#") and not acl.can_subscribe("b1", "bob", "$SYS/#")


def test_allow_all_and_empty_file() -> None:
    everything = Acl.allow_all()
    assert everything.can_publish("c", None, "x") and everything.can_receive("c", "u", "$SYS/x")
    assert everything.can_subscribe("c", None, "#")
    empty = Acl.parse("# nothing granted\n")
    assert not empty.can_publish("c", None, "x") and not empty.can_subscribe("c", "u", "x")


def test_cached_decisions_stay_per_client(acl: Acl) -> None:
    assert acl.can_publish("a1", "alice", "alice/x")
    assert not acl.can_publish("b1", "bob", "alice/x")
    assert acl.can_publish("a1", "alice", "alice/x")


def test_load_reports_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(AclFileError, match="cannot read"):
        Acl.load(tmp_path / "missing.acl")
    (tmp_path / "ok.acl").write_text(ACL_TEXT)
    assert Acl.load(tmp_path / "ok.acl").can_receive("b1", "bob", "x")


def peer(port: int, client_id: str, username: str | None) -> Collector:
    """A paho MQTT 3.1.1 client of mosquitto's that keeps what it receives."""
    return Collector("127.0.0.1", port, protocol=mqtt.MQTTv311, client_id=client_id, username=username, name=client_id)


def barrier(client: Collector) -> None:
    """A SUBACK round trip: anything mosquitto queued for ``client`` before it has arrived by now."""
    client.subscribe(f"barrier/{uuid.uuid4().hex}")


def mosquitto_allows(port: int, username: str | None, client_id: str, topic: str, action: str) -> bool:
    payload = uuid.uuid4().bytes
    root = peer(port, f"root-{uuid.uuid4().hex[:8]}", "root")
    client = peer(port, client_id, username)
    try:
        if action == "read":
            client.subscribe(topic)  # mosquitto 2.0 grants every SUBSCRIBE and checks read on delivery
            root.publish(topic, payload)
            barrier(client)
            return any((m.topic, m.payload) == (topic, payload) for m in client.snapshot())
        root.subscribe(topic)
        client.publish(topic, payload)  # a 3.1.1 PUBACK comes back even when the publish was denied
        barrier(root)
        return any((m.topic, m.payload) == (topic, payload) for m in root.snapshot())
    finally:
        client.close()
        root.close()


def test_mosquitto_decides_the_same_for_the_same_file(tmp_path: Path, acl: Acl) -> None:
    acl_path = tmp_path / "acl.txt"
    acl_path.write_text(ACL_TEXT)
    # As root, mosquitto would switch to the "mosquitto" user, which cannot read a file under tmp_path.
    with MosquittoProcess(tmp_path / "mosquitto", extra_config=f"acl_file {acl_path}\nuser {getpass.getuser()}\n") as broker:
        disagreements = []
        for username, client_id, topic, action, allowed in CASES:
            theirs = mosquitto_allows(broker.port, username, client_id, topic, action)
            check = acl.can_receive if action == "read" else acl.can_publish
            ours = check(client_id, username, topic)
            if theirs != ours or ours != allowed:
                disagreements.append((username, client_id, topic, action, f"mosquitto={theirs} ours={ours}"))
        assert disagreements == []


# -- the client patterns every ACL file gets ([broker.auth] acl_client_patterns) ---------------------

NOTIFY = "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8"


def test_client_patterns_open_each_clients_own_sdk_topics_and_nothing_else() -> None:
    acl = Acl.parse("user alice\ntopic readwrite alice/#\n", "acl", DEFAULT_ACL_CLIENT_PATTERNS)
    own = ["clients/c1/services/statestore/_any_/command/invoke/response",  # Rust SDK, our client
           "clients/c1/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke",  # .NET default prefix
           "clients/6331/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke/response",  # Go: hex
           f"{NOTIFY}/6331/command/notify/4B"]
    for username in (None, "alice", "carol"):
        for topic in own:
            assert acl.can_publish("c1", username, topic) and acl.can_receive("c1", username, topic), topic
        assert acl.can_subscribe("c1", username, f"{NOTIFY}/6331/command/notify/+")
        for topic in ("clients/c2/x", f"{NOTIFY}/6332/command/notify/4B", f"{NOTIFY}/c1/command/notify/4B", "c/deputy"):
            assert not acl.can_publish("c1", username, topic) and not acl.can_receive("c1", username, topic), topic
    assert not acl.can_subscribe("c1", None, f"{NOTIFY}/+/command/notify/+")


def test_a_substituted_value_never_opens_the_notification_space() -> None:
    """A client called "statestore" would otherwise read and write every client's notifications."""
    acl = Acl.parse("pattern readwrite clients/%c/#\npattern readwrite clients/%u/#\n", "acl")
    for topic in (f"{NOTIFY}/6331/command/notify/4B", "clients/statestore/anything"):
        assert not acl.can_publish("statestore", "statestore", topic)
        assert not acl.can_subscribe("statestore", "statestore", "clients/statestore/#")
    # A rule that names the space literally still opens it.
    assert Acl.parse("topic readwrite clients/#\n", "acl").can_publish("statestore", None, f"{NOTIFY}/6331/command/notify/4B")


def test_percent_x_is_the_upper_case_hex_of_the_client_id() -> None:
    acl = Acl.parse("pattern read hex/%x\n", "acl")
    assert acl.can_receive("é/+", None, "hex/C3A92F2B") is False  # a wildcard in the id denies everything
    assert acl.can_receive("é", None, "hex/C3A9") and not acl.can_receive("é", None, "hex/c3a9")


def hex_of(client_id: str) -> str:
    return base64.b16encode(client_id.encode("utf-8")).decode("ascii")


def test_a_client_named_like_another_clients_hex_id_does_not_share_its_topics() -> None:
    """Client ``76696374696D31`` (HEX of ``victim1``) got ``clients/76696374696D31/#`` through ``clients/%c/#``:
    victim1's SDK response space (``clients/%x/#``), so it read victim1's state store replies and forged
    them. The space belongs to the client whose ``%x`` it is; a hex id that decodes to no client id (not
    UTF-8) keeps its ``%c`` space, and other ``%c`` patterns are untouched."""
    acl = Acl.parse("pattern readwrite devices/%c/#\n", "acl", DEFAULT_ACL_CLIENT_PATTERNS)
    victim, shaped = "victim1", hex_of("victim1")
    space = f"clients/{shaped}/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke/response"
    assert acl.can_publish(victim, None, space) and acl.can_receive(victim, None, space)
    assert not acl.can_publish(shaped, "mallory", space)
    assert not acl.can_receive(shaped, "mallory", space)
    assert not acl.can_subscribe(shaped, "mallory", f"clients/{shaped}/#")
    assert acl.can_publish(shaped, "mallory", f"devices/{shaped}/x")  # a %c pattern the %x ones never reach
    # Hex-shaped but no UTF-8 behind it (a MAC address): no other client's %x, so its own %c space.
    assert acl.can_publish("A4CF12345678", None, "clients/A4CF12345678/resp")
    # Hex of control characters only (a serial number): no client's id in practice, so its own %c space.
    assert acl.can_publish("0012", None, "clients/0012/resp")


def _printable_client_id(max_size: int) -> st.SearchStrategy[str]:
    return st.text(min_size=1, max_size=max_size).filter(lambda s: s.isprintable() and not set(s) & set("/+#"))


@campaign(200)
@given(_printable_client_id(12), _printable_client_id(24))
def test_no_two_clients_share_a_clients_space_under_the_default_patterns(first: str, second: str) -> None:
    """For client ids without control characters (a client whose id has them gives up its ``%x`` space to
    the hex-shaped id that names it, so that numeric ids such as ``0012`` keep their ``%c`` space)."""
    acl = Acl.parse("", "acl", DEFAULT_ACL_CLIENT_PATTERNS)
    for one, other in ((first, second), (second, first), (first, hex_of(first)), (hex_of(first), first)):
        if one == other:
            continue
        for level in (one, hex_of(one)):
            topic = f"clients/{level}/r"
            assert not (acl.can_publish(one, None, topic) and acl.can_publish(other, None, topic)), (one, other, topic)
