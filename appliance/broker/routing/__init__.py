"""From one published message to its deliveries, sans-I/O.

``message`` is an application message inside the broker; ``topic_tree`` (on ``edge_tree``) maps a topic
to the subscriptions that match it; ``router`` turns a publish into deliveries (QoS, retain flag,
identifiers, ACL at delivery); ``delivery`` is one message on its way to one session; ``retain`` and
``retained_feed`` keep retained messages and hand them to new subscriptions a slice at a time.
"""
