"""Consumes telemetry, runs a policy, publishes versioned decisions."""
