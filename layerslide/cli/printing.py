"""How the planning commands print: JSON for programs, GiB for people."""

from __future__ import annotations

import json

import pandas as pd

from layerslide.cli.options import (
    gib,
)


def print_json(data) -> None:
    # allow_nan=False: NaN is not JSON; missing values must already be None
    print(json.dumps(data, indent=2, default=str, allow_nan=False))


def records(df: pd.DataFrame) -> list[dict]:
    """DataFrame rows as dicts with None (JSON null) where pandas holds NaN."""
    return df.astype(object).where(df.notna(), None).to_dict(orient="records")


def gib_columns(df: pd.DataFrame) -> pd.DataFrame:
    """Rename *_bytes columns to *_GiB with values in GiB, for people."""
    out = df.copy()
    for col in [c for c in df.columns if c.endswith("_bytes")]:
        out[col.removesuffix("_bytes") + "_GiB"] = gib(out.pop(col))
    return out
