"""Benchmark npu_loss_ops' smooth_l1_loss_backward against ATen's and the memory-bandwidth roofline.

One run times, for every (dtype, reduction, size), in the functional and the out= form:
  ours      torch.ops.npu_loss.smooth_l1_loss_backward(g, x, t, reduction, beta)        [.grad_input(..., grad_input=out)]
  aten      torch.ops.aten.smooth_l1_loss_backward(g, x, t, reduction, beta)            [.grad_input(..., grad_input=out)]
  roofline  an ATen op with the same memory streams, called the same way (through torch.ops, so the
            per-call overhead matches too):
              reduction none (g full size, 3 reads + 1 write):  torch.ops.aten.addcmul   [.out(..., out=out)]
              reduction mean (g 0-dim,     2 reads + 1 write):  torch.ops.aten.add.Tensor [add.out(..., out=out)]
Variants are interleaved round-robin so drift hits them alike; each sample times a batch of calls sized to
last about --sample-ms. Reported: median with p20/p80 per call, ratios ours/aten and ours/roofline, and the
effective bandwidth. Writes a CSV (with metadata in '#' lines) and, when matplotlib is installed, a PNG to
benchmarks/results/.

    python benchmarks/bench_losses.py            # 4K..16M elements, float32 and bfloat16, none and mean
    python benchmarks/bench_losses.py --quick    # three sizes, under two minutes
    python benchmarks/bench_losses.py --sizes 16M --dtypes float32
"""
from __future__ import annotations

import argparse
import csv
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch

import npu_loss_ops  # noqa: F401  (registers torch.ops.npu_loss)
from npu_loss_ops.version import __version__ as npu_loss_ops_version

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FULL_SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]
QUICK_SIZES = [4 << 10, 256 << 10, 16 << 20]
BETA = 1.0
VARIANTS = ("ours", "aten", "roofline")


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def format_size(n: int) -> str:
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


@dataclass
class Config:
    dtype: str
    reduction: str
    numel: int
    form: str  # "functional" or "out"

    @property
    def streams(self) -> int:
        # none: read g, x, t, write the result; mean: g is 0-dim, so read x, t, write the result.
        return 4 if self.reduction == "none" else 3


def make_calls(cfg: Config) -> tuple[dict[str, Callable[[], object]], Callable[[], bool]]:
    """The three timed callables of one configuration, and a check that ours equals aten."""
    dtype, r = DTYPES[cfg.dtype], REDUCTIONS[cfg.reduction]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(cfg.numel, generator=gen).to(dtype)
    t = torch.randn(cfg.numel, generator=gen).to(dtype)
    g = torch.randn(cfg.numel, generator=gen).to(dtype) if cfg.reduction == "none" else torch.tensor(1.0, dtype=dtype)
    aten = torch.ops.aten
    ours_op, aten_op = torch.ops.npu_loss.smooth_l1_loss_backward, aten.smooth_l1_loss_backward
    if cfg.form == "functional":
        calls = {
            "ours": lambda: ours_op(g, x, t, r, BETA),
            "aten": lambda: aten_op(g, x, t, r, BETA),
            "roofline": (lambda: aten.addcmul(g, x, t)) if cfg.reduction == "none" else (lambda: aten.add.Tensor(x, t)),
        }
    else:
        out = {name: torch.empty(cfg.numel, dtype=dtype) for name in VARIANTS}
        calls = {
            "ours": lambda: ours_op.grad_input(g, x, t, r, BETA, grad_input=out["ours"]),
            "aten": lambda: aten_op.grad_input(g, x, t, r, BETA, grad_input=out["aten"]),
            "roofline": (lambda: aten.addcmul.out(g, x, t, out=out["roofline"]))
            if cfg.reduction == "none"
            else (lambda: aten.add.out(x, t, out=out["roofline"])),
        }

    def agrees() -> bool:
        ours, ref = calls["ours"](), calls["aten"]()
        tol = 0 if dtype == torch.float32 else 1e-2  # bf16/fp16: one rounding apart at most
        return torch.allclose(ours.float(), ref.float(), rtol=tol or 1e-6, atol=tol or 1e-12)

    return calls, agrees


def time_calls(calls: dict[str, Callable[[], object]], repeats: int, sample_s: float) -> dict[str, list[float]]:
    """Per-call seconds, `repeats` samples per variant, variants interleaved (rotating order)."""
    inner = {}
    for name, fn in calls.items():
        fn()  # warm-up: first-touch page faults, thread pool start, lazy init
        start = time.perf_counter()
        fn()
        once = max(time.perf_counter() - start, 1e-7)
        for _ in range(2 if once < 1e-3 else 0):
            fn()
        inner[name] = max(1, int(sample_s / once))
    samples: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for rep in range(repeats):
        order = names[rep % len(names):] + names[: rep % len(names)]
        for name in order:
            fn, n = calls[name], inner[name]
            start = time.perf_counter()
            for _ in range(n):
                fn()
            samples[name].append((time.perf_counter() - start) / n)
    return samples


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1] if len(values) > 1 else values[0]


def git_revision() -> str:
    try:
        rev = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def metadata(args) -> dict[str, str]:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return {
        "benchmark": "smooth_l1_loss_backward: npu_loss_ops vs aten vs roofline",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "npu_loss_ops": f"{npu_loss_ops_version} (git {git_revision()})",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": str(torch.get_num_threads()),
        "load_average_1min": f"{load:.2f}",
        "beta": str(BETA),
        "repeats": str(args.repeats),
        "sample_ms": str(args.sample_ms),
        "timing": "time.perf_counter per batch of calls; median, p20, p80 of the per-call time",
    }


class Progress:
    """tqdm when installed, else a plain counter on stderr."""

    def __init__(self, total: int):
        try:
            from tqdm import tqdm
        except ImportError:
            tqdm = None
        self.bar = tqdm(total=total, unit="config", file=sys.stderr, leave=False) if tqdm else None
        self.total, self.done = total, 0

    def step(self, label: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_description(label)
            self.bar.update(1)
        else:
            print(f"\r[{self.done}/{self.total}] {label:<40}", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        else:
            print(file=sys.stderr)


def run(args) -> list[dict]:
    configs = [
        Config(dtype, reduction, numel, form)
        for dtype in args.dtypes
        for reduction in args.reductions
        for numel in args.sizes
        for form in ("functional", "out")
    ]
    rows = []
    progress = Progress(len(configs))
    for cfg in configs:
        calls, agrees = make_calls(cfg)
        samples = time_calls(calls, args.repeats, args.sample_ms / 1e3)
        row = {"dtype": cfg.dtype, "reduction": cfg.reduction, "numel": cfg.numel, "form": cfg.form}
        for name in VARIANTS:
            s = samples[name]
            row[f"{name}_median_us"] = statistics.median(s) * 1e6
            row[f"{name}_p20_us"] = quantile(s, 0.2) * 1e6
            row[f"{name}_p80_us"] = quantile(s, 0.8) * 1e6
        row["ours_over_aten"] = row["ours_median_us"] / row["aten_median_us"]
        row["ours_over_roofline"] = row["ours_median_us"] / row["roofline_median_us"]
        bytes_moved = cfg.streams * cfg.numel * DTYPES[cfg.dtype].itemsize
        row["ours_GBps"] = bytes_moved / (row["ours_median_us"] * 1e-6) / 1e9
        row["roofline_GBps"] = bytes_moved / (row["roofline_median_us"] * 1e-6) / 1e9
        row["matches_aten"] = agrees()
        rows.append(row)
        del calls
        progress.step(f"{cfg.dtype} {cfg.reduction} {format_size(cfg.numel)} {cfg.form}")
    progress.close()
    return rows


def print_table(rows: list[dict], meta: dict[str, str]) -> None:
    print(f"smooth_l1_loss_backward, beta={BETA}: npu_loss_ops {meta['npu_loss_ops']}, torch {meta['torch']}, "
          f"{meta['threads']} threads, CPU capability {meta['cpu_capability']} ({meta['cpu']}), "
          f"load {meta['load_average_1min']}")
    print("times per call in microseconds: median [p20, p80]")
    header = (f"{'dtype':<8} {'red':<4} {'numel':>6} {'form':<10} {'ours':>26} {'aten':>26} {'roofline':>26} "
              f"{'ours/aten':>9} {'ours/roof':>9} {'GB/s':>6}")
    print(header)
    print("-" * len(header))

    def cell(row, name):
        return (f"{row[f'{name}_median_us']:>9.1f} [{row[f'{name}_p20_us']:>6.1f}, "
                f"{row[f'{name}_p80_us']:>6.1f}]").rjust(26)

    for row in rows:
        flag = "" if row["matches_aten"] else "  (differs from aten!)"
        print(f"{row['dtype']:<8} {row['reduction']:<4} {format_size(row['numel']):>6} {row['form']:<10} "
              f"{cell(row, 'ours')} {cell(row, 'aten')} {cell(row, 'roofline')} "
              f"{row['ours_over_aten']:>9.2f} {row['ours_over_roofline']:>9.2f} {row['ours_GBps']:>6.1f}{flag}")


def write_csv(rows: list[dict], meta: dict[str, str], path: str) -> None:
    with open(path, "w", newline="") as f:
        for key, value in meta.items():
            f.write(f"# {key}: {value}\n")
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in row.items()})


def write_plot(rows: list[dict], meta: dict[str, str], path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipping the plot (pip install matplotlib)", file=sys.stderr)
        return False
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharex=True)
    series = sorted({(r["dtype"], r["reduction"], r["form"]) for r in rows})
    for dtype, reduction, form in series:
        sel = sorted((r for r in rows if (r["dtype"], r["reduction"], r["form"]) == (dtype, reduction, form)),
                     key=lambda r: r["numel"])
        xs = [r["numel"] for r in sel]
        style = "-" if form == "out" else "--"
        label = f"{dtype} {reduction} {form}"
        axes[0].plot(xs, [r["ours_over_aten"] for r in sel], style, marker="o", label=label)
        axes[1].plot(xs, [r["ours_over_roofline"] for r in sel], style, marker="o", label=label)
    for ax, title in zip(axes, ("ours / aten (lower is better)", "ours / roofline (1 = memory bound)")):
        ax.set_xscale("log", base=2)
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set_xlabel("elements")
        ax.set_ylabel("time ratio (median)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.suptitle(f"smooth_l1_loss_backward: npu_loss_ops {meta['npu_loss_ops']}, torch {meta['torch']}, "
                 f"{meta['threads']} threads, {meta['cpu_capability']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"sizes {', '.join(map(format_size, QUICK_SIZES))} only, fewer repeats")
    parser.add_argument("--sizes", type=lambda s: [parse_size(v) for v in s.split(",")],
                        help="comma-separated element counts, e.g. 4K,1M,16M")
    parser.add_argument("--dtypes", type=lambda s: s.split(","), default=["float32", "bfloat16"],
                        help="comma-separated: float32, bfloat16, float16 (default float32,bfloat16)")
    parser.add_argument("--reductions", type=lambda s: s.split(","), default=["none", "mean"],
                        help="comma-separated: none, mean, sum (default none,mean)")
    parser.add_argument("--repeats", type=int, help="samples per variant (default 21, --quick 11)")
    parser.add_argument("--sample-ms", type=float, default=5.0, help="target duration of one sample (default 5 ms)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads before timing")
    parser.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    parser.add_argument("--name", help="output file stem (default smooth_l1_loss_backward[_quick|_custom])")
    args = parser.parse_args()

    for d in args.dtypes:
        if d not in DTYPES:
            parser.error(f"unknown dtype {d!r}; choose from {', '.join(DTYPES)}")
    for r in args.reductions:
        if r not in REDUCTIONS:
            parser.error(f"unknown reduction {r!r}; choose from {', '.join(REDUCTIONS)}")
    custom = args.sizes is not None
    args.sizes = args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
    args.repeats = args.repeats or (11 if args.quick else 21)
    if args.threads:
        torch.set_num_threads(args.threads)
    name = args.name or "smooth_l1_loss_backward" + ("_custom" if custom else "_quick" if args.quick else "")

    meta = metadata(args)
    if float(meta["load_average_1min"]) > 0.5 * (os.cpu_count() or 1):
        print(f"warning: load average {meta['load_average_1min']} on {os.cpu_count()} CPUs; timings will be noisy",
              file=sys.stderr)
    start = time.perf_counter()
    rows = run(args)
    meta["wall_seconds"] = f"{time.perf_counter() - start:.0f}"
    print_table(rows, meta)

    os.makedirs(args.out_dir, exist_ok=True)
    csv_path = os.path.join(args.out_dir, name + ".csv")
    write_csv(rows, meta, csv_path)
    written = [csv_path]
    png_path = os.path.join(args.out_dir, name + ".png")
    if write_plot(rows, meta, png_path):
        written.append(png_path)
    print(f"\nwrote {' and '.join(os.path.relpath(p) for p in written)} ({meta['wall_seconds']} s)")
    return 0 if all(r["matches_aten"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
