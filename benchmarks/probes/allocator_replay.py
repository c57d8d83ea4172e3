"""Checks the simulator's model of the caching allocator (layerslide.simulator.allocator) against
the real one: replays the requests an allocator history recorded (`validate_sim.py
--allocator-history`) and compares the reserve the model ends with to the pages the run mapped,
per stream. Run anywhere (no GPU):
    python benchmarks/probes/allocator_replay.py R/traces/*.allocator.pickle.gz
A history that gave pages back mid-run (empty_cache after a warm-up) is compared up to that point:
the holes it leaves in the address range are not modelled (training never empties its cache).
"""

from __future__ import annotations

import argparse
import gzip
import pickle
from pathlib import Path

from layerslide.simulator.allocator import CachingAllocatorModel

MIB = 2**20
GROWS = ("segment_alloc", "segment_map")
SHRINKS = ("segment_free", "segment_unmap")


def replay(events: list[dict]) -> dict[int, tuple[int, int]]:
    """Per stream: (bytes the model reserves, bytes the run mapped) over the events."""
    model = CachingAllocatorModel()
    mapped: dict[int, int] = {}
    live: set[int] = set()
    for e in events:
        stream, action = e["stream"], e["action"]
        if action == "alloc":
            model.allocate(str(stream), e["addr"], e["size"])
            live.add(e["addr"])
        elif action == "free_completed" and e["addr"] in live:  # not one from before recording
            model.free(e["addr"])
            live.remove(e["addr"])
        elif action in GROWS:
            mapped[stream] = mapped.get(stream, 0) + e["size"]
    reserved = model.reserved_bytes()
    return {s: (reserved.get(str(s), 0), m) for s, m in mapped.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("histories", type=Path, nargs="+")
    args = ap.parse_args()
    print("| history | stream | model reserves MiB | run mapped MiB | difference |")
    print("| --- | --- | --- | --- | --- |")
    for path in args.histories:
        with gzip.open(path, "rb") as f:
            snapshot = pickle.load(f)
        events = [e for trace in snapshot["device_traces"] for e in trace]
        shrink = next((i for i, e in enumerate(events) if e["action"] in SHRINKS), None)
        name = path.name.split(".")[0] + ("" if shrink is None else " (until emptied)")
        for stream, (model, run) in sorted(replay(events[:shrink]).items()):
            print(f"| {name} | {stream:#x} | {model / MIB:.0f} | "
                  f"{run / MIB:.0f} | {(model - run) / MIB:+.0f} |")


if __name__ == "__main__":
    main()
