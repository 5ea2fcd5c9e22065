"""The PNG: effective GB/s against size, per op and dtype, at the most threads measured."""
from __future__ import annotations

import sys

from .common import ALL_OPS, DTYPES

STYLE = {  # variant -> (color, marker)
    "ours": ("tab:blue", "o"), "ours_out": ("tab:cyan", "o"), "aten": ("tab:red", "s"),
    "aten_out": ("tab:orange", "s"), "composite": ("tab:red", "s"), "composite_out": ("tab:orange", "s"),
    "autograd": ("tab:purple", "^"), "F": ("tab:red", "s"),
    "roofline": ("black", "."), "roofline_out": ("gray", "."),
}


def write_plot(rows: list[dict], meta: dict[str, str], path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipping the plot (pip install matplotlib)", file=sys.stderr)
        return False
    threads = max(r["threads"] for r in rows)
    rows = [r for r in rows if r["threads"] == threads and r["reduction"] in ("none", "mean")]
    ops = [op for op in ALL_OPS if any(r["op"] == op for r in rows)]
    dtypes = [d for d in DTYPES if any(r["dtype"] == d for r in rows)]
    if not ops:
        return False
    fig, axes = plt.subplots(len(ops), len(dtypes), figsize=(6.5 * len(dtypes), 3.4 * len(ops)), squeeze=False)
    for i, op in enumerate(ops):
        for j, dtype in enumerate(dtypes):
            ax = axes[i][j]
            sel = [r for r in rows if r["op"] == op and r["dtype"] == dtype]
            # The roofline each variant of this op is compared with, per reduction.
            roof_rows = {}
            for r in sel:
                if r["roofline_op"]:
                    name, form = r["roofline_op"].split(" ")[0].split(":")
                    roof_rows[(name, form, r["reduction"])] = True
            series = {}
            for r in sel:
                series.setdefault((r["variant"], r["reduction"]), []).append(r)
            for (name, form, red) in roof_rows:
                series[("roofline" if form == "functional" else "roofline_out", red)] = [
                    r for r in rows if r["op"] == name and r["variant"] == form and r["dtype"] == dtype
                    and r["reduction"] == red]
            for (variant, red), pts in sorted(series.items()):
                pts = sorted(pts, key=lambda r: r["numel"])
                color, marker = STYLE.get(variant, ("tab:green", "x"))
                ax.plot([p["numel"] for p in pts], [p["GBps"] for p in pts], "-" if red == "none" else "--",
                        color=color, marker=marker, markersize=3.5, linewidth=1.2, label=f"{variant} ({red})")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{op}, {dtype}", fontsize=9)
            ax.set_xlabel("elements", fontsize=8)
            ax.set_ylabel("effective GB/s", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=6, ncol=2)
    fig.suptitle(f"npu_loss_ops {meta['npu_loss_ops']} (git {meta['git_sha']}), torch {meta['torch']}, "
                 f"{threads} threads, {meta['cpu_capability']}, {meta['cpu']}; solid: reduction none, "
                 f"dashed: mean ('sum' is in the CSV)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.25 / len(ops)))
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return True
