"""Priority / time-to-live store-and-forward: Edge Hub-style routes, durable queues, an upstream pump."""
