"""Triton kernels with torch reference paths (and the CPU skinny-GEMM kernel).

Named ``nj_kernels``, not ``kernels``: transformers >= 5.25 depends on Hugging Face's
``kernels`` distribution and imports it at start-up, so a top-level ``kernels`` package of
ours would shadow it (or be shadowed by it) depending on ``sys.path`` order.
"""
