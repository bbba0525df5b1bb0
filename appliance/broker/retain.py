"""Retained messages: the last retained PUBLISH per topic, handed to new subscriptions.

Kept in memory as a dict by topic (the store persists every change) and matched against a new
subscription's filter by a linear scan: subscriptions are rare next to publishes, and a gateway holds
thousands of retained topics, not millions. An empty payload deletes (MQTT 5 3.3.1.3); expired messages
are dropped when they are next looked at.
"""

from __future__ import annotations

from appliance.broker.message import Message
from appliance.broker.topic_tree import topic_matches


class RetainedMessages:
    def __init__(self) -> None:
        self._by_topic: dict[str, Message] = {}

    def __len__(self) -> int:
        return len(self._by_topic)

    def update(self, message: Message) -> bool:
        """Store or (empty payload) delete the retained message of ``message.topic``; True if it changed."""
        if message.payload:
            self._by_topic[message.topic] = message
            return True
        return self._by_topic.pop(message.topic, None) is not None

    def matching(self, topic_filter: str, now: float) -> list[Message]:
        """Retained messages whose topic matches ``topic_filter`` (unshared), oldest topic first."""
        found: list[Message] = []
        expired: list[str] = []
        for topic, message in self._by_topic.items():
            if topic_matches(topic_filter, topic):
                if message.expired(now):
                    expired.append(topic)
                else:
                    found.append(message)
        for topic in expired:
            del self._by_topic[topic]
        return found
