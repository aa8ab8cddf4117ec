"""Benchmarks: each prints a table of ratios measured side by side in one run."""
