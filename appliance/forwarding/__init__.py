"""Priority / time-to-live store-and-forward: Edge Hub-style routes, durable queues, an upstream pump.

From a device's PUBLISH to the cloud, each step a module:

- In: ``service`` is the ``BrokerService`` that takes device messages; ``topics`` reads their topics,
  ``validity`` refuses what a cloud would refuse, ``messages`` makes them Edge Hub messages,
  ``ingress_log`` logs refusals.
- Routes: ``manifest`` loads the ``$edgeHub`` deployment; ``routes`` evaluates routes to ``RouteResult``s;
  the WHERE language is ``lexer``, ``conditions`` (grammar in EBNF), ``condition_values`` and
  ``condition_builtins``.
- Store: ``queues`` is the durable store, one queue per endpoint and priority.
- Out: ``pump`` sends each endpoint's highest priority first, ``window`` sizes its batches to the link;
  ``endpoints`` are what it sends to, ``upstream`` the cloud bridge's policy over ``paho_link``'s
  mechanism, with ``liveness`` (when the link is dead), ``upstream_publish`` (what goes on the wire),
  ``batch`` (the packed format) and ``identity`` (the ``gw-*`` properties).
- Around it: ``config`` is the ``[forwarding]`` section, ``metrics`` the counters, ``cli`` and ``doctor``
  the operator's commands.
"""
