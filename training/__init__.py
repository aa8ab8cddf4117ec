"""Trains the bundled demo models (tokenizer, target, drafters)."""
