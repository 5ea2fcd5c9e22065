"""Timing: interleaved rounds of torch.utils.benchmark.Timer.blocked_autorange per variant.

Memory bandwidth on a shared machine drifts over seconds, so the variants of one configuration are not timed
one after another: each round times every variant once (one blocked_autorange), starting from a different
variant each round, and a variant's statistics come from the blocks of all its rounds. The comparisons between
variants (ratio to the roofline, to the baseline) then see the same drift.

blocked_autorange first picks a block size (a power of ten of calls, so that the timer's own overhead is
negligible), calling the op while it does so, which also warms it up; then it times blocks of that many calls
until min_run_time has passed. Its `times` are the per-call times of the blocks: the median and p20/p80 come
from them. A call slower than min_run_time makes one block of one call per round, after one call for the
block size: each round costs about two calls, and the slowest variants (composites at 64M) join fewer rounds.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch.utils.benchmark import Timer

if TYPE_CHECKING:  # variants imports npu_loss_ops, which --from-csv does without
    from .variants import Variant


@dataclass
class TimingPlan:
    rounds: int  # interleaved rounds per variant (at most)
    min_rounds: int  # rounds every variant joins, however slow
    round_s: float  # min_run_time of each blocked_autorange
    max_variant_s: float  # a slow variant joins only as many rounds as fit this many seconds

    def describe(self) -> str:
        return (f"torch.utils.benchmark.Timer.blocked_autorange(min_run_time={self.round_s:g}) per variant and "
                f"round, {self.rounds} rounds with the variants interleaved (a rotating start), fewer for a "
                f"variant whose rounds would take over {self.max_variant_s:g} s per configuration, at least "
                f"{self.min_rounds}; median, p20, p80 of the per-call times of all blocks")


def time_variants(variants: list[Variant], threads: int, plan: TimingPlan) -> None:
    """Fills each variant's `times` (per-call seconds, one per block) and `block_sizes` (one per round)."""
    if not variants:
        return
    # Timer sets torch's thread count to its num_threads around each measurement (and its default is 1).
    timers = {v.key: Timer(stmt="fn()", globals={"fn": v.fn}, num_threads=threads) for v in variants}
    for v in variants:
        v.times, v.block_sizes, v.cpu_per_wall, v.rounds = [], [], [], plan.rounds

    def measure(v: Variant) -> float:
        """One round of v; returns the wall seconds it took (block-size search included). Also records the
        CPU time the process got during the round, per wall second: what a disturbed cell lacks."""
        start, cpu_start = time.perf_counter(), time.process_time()
        m = timers[v.key].blocked_autorange(min_run_time=plan.round_s)
        took = time.perf_counter() - start
        v.times.extend(m.times)
        v.block_sizes.append(m.number_per_run)
        v.cpu_per_wall.append((time.process_time() - cpu_start) / max(took, 1e-9))
        return took

    for rnd in range(plan.rounds):
        k = rnd % len(variants)
        for v in variants[k:] + variants[:k]:
            if rnd >= v.rounds:
                continue
            took = measure(v)
            if rnd == 0:
                # Later rounds cost about what the first did: keep the variant within max_variant_s.
                fit = int(plan.max_variant_s // max(took, 1e-9))
                v.rounds = max(min(plan.min_rounds, plan.rounds), min(plan.rounds, fit))
