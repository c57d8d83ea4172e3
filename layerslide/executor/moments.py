"""AdamW moments in fp32, bf16 or 8-bit blockwise codes: their buffers, the 8-bit maps, and a
plain torch step of each precision (the GPU-updated blocks' update, and the reference the
native kernel is tested against).

8-bit moments follow 8-bit Adam: per MOMENT_BLOCK_ELEMENTS elements a fp32 scale (the block's
largest |m|, largest v) and a code per element into a dynamic map, decades of linearly spaced
values with more of them in the upper decades (m: a sign and 7 bits over 7 decades; v: 8 bits
over 8). A code is the nearest map entry (ties to the lower); a positive v never rounds to 0.
bf16 moments are rounded stochastically with noise hashed from (seed, element index), so that a
step is the same bits wherever and however often it runs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from layerslide.planner.settings import MOMENT_BLOCK_ELEMENTS, MomentPrecision

# csrc/adamw.c's bucket tables: a value in [2^-27, 1] (one below in the first bucket) by its
# float bits above BUCKET_FLOOR_BITS shifted right by BUCKET_SHIFT
BUCKET_SHIFT = 16
BUCKET_FLOOR_BITS = 0x32000000  # 2^-27
BUCKETS = (0x3F800000 >> BUCKET_SHIFT) - (BUCKET_FLOOR_BITS >> BUCKET_SHIFT) + 1
# elements the torch step takes at a time: bounds its fp32 temporaries (GPU memory)
TORCH_STEP_SLICE = 1 << 22


def magnitude_map(decades: int) -> np.ndarray:
    """2**decades ascending values in [0, 1]: 0, then decade i (from 10**(1 - decades)) holding
    2**i linearly spaced values whose last is the decade's top; the top one is 1.0."""
    values = [0.0]
    for i in range(decades):
        count = 2**i
        base = 10.0 ** (i - decades + 1)
        values += [base * (0.1 + 0.9 * (k + 1) / count) for k in range(count)]
    return np.asarray(values, dtype=np.float32)


@dataclass(frozen=True)
class MomentMaps:
    """The 8-bit maps and the lookup tables csrc/adamw.c's moment_maps points to."""

    m_values: np.ndarray  # 256 float32: code (sign bit | 7-bit magnitude) -> value in [-1, 1]
    v_values: np.ndarray  # 256 float32: code -> value in [0, 1]
    m_mids: np.ndarray  # 128 float32: midpoint between magnitude codes k and k + 1, last inf
    v_mids: np.ndarray  # 256 float32
    m_bucket: np.ndarray  # BUCKETS int32: the magnitude code at each bucket's start
    v_bucket: np.ndarray


def _midpoints(values: np.ndarray) -> np.ndarray:
    mids = (values[:-1].astype(np.float64) + values[1:]) / 2
    return np.append(mids, np.inf).astype(np.float32)


def _buckets(mids: np.ndarray) -> np.ndarray:
    starts = ((np.arange(BUCKETS + 1, dtype=np.uint32) << BUCKET_SHIFT)
              + BUCKET_FLOOR_BITS).view(np.float32)
    first = np.searchsorted(mids, starts, side="left")  # mids below each bucket's start
    if np.any(first[1:] - first[:-1] > 1):  # the kernel compares with one midpoint only
        raise AssertionError("an 8-bit moment map is finer than its bucket table")
    if mids[0] <= starts[0]:  # values below the floor share the first bucket
        raise AssertionError("an 8-bit moment map reaches below its bucket table")
    return first[:-1].astype(np.int32)


@functools.cache
def moment_maps() -> MomentMaps:
    m_magnitudes, v_values = magnitude_map(7), magnitude_map(8)
    m_values = np.concatenate([m_magnitudes, -m_magnitudes]).astype(np.float32)
    m_mids, v_mids = _midpoints(m_magnitudes), _midpoints(v_values)
    return MomentMaps(m_values, v_values, m_mids, v_mids, _buckets(m_mids), _buckets(v_mids))


def num_moment_blocks(numel: int) -> int:
    return -(-numel // MOMENT_BLOCK_ELEMENTS)


class Moments:
    """A block's (or a part's) AdamW m and v in one precision: fp32 or bf16 tensors, or 8-bit
    codes with a fp32 scale per MOMENT_BLOCK_ELEMENTS for each."""

    def __init__(self, precision: MomentPrecision, tensors: dict[str, torch.Tensor]):
        self.precision, self.tensors = precision, tensors
        self.numel = tensors["exp_avg"].numel()

    @classmethod
    def zeros(cls, precision: MomentPrecision, numel: int, *,
              device: torch.device | str = "cpu") -> Moments:
        return cls(precision, {name: torch.zeros(size, dtype=dtype, device=device)
                               for name, size, dtype in cls.layout(precision, numel)})

    @staticmethod
    def layout(precision: MomentPrecision, numel: int) -> list[tuple[str, int, torch.dtype]]:
        """(name, elements, dtype) of each tensor, in the order a file or buffer holds them."""
        if precision == "int8":
            q = num_moment_blocks(numel)
            # the scales first: then a buffer aligned for them needs no padding
            return [("exp_avg_scale", q, torch.float32), ("exp_avg_sq_scale", q, torch.float32),
                    ("exp_avg", numel, torch.uint8), ("exp_avg_sq", numel, torch.uint8)]
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        return [("exp_avg", numel, dtype), ("exp_avg_sq", numel, dtype)]

    @classmethod
    def nbytes_of(cls, precision: MomentPrecision, numel: int) -> int:
        return sum(size * dtype.itemsize for _, size, dtype in cls.layout(precision, numel))

    @classmethod
    def in_buffer(cls, precision: MomentPrecision, numel: int, buffer: torch.Tensor) -> Moments:
        """Views of a uint8 buffer laid out as `layout` says (a staging buffer's moments part)."""
        tensors, start = {}, 0
        for name, size, dtype in cls.layout(precision, numel):
            end = start + size * dtype.itemsize
            tensors[name] = buffer[start:end].view(dtype)
            start = end
        return cls(precision, tensors)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def part(self, start: int, end: int) -> Moments:
        """Elements [start, end): 8-bit moments only from a MOMENT_BLOCK_ELEMENTS boundary to
        one, or to their end."""
        if self.precision != "int8":
            return Moments(self.precision, {k: t[start:end] for k, t in self.tensors.items()})
        block = MOMENT_BLOCK_ELEMENTS
        if start % block or (end % block and end != self.numel):
            raise ValueError(f"8-bit moments are cut at multiples of {block} elements: "
                             f"[{start}, {end}) of {self.numel} is not")
        q0, q1 = start // block, num_moment_blocks(end)
        return Moments("int8", {"exp_avg": self.tensors["exp_avg"][start:end],
                                "exp_avg_sq": self.tensors["exp_avg_sq"][start:end],
                                "exp_avg_scale": self.tensors["exp_avg_scale"][q0:q1],
                                "exp_avg_sq_scale": self.tensors["exp_avg_sq_scale"][q0:q1]})

    def copy_(self, other: Moments) -> None:
        for name, tensor in self.tensors.items():
            tensor.copy_(other.tensors[name])

    def dequantized(self, start: int = 0, end: int | None = None) -> tuple[torch.Tensor,
                                                                             torch.Tensor]:
        """fp32 copies of m and v over [start, end) (8-bit: block-aligned, as `part`)."""
        part = self.part(start, self.numel if end is None else end)
        m, v = part.tensors["exp_avg"], part.tensors["exp_avg_sq"]
        if self.precision != "int8":
            return m.float(), v.float()
        maps, device = moment_maps(), m.device
        scale_m = _per_element(part.tensors["exp_avg_scale"], m.numel())
        scale_v = _per_element(part.tensors["exp_avg_sq_scale"], m.numel())
        m_values = torch.from_numpy(maps.m_values).to(device)
        v_values = torch.from_numpy(maps.v_values).to(device)
        return m_values[m.long()] * scale_m, v_values[v.long()] * scale_v

    def store(self, m: torch.Tensor, v: torch.Tensor, start: int, *, seed: int = 0,
              index_base: int = 0) -> None:
        """Round fp32 m and v into elements [start, start + len): bf16 stochastically with
        noise from (seed, index_base + index), 8-bit to the nearest code with new scales."""
        end = start + m.numel()
        part = self.part(start, end)
        if self.precision == "fp32":
            part.tensors["exp_avg"].copy_(m)
            part.tensors["exp_avg_sq"].copy_(v)
        elif self.precision == "bf16":
            noise = hash32(seed ^ ((torch.arange(m.numel(), device=m.device, dtype=torch.int64)
                                    + index_base + start) & 0xFFFFFFFF))
            part.tensors["exp_avg"].copy_(bf16_stochastic(m, noise))
            part.tensors["exp_avg_sq"].copy_(bf16_stochastic(v, noise >> 16))
        else:
            _quantize_into(part, m, v)


def _per_element(scales: torch.Tensor, numel: int) -> torch.Tensor:
    return scales.repeat_interleave(MOMENT_BLOCK_ELEMENTS)[:numel]


def hash32(x: torch.Tensor) -> torch.Tensor:
    """csrc/adamw.c's hash32 (lowbias32) over int64 tensors holding uint32 values."""
    mask = 0xFFFFFFFF
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & mask
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & mask
    return x ^ (x >> 16)


def bf16_stochastic(values: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 adding the low 16 bits of noise below the kept bits; NaN stays NaN."""
    bits = values.float().contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    rounded = ((bits + (noise & 0xFFFF)) >> 16) & 0xFFFF
    quiet_nan = (bits >> 16) | 0x40
    rounded = torch.where((bits & 0x7FFFFFFF) > 0x7F800000, quiet_nan, rounded)
    return _bits_to_bf16(rounded)


def _bits_to_bf16(bits: torch.Tensor) -> torch.Tensor:
    signed = torch.where(bits >= 0x8000, bits - 0x10000, bits)  # int16's range
    return signed.to(torch.int16).view(torch.bfloat16)


def _quantize_into(part: Moments, m: torch.Tensor, v: torch.Tensor) -> None:
    block, n = MOMENT_BLOCK_ELEMENTS, m.numel()
    q = num_moment_blocks(n)
    pad = q * block - n
    blocks_m = torch.nn.functional.pad(m, (0, pad)).view(q, block)
    blocks_v = torch.nn.functional.pad(v, (0, pad)).view(q, block)
    finite = torch.isfinite(blocks_m).all(1) & torch.isfinite(blocks_v).all(1)
    m_max = torch.nan_to_num(blocks_m.abs(), nan=0.0).amax(1)
    v_max = torch.nan_to_num(blocks_v, nan=0.0).amax(1)
    nan = torch.tensor(float("nan"), device=m.device)
    part.tensors["exp_avg_scale"].copy_(torch.where(finite, m_max, nan))
    part.tensors["exp_avg_sq_scale"].copy_(torch.where(finite, v_max, nan))
    maps = moment_maps()
    m_mids = torch.from_numpy(maps.m_mids).to(m.device)
    v_mids = torch.from_numpy(maps.v_mids).to(m.device)

    def normalised(x: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
        inverse = torch.where(top > 0, 1.0 / top, torch.zeros_like(top))
        return torch.clamp(x * _per_element(inverse, n), max=1.0)

    magnitude = torch.bucketize(normalised(m.abs(), m_max), m_mids)
    codes_m = magnitude + torch.signbit(m).long() * 128
    codes_v = torch.bucketize(normalised(v, v_max), v_mids)
    codes_v = torch.where((codes_v == 0) & (v > 0), torch.ones_like(codes_v), codes_v)
    part.tensors["exp_avg"].copy_(codes_m.to(torch.uint8))
    part.tensors["exp_avg_sq"].copy_(codes_v.to(torch.uint8))


def moment_seed(block: int, step: int) -> int:
    """The noise seed of a block's bf16 moments at optimizer step `step` (1-based)."""
    return ((step * 0x9E3779B1) ^ ((block + 2) * 0x85EBCA77)) & 0xFFFFFFFF


def torch_adamw_step(param: torch.Tensor, moments: Moments, grad: torch.Tensor, *,
                     decay_end: int, lr: float, beta1: float, beta2: float, eps: float,
                     weight_decay: float, grad_scale: float, step: int, seed: int = 0,
                     index_base: int = 0, skip: torch.Tensor | None = None) -> None:
    """The native kernel's AdamW step in torch ops, on any device, a slice at a time. skip: a
    0/1 tensor; where 1, nothing changes (a step with non-finite grads, decided on the GPU)."""
    bias_correction1 = 1.0 - beta1**step
    bias_correction2_sqrt = (1.0 - beta2**step) ** 0.5
    n = param.numel()
    for start in range(0, n, TORCH_STEP_SLICE):
        end = min(n, start + TORCH_STEP_SLICE)
        g = grad[start:end].float() * grad_scale
        index = torch.arange(start, end, device=param.device)
        p = param[start:end] * torch.where(index < decay_end, 1.0 - lr * weight_decay, 1.0)
        m0, v0 = moments.dequantized(start, end)
        before = None if skip is None else [t.clone() for t in _slice_tensors(param, moments,
                                                                              start, end)]
        m = m0 + (1.0 - beta1) * (g - m0)
        v = beta2 * v0 + (1.0 - beta2) * g * g
        p = p - (lr / bias_correction1) * m / (torch.sqrt(v) / bias_correction2_sqrt + eps)
        param[start:end] = p
        moments.store(m, v, start, seed=seed, index_base=index_base)
        if before is not None:
            for old, new in zip(before, _slice_tensors(param, moments, start, end), strict=True):
                new.copy_(torch.where(skip.bool(), old, new))


def _slice_tensors(param: torch.Tensor, moments: Moments, start: int, end: int):
    return (param[start:end], *moments.part(start, end).tensors.values())
