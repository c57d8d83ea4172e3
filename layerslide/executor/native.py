"""The native CPU kernels of csrc/adamw.c, compiled with the system C compiler on first use.

ctypes releases the GIL for the call and the kernel runs on OpenMP threads, like torch's own
fused AdamW. Where no compiler is found (or LAYERSLIDE_NATIVE=0), `load_kernels` returns None
and the executor uses torch's kernels instead.

How a call is spread over the cores (threads, and elements a thread takes at a time) comes from
the plan (Policy.executor: ExecutorKnobs, which LAYERSLIDE_CPU_THREADS and LAYERSLIDE_CPU_CHUNK
set at the command line).
"""

from __future__ import annotations

import ctypes
import dataclasses
from pathlib import Path

import torch

from layerslide.executor.moments import (
    BUCKET_FLOOR_BITS,
    BUCKET_SHIFT,
    BUCKETS,
    Moments,
    moment_maps,
)
from layerslide.native_build import build
from layerslide.planner.settings import MOMENT_BLOCK_ELEMENTS

SOURCE = Path(__file__).parent / "csrc" / "adamw.c"
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fopenmp", "-shared", "-fPIC")
_F, _I, _P = ctypes.c_float, ctypes.c_int64, ctypes.c_void_p
_ADAMW_ARGS = [_P, _P, _P, _P, _P, _I, _I, _F, _F, _F, _F, _F, _F, _F, _F, _I, _I]
# Elements a thread takes at a time (0: OpenMP's static split, one slice per thread): with
# chunks a pre-empted thread's share goes to the others (benchmarks/results/archive/cpu_split_2026-11-30).
# ExecutorKnobs.cpu_chunk_elements defaults to the same.
DEFAULT_CHUNK = 1 << 20


class _AdamwArgs(ctypes.Structure):  # csrc/adamw.c's adamw_args
    _fields_ = [(name, _F) for name in ("lr", "beta1", "beta2", "eps", "weight_decay",
                                        "grad_scale", "bias_correction1",
                                        "bias_correction2_sqrt")] + [
        (name, _I) for name in ("decay_end", "num_threads", "chunk")]


class _MomentMaps(ctypes.Structure):  # csrc/adamw.c's moment_maps
    _fields_ = [(name, _P) for name in ("m_values", "v_values", "m_mids", "v_mids",
                                        "m_bucket", "v_bucket")]


class NativeKernels:
    """Typed entry points into the compiled library."""

    def __init__(self, library: ctypes.CDLL, *, threads: int = 0, chunk: int = DEFAULT_CHUNK,
                 nice: int = 0):
        if threads < 0 or chunk < 0:
            raise ValueError(f"native kernels: threads={threads} and chunk={chunk} must be >= 0 "
                             "(0: OpenMP's thread count / one even slice per thread)")
        self._lib = library
        self.threads, self.chunk = threads, chunk
        library.set_worker_nice.argtypes = [_I]
        library.set_worker_nice.restype = None
        if nice:  # process-wide: the workers of every caller's team take it
            library.set_worker_nice(nice)
        library.worker_nice_now.restype = _I
        # what the workers run at: a process that niced them once keeps them so
        self.worker_nice = int(library.worker_nice_now())
        for name in ("adamw_step_bf16_grads", "adamw_step_f32_grads"):
            getattr(library, name).argtypes = _ADAMW_ARGS
            getattr(library, name).restype = None
        library.cast_f32_to_bf16.argtypes = [_P, _P, _I, _I, _I]
        library.split_chunk_elements.argtypes = [_I, _I, _I]
        library.split_chunk_elements.restype = _I
        library.cast_f32_to_bf16.restype = None
        library.accumulate_bf16_grads.argtypes = [_P, _P, _I, _I, _I, _I]
        library.accumulate_bf16_grads.restype = None
        for grads in ("bf16", "f32"):
            bf16 = getattr(library, f"adamw_step_bf16_moments_{grads}_grads")
            bf16.argtypes = [_P, _P, _P, _P, _P, _I, _P, ctypes.c_uint32, _I]
            bf16.restype = None
            int8 = getattr(library, f"adamw_step_int8_moments_{grads}_grads")
            int8.argtypes = [_P, _P, _P, _P, _P, _P, _P, _I, _P, _P]
            int8.restype = None
        library.moment_block_elements.restype = _I
        library.moment_bucket_count.restype = _I
        library.moment_bucket_shift.restype = _I
        library.moment_bucket_floor_bits.restype = _I
        if ((library.moment_block_elements(), library.moment_bucket_count(),
             library.moment_bucket_shift(), library.moment_bucket_floor_bits())
                != (MOMENT_BLOCK_ELEMENTS, BUCKETS, BUCKET_SHIFT, BUCKET_FLOOR_BITS)):
            raise RuntimeError("csrc/adamw.c and executor/moments.py disagree on the 8-bit "
                               "moments' block or bucket sizes")
        maps = moment_maps()
        self._maps_arrays = maps  # kept alive: the struct holds their addresses
        self._maps = _MomentMaps(*(getattr(maps, f.name).ctypes.data
                                   for f in dataclasses.fields(maps)))

    def adamw_step(self, *, param: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                   grad: torch.Tensor, weights_out: torch.Tensor | None, decay_end: int,
                   lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                   grad_scale: float, step: int) -> None:
        """AdamW step `step` (1-based) in place; writes bf16 weights to weights_out if given."""
        n = param.numel()
        for t in (exp_avg, exp_avg_sq, grad) + ((weights_out,) if weights_out is not None else ()):
            assert t.is_contiguous() and t.numel() == n and t.device.type == "cpu"
        assert grad.dtype in (torch.bfloat16, torch.float32) and param.dtype == torch.float32
        kernel = (self._lib.adamw_step_bf16_grads if grad.dtype == torch.bfloat16
                  else self._lib.adamw_step_f32_grads)
        bias_correction1 = 1.0 - beta1 ** step
        bias_correction2_sqrt = (1.0 - beta2 ** step) ** 0.5
        kernel(param.data_ptr(), exp_avg.data_ptr(), exp_avg_sq.data_ptr(), grad.data_ptr(),
               None if weights_out is None else weights_out.data_ptr(), n, decay_end, lr,
               beta1, beta2, eps, weight_decay, grad_scale, bias_correction1,
               bias_correction2_sqrt, self.threads, self.chunk)

    def adamw_step_moments(self, *, param: torch.Tensor, moments: Moments, grad: torch.Tensor,
                           weights_out: torch.Tensor | None, decay_end: int, lr: float,
                           beta1: float, beta2: float, eps: float, weight_decay: float,
                           grad_scale: float, step: int, seed: int = 0,
                           index_base: int = 0) -> None:
        """AdamW step `step` (1-based) in place with moments in any precision (fp32: as
        adamw_step). seed, index_base: the bf16 rounding noise's, for element 0 of this call
        (executor/moments.py)."""
        if moments.precision == "fp32":
            self.adamw_step(param=param, exp_avg=moments.tensors["exp_avg"],
                            exp_avg_sq=moments.tensors["exp_avg_sq"], grad=grad,
                            weights_out=weights_out, decay_end=decay_end, lr=lr, beta1=beta1,
                            beta2=beta2, eps=eps, weight_decay=weight_decay,
                            grad_scale=grad_scale, step=step)
            return
        n = param.numel()
        assert moments.numel == n and grad.numel() == n and param.dtype == torch.float32
        for t in (param, grad, *moments.tensors.values()) + (
                (weights_out,) if weights_out is not None else ()):
            assert t.is_contiguous() and t.device.type == "cpu"
        assert weights_out is None or weights_out.numel() == n
        assert grad.dtype in (torch.bfloat16, torch.float32)
        args = _AdamwArgs(lr, beta1, beta2, eps, weight_decay, grad_scale, 1.0 - beta1 ** step,
                          (1.0 - beta2 ** step) ** 0.5, decay_end, self.threads, self.chunk)
        grads = "bf16" if grad.dtype == torch.bfloat16 else "f32"
        kernel = getattr(self._lib, f"adamw_step_{moments.precision}_moments_{grads}_grads")
        out = None if weights_out is None else weights_out.data_ptr()
        t = moments.tensors
        if moments.precision == "bf16":
            kernel(param.data_ptr(), t["exp_avg"].data_ptr(), t["exp_avg_sq"].data_ptr(),
                   grad.data_ptr(), out, n, ctypes.byref(args), seed & 0xFFFFFFFF, index_base)
        else:
            kernel(param.data_ptr(), t["exp_avg"].data_ptr(), t["exp_avg_sq"].data_ptr(),
                   t["exp_avg_scale"].data_ptr(), t["exp_avg_sq_scale"].data_ptr(),
                   grad.data_ptr(), out, n, ctypes.byref(args), ctypes.byref(self._maps))

    def chunk_elements(self, numel: int) -> int:
        """Elements a thread takes at a time in a call over numel elements."""
        return self._lib.split_chunk_elements(numel, self.chunk, self.threads)

    def cast(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        assert src.dtype == torch.float32 and dst.dtype == torch.bfloat16
        assert src.is_contiguous() and dst.is_contiguous() and src.numel() == dst.numel()
        self._lib.cast_f32_to_bf16(src.data_ptr(), dst.data_ptr(), src.numel(), self.threads,
                                   self.chunk)

    def accumulate(self, total: torch.Tensor, grads: torch.Tensor, *, first: bool) -> None:
        """total = grads (first) or total += grads: bf16 grads into an fp32 sum."""
        if not (total.dtype == torch.float32 and grads.dtype == torch.bfloat16
                and total.is_contiguous() and grads.is_contiguous()
                and total.numel() == grads.numel() and total.device.type == grads.device.type
                == "cpu"):  # the kernel reads raw pointers
            raise ValueError(f"accumulate needs contiguous CPU tensors of one size, fp32 sum and "
                             f"bf16 grads; got {total.dtype}{tuple(total.shape)} and "
                             f"{grads.dtype}{tuple(grads.shape)}")
        self._lib.accumulate_bf16_grads(total.data_ptr(), grads.data_ptr(), total.numel(),
                                        int(first), self.threads, self.chunk)


def load_kernels(*, threads: int = 0, chunk: int = DEFAULT_CHUNK,
                 nice: int = 0) -> NativeKernels | None:
    """The compiled kernels, or None (no compiler, or LAYERSLIDE_NATIVE=0); threads: 0 for
    OpenMP's count; chunk: elements a thread takes at a time (0: one even slice per thread);
    nice: the worker threads' niceness (0: left as is). A run takes them from its plan
    (Policy.executor)."""
    path = build(SOURCE, FLAGS, "using torch's AdamW")
    if path is None:
        return None
    return NativeKernels(ctypes.CDLL(str(path)), threads=threads, chunk=chunk, nice=nice)
