"""What a layer-major fp32 grad sum costs per micro-batch, two ways, on one decoder layer's
weight shapes: autograd's bf16 weight grad (the GEMM) then an fp32 add into the sum (as the
executor does today), against one GEMM that accumulates into the fp32 sum itself
(aten addmm.dtype_out, beta 1). Prints the median ms of each, the bytes each moves, and each
sum's error against an fp64 reference after `--adds` micro-batches.

usage: python benchmarks/probes/grad_sum_probe.py --model llama-3.2-3b --tokens 4096 --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the bench
from layer_kernels_bench import time_ms

from layerslide.executor.blocks import ModelBlocks, hf_config_from_spec
from layerslide.planner.model import resolve_model


def weight_shapes(model: str) -> list[tuple[int, int]]:
    blocks = ModelBlocks(hf_config_from_spec(resolve_model(model)))
    return [s.shape for s in blocks.layouts[0] if len(s.shape) == 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama-3.2-3b")
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096])
    ap.add_argument("--adds", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    shapes = weight_shapes(args.model)
    dev = torch.device("cuda")
    results = {"model": args.model, "shapes": shapes, "cases": []}
    for tokens in args.tokens:
        # per weight [out, in]: the upstream grad [tokens, out] and the input [tokens, in]
        grads_out = [torch.randn(tokens, o, device=dev, dtype=torch.bfloat16) * 1e-2
                     for o, _ in shapes]
        inputs = [torch.randn(tokens, i, device=dev, dtype=torch.bfloat16) for _, i in shapes]
        sums = [torch.zeros(o, i, device=dev) for o, i in shapes]

        def gemm_then_add(grads_out=grads_out, inputs=inputs, sums=sums):
            for g, x, s in zip(grads_out, inputs, sums, strict=True):
                s.add_(g.T @ x)

        def gemm_into_sum(grads_out=grads_out, inputs=inputs, sums=sums):
            for g, x, s in zip(grads_out, inputs, sums, strict=True):
                torch.ops.aten.addmm.dtype_out(s, g.T, x, torch.float32, out=s)

        def gemm_only(grads_out=grads_out, inputs=inputs):
            for g, x in zip(grads_out, inputs, strict=True):
                g.T @ x

        for fn in (gemm_then_add, gemm_into_sum, gemm_only):
            fn()
        torch.cuda.synchronize()
        case = {"tokens": tokens}
        for fn in (gemm_only, gemm_then_add, gemm_into_sum):
            case[f"{fn.__name__}_ms"] = time_ms(fn, args.repeats)
        # accuracy over `adds` micro-batches (fresh upstream grads each), against fp64
        errors = {}
        for fn in (gemm_then_add, gemm_into_sum):
            torch.manual_seed(0)
            for s in sums:
                s.zero_()
            ref = [torch.zeros(o, i, device=dev, dtype=torch.float64) for o, i in shapes]
            for _ in range(args.adds):
                for g in grads_out:
                    g.normal_(0, 1e-2)
                fn()
                for g, x, r in zip(grads_out, inputs, ref, strict=True):
                    r.add_(g.double().T @ x.double())
            err = max(float((s.double() - r).abs().max() / r.abs().max())
                      for s, r in zip(sums, ref, strict=True))
            errors[fn.__name__] = err
        case["max_rel_error_after_adds"] = errors
        params = sum(o * i for o, i in shapes)
        case["layer_weight_params"] = params
        results["cases"].append(case)
        print(json.dumps(case), flush=True)
    (args.out / "grad_sum_probe.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
