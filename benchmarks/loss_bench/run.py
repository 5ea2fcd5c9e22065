"""The measurement: every configuration in turn, timed and checked, into one CSV row per variant."""
from __future__ import annotations

import datetime
import gc
import os
import platform
import statistics

import torch

import npu_loss_ops
from bench_common import cpu_model, extension_stamp, git_revision, load_average, quantile
from npu_loss_ops.version import __version__ as npu_loss_ops_version

from .common import BASELINE, BETA, DISTURBED_BELOW, DTYPES, PARALLEL_GRAIN, ROOFLINES, Config, format_size
from .progress import Progress
from .timing import TimingPlan, time_variants
from .variants import Variant, build_variants

# Copied into every row, so that rows from different runs can be put together and still be told apart.
STATIC_COLUMNS = ("cpu", "torch", "cpu_capability", "cpu_kernel_isa", "npu_loss_ops", "git_sha")


def metadata(args, plan: TimingPlan, command: str) -> dict[str, str]:
    """The run's '#' lines in the CSV: what ran, where, and how it was timed."""
    info = npu_loss_ops.build_info()
    return {
        "benchmark": "npu_loss_ops ops vs ATen / autograd composites / F, and the memory roofline",
        "command": command,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "npu_loss_ops": npu_loss_ops_version,
        "git_sha": git_revision(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "logical_cpus": str(os.cpu_count()),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_kernel_isa": str(info.get("cpu_kernel_isa")),
        "openmp": str(info.get("openmp")),
        "extension": extension_stamp(),
        "threads": ",".join(map(str, args.threads)),
        "load_average_1min_start": f"{load_average():.2f}",
        "beta": str(BETA),
        "autograd_variants": str(args.autograd),
        "compile_variants": str(args.compile),
        "checked_up_to": f"{format_size(args.check_max)} elements (matches_reference empty above)",
        "timing": plan.describe(),
        "samples_columns": "samples: timed blocks (all rounds); calls_per_sample: calls per block (the median "
                           "over rounds)",
        "roofline_ops": "; ".join(f"{k}: {v[0]} ({v[1]} streams)" for k, v in ROOFLINES.items()),
        "GBps": "the op's minimal bytes (element streams x numel x itemsize) / median time",
    }


def configurations(args) -> list[Config]:
    return [Config(th, d, red, n) for th in args.threads for d in args.dtypes for red in args.reductions
            for n in args.sizes]


def run(args, plan: TimingPlan, meta: dict[str, str]) -> list[dict]:
    configs = configurations(args)
    progress = Progress(len(configs))
    rows: list[dict] = []
    static = {k: meta[k] for k in STATIC_COLUMNS}
    default_threads = torch.get_num_threads()
    try:
        for cfg in configs:
            progress.begin(cfg.label)
            torch.set_num_threads(cfg.threads)  # for the checks; the Timer sets it around each measurement
            variants, checks = build_variants(cfg, args.ops, args.autograd, args.compile)
            time_variants(variants, cfg.threads, plan)
            ok = {key: check() for key, check in checks.items()} if cfg.numel <= args.check_max else {}
            extra = dict(static, load_average_1min=f"{load_average():.2f}",
                         date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
            rows += config_rows(cfg, variants, ok, extra)
            del variants, checks
            gc.collect()  # the next configuration's inputs should not meet this one's in memory
            progress.end()
    finally:
        progress.close()
        torch.set_num_threads(default_threads)
    return rows


def disturbed(v: Variant, cfg: Config) -> bool:
    """Whether another process took the CPU while v was timed: in its median round the process got less CPU
    time than DISTURBED_BELOW of the threads the call keeps busy (all of them once the call is split into
    parallel chunks, one below the parallel grain; an OpenMP thread waiting for work still counts, as it
    spins). Then its time says more about the other process than about the op: its cells are shown as
    unreliable rather than passed or failed."""
    if not v.cpu_per_wall:
        return False
    busy = min(cfg.threads, max(1, -(-cfg.numel // PARALLEL_GRAIN)))
    return statistics.median(v.cpu_per_wall) < DISTURBED_BELOW * busy


def config_rows(cfg: Config, variants: list[Variant], ok: dict, extra: dict) -> list[dict]:
    """One CSV row per variant: its time statistics and its ratios to its roofline, baseline and autograd."""
    by_key = {v.key: v for v in variants}
    itemsize = DTYPES[cfg.dtype].itemsize

    def median(v: Variant) -> float:
        return statistics.median(v.times)

    rows = []
    for v in variants:
        med = median(v)
        row = {
            "op": v.op, "variant": v.variant, "dtype": cfg.dtype, "reduction": cfg.reduction,
            "numel": cfg.numel, "threads": cfg.threads,
            "median_ms": med * 1e3, "p20_ms": quantile(v.times, 0.2) * 1e3, "p80_ms": quantile(v.times, 0.8) * 1e3,
            "samples": len(v.times), "calls_per_sample": int(statistics.median_low(v.block_sizes)),
            "streams": v.streams, "GBps": v.streams * cfg.numel * itemsize / med / 1e9,
            "roofline_op": v.desc if v.op.startswith("roofline") else "", "roofline_ms": "", "ratio_to_roofline": "",
            "baseline": "", "baseline_ms": "", "ratio_to_baseline": "", "ratio_to_autograd": "",
            "matches_reference": ok.get(v.key, ""), "setup_s": "" if v.setup_s is None else v.setup_s,
            "cpu_per_wall": statistics.median(v.cpu_per_wall) if v.cpu_per_wall else "",
            "disturbed": disturbed(v, cfg),
        }
        roof = by_key.get(v.roofline) if v.roofline else None
        if roof is not None:
            row.update(roofline_op=f"{roof.op}:{roof.variant} ({roof.desc})", roofline_ms=median(roof) * 1e3,
                       ratio_to_roofline=med / median(roof))
        base_name = BASELINE.get(v.op, {}).get(v.variant)
        base = by_key.get((v.op, base_name)) if base_name else None
        if base is not None:
            row.update(baseline=base_name, baseline_ms=median(base) * 1e3, ratio_to_baseline=med / median(base))
        autograd = by_key.get((v.op, "autograd"))
        if autograd is not None and v.variant.startswith("ours"):
            row["ratio_to_autograd"] = med / median(autograd)
        row.update(extra)
        rows.append(row)
    return rows
