"""What the gateway, worker and planner share: messages, codec, key names, connections."""
