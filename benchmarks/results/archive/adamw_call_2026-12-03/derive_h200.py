"""h200-bench's AdamW and host-sharing figures under the call-time model (a block of n params
takes call + n / rate), from measurements already made on the H200 machine: the call time from
adamw_blocks_2026-11-30's fit over blocks of 17-394 M params, the rest from
sharing_2026-11-30's runs with that time taken out of each AdamW call, fitted as calibrate
fits them. No training row is used. Run from the repo root: python3 THIS_FILE"""

import json
from pathlib import Path

from layerslide.calibrate import without_call, without_call_in_sharing
from layerslide.calibrate.sharing import fit_host_sharing

RESULTS = Path(__file__).resolve().parents[1]
CALL_S = 2.28e-3  # adamw_blocks_2026-11-30/adamw_blocks.txt: "alone: fit t0 2.28 ms"


def main() -> None:
    probe = json.loads((RESULTS / "sharing_2026-11-30" / "host_sharing.json").read_text())
    block = probe["block_params"]
    rates = {mode: {key.removesuffix("_gb_s"): value * 1e9 for key, value in run.items()
                    if key.endswith("_gb_s")} for mode, run in probe["median"].items()}
    fitted = {m.key: m.value for m in fit_host_sharing(without_call_in_sharing(rates, block,
                                                                               CALL_S))}
    adamw = without_call(probe["median"]["adamw"]["adamw_gparam_s"] * 1e9, block, CALL_S)
    print(f"blocks of {block / 2**20:.0f} Mi params, a call's fixed time {CALL_S * 1e3} ms")
    print(f"host.adamw_throughput {adamw / 1e9:.3f} Gparam/s "
          f"(was {probe['median']['adamw']['adamw_gparam_s']:.3f} with the calls in)")
    print(f"host.memory_bandwidth {fitted['shared_capacity_per_adamw'] * adamw * 28 / 1e9:.1f} "
          "GB/s")
    for key in ("host.dma_read_cost", "host.dma_write_cost", "host.dma_share",
                "host.dma_write_share"):
        print(f"{key} {fitted[key]:.3f}")


if __name__ == "__main__":
    main()
