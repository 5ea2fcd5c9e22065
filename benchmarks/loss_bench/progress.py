"""Progress over the configurations on stderr."""
from __future__ import annotations

import sys
import time


class Progress:
    """tqdm when installed, else a plain counter on stderr."""

    def __init__(self, total: int):
        try:
            from tqdm import tqdm
        except ImportError:
            tqdm = None
        self.bar = tqdm(total=total, file=sys.stderr, dynamic_ncols=True,
                        bar_format="{desc:<24} {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]") if tqdm else None
        self.total, self.done, self.start = total, 0, time.perf_counter()

    def step(self, label: str, weight: float = 1.0) -> None:
        self.done += weight
        if self.bar is not None:
            self.bar.set_description(label)
            self.bar.update(weight)
        else:
            print(f"\r[{self.done:.0f}/{self.total:.0f}] {label:<40} {time.perf_counter() - self.start:5.0f} s",
                  end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        else:
            print(file=sys.stderr)
