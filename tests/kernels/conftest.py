"""Run the Triton kernels under Triton's CPU interpreter where there is no CUDA GPU.

Set at import, before any test module is collected. The kernel module also decorates its
kernel on first use (Triton reads TRITON_INTERPRET when it decorates), so this holds even when
another test module imported triton or the kernel module first.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
