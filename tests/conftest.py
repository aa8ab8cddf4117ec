"""Suite-wide setup. Subfolders keep their own fixtures in their own conftest.py files."""

import os

# Triton reads this when a kernel is decorated, so it must be set before any test module
# imports kernels.triton_*: Triton kernels then run on CPU tensors through its interpreter.
os.environ.setdefault("TRITON_INTERPRET", "1")
