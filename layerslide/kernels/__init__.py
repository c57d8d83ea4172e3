"""Triton kernels the executor uses where they bound the step."""
