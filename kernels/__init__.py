"""Triton kernels with torch reference paths."""
