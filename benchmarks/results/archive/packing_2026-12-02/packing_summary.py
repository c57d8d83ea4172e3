"""Real (non-pad) tokens per second of each packing run: packed rows are all real tokens,
padded rows hold one example each (its mean length from the run's data line)."""

import json
import re
import statistics
import sys
from pathlib import Path

out = Path(sys.argv[1])
rows = {}
for log in sorted(out.glob("*.jsonl")):
    steps = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    steps = [s for s in steps if "loss" in s]
    text = (out / f"{log.stem}.txt").read_text()
    found = re.search(r"^data: .*?: (\d+) examples.*?, (\d+) tokens.*?(packed|unpacked)", text,
                      re.MULTILINE)
    if len(steps) < 4 or not found:
        print(f"{log.stem}: {len(steps)} steps logged; no summary")
        continue
    examples, tokens, kind = int(found[1]), int(found[2]), found[3]
    step_s = statistics.median(s["step_s"] for s in steps[2:])
    per_step = steps[-1]["tokens_per_s"] * steps[-1]["step_s"]  # row tokens, pads included
    seq_len = int(re.search(r"x (\d+) tokens", text)[1])
    # padded: a row per example, holding its mean length of real tokens
    real = per_step if kind == "packed" else per_step / seq_len * tokens / examples
    rows[log.stem] = {"step_s": step_s, "row_tokens_per_step": per_step,
                      "real_tokens_per_step": real, "real_tokens_per_s": real / step_s,
                      "gpu_peak_gib": max(s["gpu_peak_bytes"] for s in steps) / 2**30}
    print(f"{log.stem}: median {step_s:.3f} s/step, {real:,.0f} real of {per_step:,.0f} row "
          f"tokens a step, {real / step_s:,.0f} real tokens/s, GPU peak "
          f"{rows[log.stem]['gpu_peak_gib']:.2f} GiB")
if "packed_mask" in rows:
    base = rows["packed_mask"]["real_tokens_per_s"]
    for label, row in rows.items():
        print(f"  {label}: {row['real_tokens_per_s'] / base:.3f}x packed_mask's real tokens/s")
(out / "summary.json").write_text(json.dumps(rows, indent=1))
