"""Run metadata and statistics shared by bench_losses.py and bench_autograd.py.

Both scripts record where their numbers come from (git revision, CPU, load average) the same way, so that two
tables can be compared, and summarise per-call times with the same median and p20/p80.
"""
from __future__ import annotations

import datetime
import os
import platform
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
# The package's instruction sets -> the ATEN_CPU_CAPABILITY that runs ATen's kernels at the same level.
ISAS = {"avx512": "avx512", "avx2": "avx2", "baseline": "default"}
REPO = os.path.dirname(HERE)


def git_revision() -> str:
    """Short HEAD revision, with '-dirty' when the sources that make up the extension have local changes."""
    try:
        rev = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no", "--", "csrc",
                                "npu_loss_ops", "setup.py"], capture_output=True, text=True, check=True).stdout.strip()
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


def extension_stamp() -> str:
    """The loaded _C library and its modification time (the extension is rebuilt in place during development)."""
    import npu_loss_ops

    path = npu_loss_ops._C.__file__
    mtime = datetime.datetime.fromtimestamp(os.path.getmtime(path), datetime.timezone.utc)
    return f"{os.path.relpath(path, REPO)} built {mtime.isoformat(timespec='seconds')}"


def load_average() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def quantile(values: list[float], q: float) -> float:
    """The q-quantile with linear interpolation between the sorted values (statistics' 'inclusive' method)."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


# ---- what bench_distill.py and bench_fused_linear.py share: one method per fresh process, a CSV with the run's
# metadata as '# key: value' lines, and the ratio of two timings with its spread ----


def run_worker(source: str, cfg: dict, env: dict, timeout: float) -> dict:
    """Runs `source` (a Python script reading its JSON configuration from argv[1]) in a fresh process; its last
    stdout line, as JSON."""
    import json
    import sys

    result = subprocess.run([sys.executable, "-c", source, json.dumps(cfg)], capture_output=True, text=True,
                            env=env, timeout=timeout, cwd=REPO)
    if result.returncode != 0:
        raise RuntimeError(f"{cfg.get('method')} {cfg} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def write_csv_with_meta(path: str, meta: dict, rows: list[dict], fields: list[str]) -> None:
    import csv

    with open(path, "w", newline="") as f:
        for k, val in meta.items():
            f.write(f"# {k}: {val}\n")
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for row in rows:
            w.writerow({k: row.get(k, "") for k in fields})


def read_csv_with_meta(path: str, ints: tuple[str, ...], floats: tuple[str, ...]) -> tuple[dict, list[dict]]:
    """(meta, rows) of write_csv_with_meta's file: the `ints` columns as int, the `floats` as float (None where
    empty)."""
    import csv

    meta, lines = {}, []
    with open(path) as f:
        for line in f:
            if line.startswith("# "):
                k, _, val = line[2:].partition(": ")
                meta[k] = val.strip()
            else:
                lines.append(line)
    rows = []
    for row in csv.DictReader(lines):
        for k in ints:
            row[k] = int(row[k])
        for k in floats:
            row[k] = float(row[k]) if row.get(k) not in ("", None) else None
        rows.append(row)
    return meta, rows


def ratio_with_spread(ours: dict, base: dict) -> tuple[float, float, float]:
    """ours / base: the medians' ratio and its spread (ours' p20 / base's p80 .. ours' p80 / base's p20)."""
    return ours["median_s"] / base["median_s"], ours["p20_s"] / base["p80_s"], ours["p80_s"] / base["p20_s"]


# ---- the workers' shared lines (bench_distill.py, bench_fused_linear.py, bench_sparse.py, bench_fused_sparse.py):
# each WORKER is WORKER_PRELUDE and its own body, which builds its inputs and a `step()` and calls measure() ----

WORKER_PRELUDE = r'''
import ctypes, json, os, sys, time
import torch
import torch.nn.functional as F
cfg = json.loads(sys.argv[1])
torch.set_num_threads(cfg["threads"])
sys.path.insert(0, os.path.join(cfg["repo"], "tests"))
import npu_loss_ops


def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024


def measure(step, warm_calls, reset, unit_bytes, counted_bytes=0, trim=False):
    """The workers' protocol: `warm_calls` calls of step() timed together (a compiling call among them), reset()
    (the warm calls' gradients dropped, which the peak would count again), the peak resident size of one call above
    the process's size before it, less `counted_bytes` (the gradients a table does not count), in units of
    `unit_bytes` (with `trim`, the C library's freed heap returned first, so that a new allocation shows), then
    cfg["reps"] - 1 more timed calls: (times, peak, warm_s)."""
    start = time.perf_counter()
    for _ in range(warm_calls):
        step()
    warm_s = time.perf_counter() - start
    reset()
    if trim:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status("VmRSS:")
    start = time.perf_counter()
    step()
    times = [time.perf_counter() - start]
    peak = (status("VmHWM:") - before - counted_bytes) / unit_bytes
    for _ in range(cfg["reps"] - 1):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times, peak, warm_s


def relative_error(got, want):
    """max |got - want| / max |want|, a block of 64 rows at a time (no float32 copy of a whole N x V gradient)."""
    diff = scale = 0.0
    for a, b in zip(got.split(64), want.split(64)):
        diff = max(diff, (a.float() - b.float()).abs().max().item())
        scale = max(scale, b.float().abs().max().item())
    return diff / max(scale, 1e-30)
'''
