"""The figures, drawn from the result rows alone (so --from-csv redraws them from a committed CSV).

<stem>.png, the main figure: for every op (a row) and dtype (a colour), our median time as a multiple of a
reference, one marker per reduction, in three panels: the memory roofline at 16M elements, the ATen /
composite / F baseline at 16M, and aten.smooth_l1_loss_backward (per-call overhead) at 4K. A row held to a
target has the limit drawn as a black bar with the side that misses shaded; a cell that misses is ringed in
red. Everything is a time ratio, lower is faster, on a log scale so that 2x faster and 2x slower are as far
from 1x.

<stem>_bandwidth.png, the secondary figure: effective GB/s against size, ours (solid) and the baseline
(dotted) per op, with the roofline (black), for reduction 'none' at the target thread count.
"""
from __future__ import annotations

import math
import sys

from .common import BACKWARD_OPS, BASELINE, DTYPE_SHORT, DTYPES, FORWARD_OPS, REDUCTIONS, SMALL_SIZE, STEP_OPS, \
    TARGET_SIZE, backward_roofline, forward_roofline, format_size
from .targets import BASELINE_PANEL, ROOFLINE, SMALL, Comparison, target_threads

DPI = 100  # 16 x 10 inches -> 1600 x 1000 pixels; 12 pt text is about 17 pixels high at 100 %
DTYPE_COLOR = {"float32": "#1f6fb4", "bfloat16": "#e07b00", "float16": "#2a9d4b"}
REDUCTION_MARKER = {"none": "o", "mean": "s", "sum": "^"}
MISS_COLOR = "#d62728"
OP_COLOR = dict(zip(BACKWARD_OPS, ("#1f6fb4", "#17becf", "#d62728", "#2a9d4b", "#e07b00", "#8e44ad"), strict=True))
OP_COLOR.update(zip(FORWARD_OPS, list(OP_COLOR.values())))  # a forward op and its gradient alike

# The rows of the main figure, top to bottom: (group heading, [((op, variant), label)]).
ROW_GROUPS = [
    ("backward, allocating", [((op, "ours"), op) for op in BACKWARD_OPS]),
    ("backward, out= (preallocated)", [((op, "ours_out"), f"{op} out=") for op in BACKWARD_OPS]),
    ("forward", [((op, "ours"), op) for op in FORWARD_OPS]),
    ("forward + backward step, 'mean'", [((op, "ours"), op) for op in STEP_OPS]),
]
GROUP_OF_ROW = {key: heading for heading, rows in ROW_GROUPS for key, _ in rows}
PANEL_TITLES = {  # three lines each, so that the panels line up
    ROOFLINE: f"{format_size(TARGET_SIZE)} elements ÷ memory roofline:\n"
              "an ATen op with the same read and\nwrite streams, same form",
    BASELINE_PANEL: f"{format_size(TARGET_SIZE)} elements ÷ baseline, same form:\n"
                    "ATen (smooth L1/Huber/MSE grads, forwards),\nthe composite (L1/KL grads), F (steps)",
    SMALL: f"{format_size(SMALL_SIZE)} elements ÷ per-call overhead of\n"
           "aten.smooth_l1_loss_backward, same\nform (steps: ÷ F)",
}
# Where a panel has no reference for a whole group of rows, it says why.
NO_REFERENCE = {(ROOFLINE, "forward + backward step, 'mean'"): "a step runs several ops: no single roofline"}
OP_NAMES = {"smooth_l1_loss_backward": "smooth L1", "huber_loss_backward": "Huber", "mse_loss_backward": "MSE",
            "l1_loss_backward": "L1", "kl_div_target_backward": "KL",
            "kl_div_target_backward[log]": "KL, log_target"}


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no figures (scripts/run_benchmarks.sh installs it)", file=sys.stderr)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 12, "axes.titlesize": 13, "axes.labelsize": 12, "xtick.labelsize": 11,
                         "ytick.labelsize": 12, "legend.fontsize": 12})
    return plt


def _subtitle(meta: dict[str, str], threads: int | None) -> str:
    """Which kernels ran (ours: cpu_kernel_isa; ATen's: torch's CPU capability) and on which CPU."""
    return (f"npu_loss_ops {meta['npu_loss_ops']} (git {meta['git_sha']}), our kernels {meta['cpu_kernel_isa']}, "
            f"torch {meta['torch']} (ATen kernels {meta['cpu_capability']}), CPU {meta['cpu']}, {threads} threads, "
            f"{meta['date'][:10]}")


def _log_ticks(lo: float, hi: float, primary: list[float], secondary: list[float]) -> list[float]:
    """The primary ticks within [lo, hi], and the secondary ones too when the range is narrow (less than a
    factor 10), where the primary ones alone would be two or three."""
    ticks = [t for t in primary if lo <= t <= hi]
    if hi / lo < 10:
        ticks += [t for t in secondary if lo <= t <= hi]
    return sorted(ticks)


RATIO_TICKS = ([0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64], [0.75, 1.5, 3])
GBPS_TICKS = ([0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500], [])


def limit_label(c: Comparison) -> str:
    return f"≥ {c.limit:g}× faster" if c.speedup else f"≤ {c.limit:g}×"


def main_figure(comparisons: list[Comparison], dtypes: list[str], meta: dict[str, str], threads: int | None,
                path: str) -> bool:
    """Our time as a multiple of each reference, per op and dtype; see the module docstring."""
    panels = [p for p in (ROOFLINE, BASELINE_PANEL, SMALL) if any(c.panel == p for c in comparisons)]
    if not panels:
        return False
    plt = _pyplot()
    if plt is None:
        return False
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import FixedLocator, NullLocator

    present = {c.row for c in comparisons}
    # y positions, top down: a heading line per group, then its rows.
    ticks: list[float] = []
    labels: list[str] = []
    headings: list[tuple[float, str, float]] = []  # (y of the heading, heading, y of the group's last row)
    rows_y: dict[tuple[str, str], float] = {}
    y = 0.0
    for heading, rows in ROW_GROUPS:
        rows = [(key, label) for key, label in rows if key in present]
        if not rows:
            continue
        headings.append((y, heading, y - len(rows)))
        for key, label in [(None, heading)] + rows:
            if key is not None:
                rows_y[key] = y
            ticks.append(y)
            labels.append(label)
            y -= 1
        y -= 0.3  # a little space between groups
    offsets = {d: (k - (len(dtypes) - 1) / 2) * 0.3 for k, d in enumerate(dtypes)}

    height = 2.3 + 0.36 * len(ticks)
    fig, axes = plt.subplots(1, len(panels), figsize=(16, height), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, panel in zip(axes, panels):
        comps = [c for c in comparisons if c.panel == panel]
        values = [r for c in comps for r in c.values] + [c.ratio_limit for c in comps if c.limit is not None]
        lo, hi = min(values + [1.0]), max(values + [1.0])
        xmin, xmax = lo / 1.35, hi * 1.35  # room for the markers at both ends
        ax.set_xscale("log")
        ax.set_xlim(xmin, xmax)
        ax.axvline(1.0, color="0.55", linewidth=1, zorder=0)
        for c in comps:
            yc = rows_y[c.row]
            if c.limit is not None:  # the target: a bar at the limit, the side that misses shaded
                lim = c.ratio_limit
                ax.fill_betweenx([yc - 0.45, yc + 0.45], lim, xmax * 2, color=MISS_COLOR, alpha=0.09, linewidth=0)
                ax.plot([lim, lim], [yc - 0.45, yc + 0.45], color="black", linewidth=2.2, solid_capstyle="butt")
            for d in dtypes:
                cells = [(red, c.ratios.get((d, red))) for red in REDUCTIONS]
                cells = [(red, r) for red, r in cells if r is not None]
                if not cells:
                    continue
                yd = yc - offsets[d]
                rs = [r for _, r in cells]
                ax.plot([min(rs), max(rs)], [yd, yd], color=DTYPE_COLOR[d], linewidth=2, alpha=0.45)
                for red, r in cells:
                    ax.plot(r, yd, REDUCTION_MARKER[red], color=DTYPE_COLOR[d], markersize=8,
                            markeredgecolor="white", markeredgewidth=0.6, zorder=3)
                    if not c.passed(r) and not c.unreliable.get((d, red)):  # a disturbed cell: not judged
                        ax.plot(r, yd, "o", markersize=15, markerfacecolor="none", markeredgecolor=MISS_COLOR,
                                markeredgewidth=2, zorder=4)
        for k, (yh, heading, ylast) in enumerate(headings):
            if k:
                ax.axhline(yh + 0.65, color="0.8", linewidth=1)
            in_group = [c for c in comps if GROUP_OF_ROW[c.row] == heading]
            # The group's limits as the targets state them, on its heading line (no data there), above the bars;
            # several limits in one group share one label, ending at the rightmost bar.
            limits = sorted({c.ratio_limit: c for c in in_group if c.limit is not None}.values(),
                            key=lambda c: c.ratio_limit)
            if len(limits) == 1:
                ax.text(limits[0].ratio_limit, yh - 0.1, limit_label(limits[0]), ha="center", va="center",
                        fontsize=11)
            elif limits:
                ax.text(limits[-1].ratio_limit, yh - 0.1, ", ".join(limit_label(c) for c in limits), ha="right",
                        va="center", fontsize=10)
            why = NO_REFERENCE.get((panel, heading))
            if why and not in_group:
                ax.text(math.sqrt(xmin * xmax), (yh - 1 + ylast) / 2, why, ha="center", va="center", color="0.4",
                        style="italic")
        ax.xaxis.set_major_locator(FixedLocator(_log_ticks(xmin, xmax, *RATIO_TICKS)))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(lambda v, _: f"{v:g}×")
        ax.grid(True, axis="x", color="0.9")
        ax.set_title(PANEL_TITLES[panel], loc="left")
        ax.set_xlabel("our time ÷ reference (lower is faster)")
    axes[0].set_yticks(ticks, labels)
    axes[0].set_ylim(y + 0.5, 0.6)
    for tick, label in zip(axes[0].get_yticklabels(), labels):
        if label in {h for h, _ in ROW_GROUPS}:
            tick.set_fontweight("bold")
    axes[0].tick_params(axis="y", length=0)

    handles = [Line2D([], [], color=DTYPE_COLOR[d], linewidth=3, label=DTYPE_SHORT[d]) for d in dtypes]
    reductions = {red for c in comparisons for (_, red), r in c.ratios.items() if r is not None}
    handles += [Line2D([], [], linestyle="", marker=REDUCTION_MARKER[r], color="0.35", markersize=8,
                       label=f"'{r}'") for r in REDUCTIONS if r in reductions]
    handles += [Line2D([], [], color="black", linewidth=2.2, label="target limit"),
                Patch(color=MISS_COLOR, alpha=0.15, label="misses the target"),
                Line2D([], [], linestyle="", marker="o", markersize=13, markerfacecolor="none",
                       markeredgecolor=MISS_COLOR, markeredgewidth=2, label="a cell that misses")]
    fig.suptitle(f"Our time as a multiple of each reference (median per call)\n{_subtitle(meta, threads)}",
                 x=0.01, ha="left", fontsize=13)
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.01, 1 - 0.62 / height), ncol=len(handles),
               frameon=False, handlelength=1.6, columnspacing=1.4)
    fig.tight_layout()
    fig.subplots_adjust(top=1 - 1.85 / height)  # below the two-line title, the legend and the panel titles
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return True


def bandwidth_figure(rows: list[dict], meta: dict[str, str], path: str) -> bool:
    """Effective GB/s against size: ours, the baseline and the roofline, reduction 'none' if measured."""
    threads = target_threads(rows)
    if threads is None:
        return False
    reductions = [r for r in REDUCTIONS if any(row["reduction"] == r for row in rows)]
    reduction = "none" if "none" in reductions else reductions[0]
    rows = [r for r in rows if r["threads"] == threads and r["reduction"] == reduction]
    dtypes = [d for d in DTYPES if any(r["dtype"] == d for r in rows)]
    # Columns: (title, ops, our variant (its baseline is BASELINE's), the roofline's (op, variant))
    columns = [
        ("backward, allocating", BACKWARD_OPS, "ours", (backward_roofline(reduction), "functional")),
        ("backward, out=", BACKWARD_OPS, "ours_out", (backward_roofline(reduction), "out")),
        ("forward", FORWARD_OPS, "ours", (forward_roofline(reduction), "functional")),
    ]
    columns = [col for col in columns if any(r["op"] in col[1] for r in rows)]
    if not columns or not dtypes:
        return False
    plt = _pyplot()
    if plt is None:
        return False
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator

    def series(op, variant, dtype):
        pts = sorted((r["numel"], r["GBps"]) for r in rows
                     if r["op"] == op and r["variant"] == variant and r["dtype"] == dtype)
        return [p[0] for p in pts], [p[1] for p in pts]

    sizes = sorted({r["numel"] for r in rows})
    height = 1.6 + 4.2 * len(dtypes)
    fig, axes = plt.subplots(len(dtypes), len(columns), figsize=(16, height), sharex=True, sharey="row",
                             squeeze=False)
    for i, dtype in enumerate(dtypes):
        plotted: list[float] = []  # every GB/s drawn in this dtype's row of panels, for its y range
        for j, (title, ops, variant, roof) in enumerate(columns):
            ax = axes[i][j]
            xs, ys = series(*roof, dtype)
            ax.plot(xs, ys, color="black", linewidth=3, alpha=0.8, zorder=1)
            plotted += ys
            for op in ops:
                xs, ys = series(op, variant, dtype)
                ax.plot(xs, ys, "-o", color=OP_COLOR[op], linewidth=2.2, markersize=5, zorder=3)
                plotted += ys
                base = BASELINE.get(op, {}).get(variant)
                if base:
                    xs, ys = series(op, base, dtype)
                    ax.plot(xs, ys, ":", color=OP_COLOR[op], linewidth=2, marker="o", markersize=5,
                            markerfacecolor="white", zorder=2)
                    plotted += ys
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(sizes, [format_size(s) for s in sizes])
            ax.minorticks_off()
            ax.grid(True, which="major", color="0.9")
            ax.set_title(f"{title}, {dtype}", loc="left")
            if j == 0:
                ax.set_ylabel("effective GB/s")
            if i == len(dtypes) - 1:
                ax.set_xlabel("elements")
        ylim = (min(plotted) / 1.25, max(plotted) * 1.25)
        axes[i][0].set_ylim(*ylim)  # shared along the row
        axes[i][0].yaxis.set_major_locator(FixedLocator(_log_ticks(*ylim, *GBPS_TICKS)))
        axes[i][0].yaxis.set_major_formatter(lambda v, _: f"{v:g}")
    ops_legend = [Line2D([], [], color=OP_COLOR[op], linewidth=3, label=OP_NAMES[op]) for op in BACKWARD_OPS]
    style_legend = [Line2D([], [], color="0.3", linewidth=2.2, marker="o", label="ours"),
                    Line2D([], [], color="0.3", linewidth=2, linestyle=":", marker="o", markerfacecolor="white",
                           label="baseline (ATen or composite)"),
                    Line2D([], [], color="black", linewidth=3, alpha=0.8, label="roofline (same streams)")]
    fig.suptitle(f"Effective GB/s (the op's minimal bytes ÷ median time), reduction '{reduction}'\n"
                 f"{_subtitle(meta, threads)}", x=0.01, ha="left", fontsize=13)
    fig.legend(handles=ops_legend + style_legend, loc="upper left", bbox_to_anchor=(0.01, 1 - 0.62 / height),
               ncol=len(ops_legend) + len(style_legend), frameon=False, handlelength=2.2, columnspacing=1.4)
    fig.tight_layout()
    fig.subplots_adjust(top=1 - 1.3 / height)  # below the title, the legend and the panel titles
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return True


def write_figures(rows: list[dict], comparisons: list[Comparison], dtypes: list[str], meta: dict[str, str],
                  threads: int | None, stem: str) -> list[str]:
    """Writes <stem>.png and <stem>_bandwidth.png; returns the paths written."""
    written = []
    if main_figure(comparisons, dtypes, meta, threads, stem + ".png"):
        written.append(stem + ".png")
    if bandwidth_figure(rows, meta, stem + "_bandwidth.png"):
        written.append(stem + "_bandwidth.png")
    return written

