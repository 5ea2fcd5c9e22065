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
