"""Progress over the configurations: a tqdm bar on a terminal, one plain line per configuration otherwise.

A bar redraws its line with carriage returns, which a log file (CI, `> log 2>&1`) keeps as one long line; so
when stderr is not a terminal, each configuration prints one line when it starts, without any '\\r'.
"""
from __future__ import annotations

import os
import sys
import time


def _is_terminal(stream) -> bool:
    """A terminal that reports its size (a pseudo-terminal without one makes tqdm draw nothing)."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return False
    return stream.isatty() and size.columns > 0 and size.lines > 0


class Progress:
    def __init__(self, total: int, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.total, self.done, self.start = total, 0, time.perf_counter()
        self.bar = None
        if _is_terminal(self.stream):
            try:
                from tqdm import tqdm
            except ImportError:  # scripts/run_benchmarks.sh installs it; plain lines without it
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(total=total, file=self.stream, unit="config", dynamic_ncols=True,
                                bar_format="{desc:<22} {n}/{total} |{bar}| [{elapsed}<{remaining}]")

    def begin(self, label: str) -> None:
        """Configuration number done + 1, `label`, starts."""
        if self.bar is not None:
            self.bar.set_description_str(label)
        else:
            print(f"[{self.done + 1}/{self.total}] {label} ({time.perf_counter() - self.start:.0f} s elapsed)",
                  file=self.stream, flush=True)

    def end(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        else:
            print(f"{self.done}/{self.total} configurations measured in {time.perf_counter() - self.start:.0f} s",
                  file=self.stream, flush=True)
