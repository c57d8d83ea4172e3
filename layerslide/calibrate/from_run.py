"""A profile's CPU AdamW from a training run: the rate `layerslide train` measured on its decoder
layers with no copy beside them (prediction-check.json, reports.run_check), where calibrate's
own test of the kernel read lower. On the H200 machine the executor's calls ran 3-23% faster
than the profile calibrated minutes before (benchmarks/results/validation_2026-12-03c)."""

from __future__ import annotations

import json
from pathlib import Path

from layerslide.calibrate.host import Measurement
from layerslide.hwprofiles import HardwareProfile
from layerslide.reports.run_check import CHECK_FILE

RATE_KEYS = {"fp32": "host.adamw_throughput", "bf16": "host.adamw_bf16_throughput",
             "int8": "host.adamw_int8_throughput"}


def read_check(run: str | Path) -> dict:
    """The run's prediction check (a folder `train --out` wrote, or the file itself)."""
    path = Path(run)
    path = path / CHECK_FILE if path.is_dir() else path
    if not path.is_file():
        raise ValueError(f"{path}: no such file; pass the folder `layerslide train --out` "
                         f"wrote ({CHECK_FILE} in it)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not a prediction check ({err})") from err


def adamw_from_run(check: dict, base: HardwareProfile) -> list[Measurement]:
    """The base profile's AdamW rate for the run's moments moved to what the run measured: the
    part of a call past its fixed time (host.adamw_call_overhead) scaled by how much longer the
    prediction's took than the run's, and with the fp32 rate the host memory's capacity
    (calibrate keeps it as a ratio to that rate: calibrate.sharing). base must be the profile
    the run was predicted on."""
    predicted = check.get("predicted_adamw_alone_params_per_s")
    measured = check.get("measured_adamw_alone_params_per_s")
    layer_params = check.get("layer_params") or 0
    precision = check.get("moment_precision", "fp32")
    if not predicted or not measured or layer_params <= 0:
        raise ValueError("the run's check has no CPU AdamW task with no copy beside it (its "
                         "layers updated on the GPU, too short a run, or a check written "
                         "before layerslide recorded it): nothing to calibrate from")
    if precision not in RATE_KEYS:
        raise ValueError(f"moment_precision {precision!r}: one of {', '.join(RATE_KEYS)}")
    call_s = base.host.adamw_call_s
    predicted_s, measured_s = layer_params / predicted, layer_params / measured
    if min(predicted_s, measured_s) <= call_s:
        raise ValueError(f"a layer's AdamW took {measured_s * 1e3:.2f} ms (predicted "
                         f"{predicted_s * 1e3:.2f}), not more than the profile's fixed "
                         f"{call_s * 1e3:.2f} ms a call: too small a model to tell its rate")
    scale = (predicted_s - call_s) / (measured_s - call_s)
    how = (f"from a training run's decoder layers ({layer_params / 1e6:.0f} M params, "
           f"{precision} moments): AdamW with no copy beside it ran {measured / 1e9:.2f} "
           f"Gparam/s where {base.name} predicted {predicted / 1e9:.2f}; {base.name}'s rate "
           f"x {scale:.3f}")
    host = base.host
    rate = {"fp32": host.adamw_params_per_s, "bf16": host.adamw_bf16_params_per_s,
            "int8": host.adamw_int8_params_per_s}[precision]
    if rate is None:
        raise ValueError(f"{base.name} has no {precision}-moment AdamW rate to move: the "
                         "run's prediction used its bytes instead; calibrate measures it")
    found = [Measurement(key=RATE_KEYS[precision], value=rate * scale, how=how)]
    if precision == "fp32":
        found.append(Measurement(key="host.memory_bandwidth",
                                 value=host.memory_bytes_per_s * scale,
                                 how=f"{base.name}'s, moved with its AdamW rate: {how}"))
    return found
