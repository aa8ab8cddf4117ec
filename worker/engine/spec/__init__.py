"""Speculative decoding: drafters propose, the target verifies, exactly."""
