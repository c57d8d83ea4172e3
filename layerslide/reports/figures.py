"""Figures as PNG files: timelines, memory, tuning heat maps, what-if bars and purchase scatter.

Each function builds a matplotlib Figure directly (rendered by Agg when saved), writes one PNG and
returns its path. It never touches pyplot, so it neither switches the caller's backend nor leaves
figures open in pyplot's registry, and it never shows anything.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from layerslide.reports._common import (
    GIB,
    as_traces,
    check_events,
    ordered_kinds,
    ordered_lanes,
    trace_name,
)
from layerslide.trace import TIERS, Trace

DPI = 120
_TIER_COLOURS = {"gpu": "tab:green", "host": "tab:blue", "nvme": "tab:orange"}


def _new_figure(figsize: tuple[float, float]) -> Figure:
    """A Figure on its own Agg canvas, outside pyplot (nothing global to close)."""
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: str | Path) -> Path:
    """Save `fig` as PNG at `path` (parents created) and drop its artists."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png", bbox_inches="tight")
    fig.clear()
    return path


def _fmt(value: float) -> str:
    """Short label for an annotated number: 22119 -> '22,119', 1.234 -> '1.23'."""
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _kind_colours(kinds: list[str]) -> dict[str, tuple]:
    """A colour per kind, stable for a given kind set (tab20 beyond the first 10)."""
    cmap = matplotlib.colormaps["tab20" if len(kinds) > 10 else "tab10"]
    return {kind: cmap(i % cmap.N) for i, kind in enumerate(kinds)}


def plot_timeline(
    traces: Trace | Sequence[Trace], path: str | Path, *, title: str | None = None
) -> Path:
    """Gantt chart, one row per lane, coloured by kind; several traces stack as panels sharing x."""
    traces = as_traces(traces)
    for trace in traces:
        check_events(trace)
    colours = _kind_colours(ordered_kinds(e.kind for t in traces for e in t.events))
    lanes_per = [ordered_lanes(t.lanes) for t in traces]
    heights = [max(len(lanes), 1) * 0.45 + 0.6 for lanes in lanes_per]
    fig = _new_figure((12, sum(heights) + 1.0))
    axes = fig.subplots(
        len(traces), 1, sharex=True, squeeze=False, gridspec_kw={"height_ratios": heights}
    )
    for ax, trace, lanes in zip(axes[:, 0], traces, lanes_per):
        row = {lane: i for i, lane in enumerate(lanes)}
        spans: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for e in trace.events:
            spans.setdefault((e.lane, e.kind), []).append((e.start_s, e.duration_s))
        for (lane, kind), xranges in spans.items():
            # One broken_barh per (lane, kind) keeps big traces fast to draw.
            ax.broken_barh(
                xranges, (row[lane] - 0.4, 0.8), facecolors=colours[kind], edgecolor="none"
            )
        ax.set_yticks(range(len(lanes)), lanes)
        ax.set_ylim(len(lanes) - 0.5 if lanes else 0.5, -0.5)  # first lane on top
        ax.set_title(trace_name(trace), fontsize=10, loc="left")
        ax.grid(axis="x", alpha=0.3)
        if not trace.events:
            ax.text(0.5, 0.5, "no events", transform=ax.transAxes, ha="center", va="center")
    axes[-1, 0].set_xlabel("time (s)")
    axes[-1, 0].set_xlim(left=0)
    if colours:
        # Legend to the right of the top panel; bbox_inches="tight" keeps it in the file.
        handles = [Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
        axes[0, 0].legend(
            handles,
            list(colours),
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            fontsize=8,
            frameon=False,
            title="kind",
            title_fontsize=8,
        )
    fig.suptitle(title or "timeline")
    fig.tight_layout()
    return _save(fig, path)


def plot_memory(
    trace: Trace,
    path: str | Path,
    *,
    limits_bytes: dict[str, int] | None = None,
    title: str | None = None,
) -> Path:
    """Bytes in use per tier over time (step plot, GiB = 2**30 bytes), peaks annotated, with
    optional dashed limit lines per tier."""
    fig = _new_figure((10, 4.5))
    ax = fig.subplots()
    tiers = [t for t in TIERS if any(m.tier == t for m in trace.memory)]
    tiers += sorted({m.tier for m in trace.memory} - set(tiers))
    end_s = max([trace.makespan_s] + [m.time_s for m in trace.memory])
    for i, tier in enumerate(tiers):
        colour = _TIER_COLOURS.get(tier, f"C{i + 3}")
        samples = sorted((m for m in trace.memory if m.tier == tier), key=lambda m: m.time_s)
        times_s = [m.time_s for m in samples] + [end_s]  # hold the last value to the end
        gib = [m.bytes_in_use / GIB for m in samples]
        gib.append(gib[-1])
        ax.step(times_s, gib, where="post", color=colour, label=tier)
        peak = max(samples, key=lambda m: m.bytes_in_use)
        ax.plot([peak.time_s], [peak.bytes_in_use / GIB], "o", color=colour)
        ax.annotate(
            f"{tier} peak {peak.bytes_in_use / GIB:.2f} GiB",
            (peak.time_s, peak.bytes_in_use / GIB),
            textcoords="offset points",
            xytext=(4, 4),
            fontsize=8,
            color=colour,
        )
    for tier, limit_bytes in (limits_bytes or {}).items():
        ax.axhline(
            limit_bytes / GIB,
            linestyle="--",
            linewidth=1,
            color=_TIER_COLOURS.get(tier, "grey"),
            label=f"{tier} limit",
        )
    if not trace.memory:
        ax.text(0.5, 0.5, "no memory samples", transform=ax.transAxes, ha="center", va="center")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("memory in use (GiB)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    if tiers or limits_bytes:
        ax.legend(fontsize=8)
    ax.set_title(title or f"memory: {trace_name(trace)}")
    fig.tight_layout()
    return _save(fig, path)


def plot_tuning_heatmap(
    df: pd.DataFrame,
    path: str | Path,
    *,
    x: str = "window",
    y: str = "micro_batch",
    value: str = "tokens_per_s",
    feasible: str = "feasible",
    title: str | None = None,
) -> Path:
    """Heat map of the best `value` per (x, y) cell, numbers annotated; cells with no feasible
    result (NaN, or `feasible` False where that column exists) are grey and marked 'x'."""
    missing = [c for c in (x, y, value) if c not in df.columns]
    if missing:
        raise ValueError(f"plot_tuning_heatmap: columns {missing} not in {list(df.columns)}")
    values = pd.to_numeric(df[value], errors="coerce")
    if feasible in df.columns:
        values = values.where(df[feasible].fillna(False).astype(bool))
    data = pd.DataFrame({x: df[x], y: df[y], value: values})
    xs = sorted(data[x].dropna().unique())
    ys = sorted(data[y].dropna().unique())
    grid = (
        data.groupby([y, x])[value]
        .max()  # max skips NaN: NaN only if none feasible
        .unstack(x)
        .reindex(index=ys, columns=xs)
    )
    arr = grid.to_numpy(dtype=float)
    fig = _new_figure((max(4.0, 0.9 * len(xs) + 2.5), max(3.0, 0.6 * len(ys) + 1.5)))
    ax = fig.subplots()
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="lightgrey")
    masked = np.ma.masked_invalid(arr)
    image = ax.imshow(masked, cmap=cmap, aspect="auto", origin="lower")
    finite = arr[np.isfinite(arr)]
    mid = (finite.min() + finite.max()) / 2 if finite.size else 0.0
    for (i, j), v in np.ndenumerate(arr):
        if np.isfinite(v):
            ax.text(
                j,
                i,
                _fmt(v),
                ha="center",
                va="center",
                fontsize=8,
                color="black" if v > mid else "white",
            )
        else:
            ax.text(j, i, "x", ha="center", va="center", fontsize=11, color="dimgrey")
    ax.set_xticks(range(len(xs)), [str(v) for v in xs])
    ax.set_yticks(range(len(ys)), [str(v) for v in ys])
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    fig.colorbar(image, ax=ax, label=f"best {value}")
    ax.set_title(title or f"best {value} per ({x}, {y}); x = no feasible result", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def plot_whatif(
    df: pd.DataFrame,
    path: str | Path,
    *,
    label: str = "profile",
    value: str = "tokens_per_s",
    feasible: str = "feasible",
    reason: str = "reason",
    title: str | None = None,
) -> Path:
    """Bars of the best `value` per `label` (a profile or model), in first-seen order; labels with
    no feasible row are marked 'infeasible' (with the first `reason`, where that column exists)."""
    missing = [c for c in (label, value) if c not in df.columns]
    if missing:
        raise ValueError(f"plot_whatif: columns {missing} not in {list(df.columns)}")
    values = pd.to_numeric(df[value], errors="coerce")
    if feasible in df.columns:
        values = values.where(df[feasible].fillna(False).astype(bool))
    labels = list(dict.fromkeys(df[label].astype(str)))
    data = pd.DataFrame({label: df[label].astype(str), value: values})
    best = data.groupby(label, sort=False)[value].max().reindex(labels)
    reasons: dict[str, str] = {}
    if reason in df.columns:
        for name, why in zip(df[label].astype(str), df[reason]):
            if isinstance(why, str) and why and name not in reasons:
                reasons[name] = why
    fig = _new_figure((max(5.0, 0.8 * len(labels) + 2.0), 4.5))
    ax = fig.subplots()
    heights = best.fillna(0.0).to_numpy()
    bars = ax.bar(range(len(labels)), heights, color="tab:blue")
    top = float(np.nanmax(best.to_numpy())) if best.notna().any() else 1.0
    for i, (name, v) in enumerate(best.items()):
        if math.isnan(v):
            bars[i].set_color("lightgrey")
            why = reasons.get(name, "")
            text = "infeasible" + (f"\n{why[:40]}" if why else "")
            ax.text(
                i,
                top * 0.02,
                text,
                ha="center",
                va="bottom",
                fontsize=7,
                color="tab:red",
                rotation=90,
            )
        else:
            ax.text(i, v, _fmt(v), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
    ax.set_ylabel(f"best {value}")
    ax.set_ylim(0, top * 1.12)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(title or f"best {value} per {label}")
    fig.tight_layout()
    return _save(fig, path)


_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def plot_purchase(
    df: pd.DataFrame,
    path: str | Path,
    *,
    target: float | None = None,
    title: str | None = None,
) -> Path:
    """Tokens/s against cost, one point per machine variant: colour by `card`, marker by
    `platform`, size by `drives`; the target as a dashed line and the cheapest variant that
    reaches it circled. Without costs (no prices) the x axis is RAM (`ram_bytes`, GiB).
    Variants where the model does not fit sit at 0 tokens/s, hollow."""
    missing = [c for c in ("tokens_per_s", "card", "platform", "ram_bytes") if c not in df.columns]
    if missing:
        raise ValueError(f"plot_purchase: columns {missing} not in {list(df.columns)}")
    tps = pd.to_numeric(df["tokens_per_s"], errors="coerce").fillna(0.0)
    cost = pd.to_numeric(df["cost"], errors="coerce") if "cost" in df.columns else None
    by_cost = cost is not None and cost.notna().any()
    x = cost if by_cost else df["ram_bytes"] / GIB
    drives = df["drives"] if "drives" in df.columns else pd.Series(1, index=df.index)
    cards = list(dict.fromkeys(df["card"].astype(str)))
    platforms = list(dict.fromkeys(df["platform"].astype(str)))
    colours = _kind_colours(cards)
    fig = _new_figure((9.0, 5.5))
    ax = fig.subplots()
    for card in cards:
        for i, platform in enumerate(platforms):
            sel = (df["card"].astype(str) == card) & (df["platform"].astype(str) == platform)
            sel &= x.notna()
            if not sel.any():
                continue
            fits = sel & (tps > 0)
            for mask, face in ((fits, colours[card]), (sel & ~fits, "none")):
                if mask.any():
                    ax.scatter(x[mask], tps[mask], s=30 + 25 * drives[mask].astype(float),
                               marker=_MARKERS[i % len(_MARKERS)], facecolors=face,
                               edgecolors=colours[card], linewidths=1.2, alpha=0.85)
    handles = [Line2D([], [], color=colours[c], marker="o", linestyle="",
                                       label=c) for c in cards]
    handles += [Line2D([], [], color="grey", marker=_MARKERS[i % len(_MARKERS)],
                                        linestyle="", markerfacecolor="none", label=p)
                for i, p in enumerate(platforms)]
    if target is not None:
        ax.axhline(target, color="tab:red", linestyle="--", linewidth=1)
        handles.append(Line2D([], [], color="tab:red", linestyle="--",
                                               label=f"target {_fmt(target)} tokens/s"))
        meets = (tps >= target) & x.notna()
        if meets.any():
            cheapest = x[meets].idxmin()
            ax.scatter([x[cheapest]], [tps[cheapest]], s=400, facecolors="none",
                       edgecolors="black", linewidths=1.5)
            label = str(df.loc[cheapest, "profile"]) if "profile" in df.columns else ""
            ax.annotate(f"cheapest reaching the target\n{label}", (x[cheapest], tps[cheapest]),
                        xytext=(10, -30), textcoords="offset points", fontsize=7)
    currency = ""
    if by_cost and "currency" in df.columns:
        currency = next((c for c in df["currency"] if isinstance(c, str)), "")
    ax.set_xlabel(f"machine cost ({currency})" if by_cost else "host RAM (GiB)")
    ax.set_ylabel("best tokens/s (simulated)")
    ax.grid(alpha=0.3)
    ax.legend(handles=handles, fontsize=7, loc="best", title="card / platform (size: drives)",
              title_fontsize=7)
    ax.set_title(title or "tokens/s against cost, per machine variant")
    fig.tight_layout()
    return _save(fig, path)
