"""Which resource bounds a step: the one whose floor (Prediction.floors_s, a lower bound on the
step from that resource alone) is the largest, named as a user would, with its share of the
step. A step within a few percent of its bound's floor runs as fast as that resource allows;
well above it, the schedule's waits take the rest."""

from __future__ import annotations

# a floor's key (predict.step_floors: 'lane:<lane>', 'dispatch:<lane>', or a shared
# resource) -> the resource it measures
BOUND_OF_FLOOR = {
    "lane:gpu": "GPU compute", "dispatch:gpu": "GPU launches (host CPU)",
    "lane:h2d": "PCIe", "lane:d2h": "PCIe", "pcie": "PCIe",
    "lane:cpu": "CPU AdamW", "lane:cpu_cast": "CPU casts",
    "host_memory": "host memory bandwidth",
    "nvme": "NVMe", "lane:nvme_read": "NVMe", "lane:nvme_write": "NVMe",
    "lane:gather": "GPU interconnect", "lane:reduce": "GPU interconnect",
    "interconnect": "GPU interconnect", "network": "network",
}


def bound_of(floors_s: dict[str, float], step_s: float | None) -> tuple[str | None, float | None]:
    """(the resource whose floor is the largest, that floor over the step); (None, None)
    without floors or a step."""
    if not floors_s or not step_s:
        return None, None
    key = max(floors_s, key=floors_s.get)
    return BOUND_OF_FLOOR.get(key, key), floors_s[key] / step_s
