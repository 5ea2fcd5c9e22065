"""Time ratios of ours to each reference, and the targets they are held to.

Every number here is a ratio of two median times from the same run, at the target thread count: the markdown
table shows the comparisons that have a target (PASS/MISS), the main figure shows them all. A target is
stated either as a time ratio ours/reference (at most the limit) or as a speedup reference/ours (at least the
limit); the table shows the number the target states, the figure always the time ratio (lower is faster).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .common import ATEN_BACKWARD_OPS, BACKWARD_OPS, BASELINE, FORWARD_OPS, SMALL_SIZE, STEP_OPS, TARGET_SIZE, \
    TARGET_THREADS, backward_roofline, forward_roofline

Cell = tuple[str, str]  # (dtype, reduction)

# Speedup over autograd's composite gradient at 16M, and the bound beside it: the composite's element streams
# ÷ ours ('none' / 'mean' / 'sum'; ours: g, x, t read and the result written, g 0-dim for 'mean'/'sum').
#   L1:  sub (3) + sgn (2) + mul by g (3; 2 with a 0-dim g) + 'mean''s div_ (2)      8/4, 9/3, 7/3 streams
#   KL:  log (2) + add 1 (2) + sub x (3) + mul by g (3; 2) + div_ (2)                 10/4, 11/3, 9/3
#   KL, log target: exp (2) + mul g (3; 2) + add 1 (2) + sub x (3) + mul (3) + div_   13/4, 14/3, 12/3
COMPOSITE_TARGETS = {"l1_loss_backward": 2.5, "kl_div_target_backward": 3.0, "kl_div_target_backward[log]": 3.0}
# Speedup of a forward + backward step over F's at 16M: F's smooth L1, Huber and MSE steps are ATen kernels (a
# forward and a backward pass, like ours), so what is left is F's 'mean' handling; L1's and KL's steps run
# autograd's composites.
STEP_TARGETS = {"step:smooth_l1_loss": 1.5, "step:huber_loss": 1.5, "step:mse_loss": 1.5, "step:l1_loss": 3.0,
                "step:kl_div": 3.0}

# The panels of the main figure: what each comparison's reference is. COMPILED (the step against
# torch.compile(F)) is in the table only: its rows are the steps', which the baseline panel shows against F.
ROOFLINE, BASELINE_PANEL, SMALL, COMPILED = "roofline", "baseline", "small", "compiled"


@dataclass
class Comparison:
    panel: str  # ROOFLINE, BASELINE_PANEL or SMALL
    row: tuple[str, str]  # (op, variant) of ours: one row of the figure
    reference: str  # the reference, as the figure names it
    ratios: dict[Cell, float | None] = field(default_factory=dict)  # median time ours / reference
    unreliable: dict[Cell, bool] = field(default_factory=dict)  # ours or the reference was disturbed
    group: str = ""  # the target this comparison is held to; empty: shown in the figure only
    label: str = ""  # the table's row label: op and form
    limit: float | None = None  # as the target states it: a time ratio, or a speedup when `speedup`
    speedup: bool = False

    def shown(self, ratio: float) -> float:
        """The number the target speaks of: the speedup reference/ours, or the time ratio ours/reference."""
        return 1.0 / ratio if self.speedup else ratio

    @property
    def ratio_limit(self) -> float | None:
        """The limit as a time ratio ours/reference (the figure's scale)."""
        if self.limit is None:
            return None
        return 1.0 / self.limit if self.speedup else self.limit

    def meets(self, value: float) -> bool:
        """Whether `value`, the number the target states (see shown), meets it."""
        return value >= self.limit if self.speedup else value <= self.limit

    def passed(self, ratio: float) -> bool:
        """Whether the time ratio `ratio` meets the target (always, when there is none)."""
        return self.limit is None or self.meets(self.shown(ratio))

    @property
    def cells(self) -> dict[Cell, float | None]:
        """The table's cells: what the target states, per (dtype, reduction)."""
        return {c: (None if r is None else self.shown(r)) for c, r in self.ratios.items()}

    @property
    def values(self) -> list[float]:
        return [r for r in self.ratios.values() if r is not None]

    @property
    def result(self) -> str:
        """MISS if a reliable cell misses; else UNRELIABLE if a cell was disturbed (judged neither way); else
        PASS."""
        if not self.values:
            return "n/a"
        reliable = [r for c, r in self.ratios.items() if r is not None and not self.unreliable.get(c)]
        if not all(self.passed(r) for r in reliable):
            return "MISS"
        return "PASS" if len(reliable) == len(self.values) else "UNRELIABLE"


class Medians:
    """Median ms per (op, variant, dtype, reduction, numel) at one thread count."""

    def __init__(self, rows: list[dict], threads: int):
        self.ms = {(r["op"], r["variant"], r["dtype"], r["reduction"], r["numel"]): r["median_ms"]
                   for r in rows if r["threads"] == threads}
        self.disturbed = {(r["op"], r["variant"], r["dtype"], r["reduction"], r["numel"])
                          for r in rows if r["threads"] == threads and r.get("disturbed") is True}

    def unreliable(self, ours: tuple[str, str], ref: tuple[str, str], cell: Cell, size: int) -> bool:
        """Whether ours or the reference was timed while another process took the CPU (run.disturbed)."""
        return (*ours, *cell, size) in self.disturbed or (*ref, *cell, size) in self.disturbed

    def ratio(self, ours: tuple[str, str], ref: tuple[str, str], cell: Cell, size: int) -> float | None:
        a = self.ms.get((*ours, *cell, size))
        b = self.ms.get((*ref, *cell, size))
        return a / b if a is not None and b is not None else None


def target_threads(rows: list[dict]) -> int | None:
    """The thread count the targets are evaluated at: TARGET_THREADS when measured, else the most."""
    present = sorted({r["threads"] for r in rows})
    if not present:
        return None
    return TARGET_THREADS if TARGET_THREADS in present else present[-1]


def compare(rows: list[dict], dtypes: list[str], reductions: list[str]) -> tuple[list[Comparison], int | None]:
    """Every comparison of the run at the target thread count: those with a target in the table's order first."""
    threads = target_threads(rows)
    if threads is None:
        return [], None
    med = Medians(rows, threads)
    cells = [(d, red) for d in dtypes for red in reductions]
    big, small = TARGET_SIZE, SMALL_SIZE
    out: list[Comparison] = []

    def add(panel, ours, reference, ref_of_cell, size, reds=None, **target):
        """ref_of_cell(dtype, reduction) -> the reference's (op, variant)."""
        chosen = [(d, red) for d, red in cells if reds is None or red in reds]
        ratios = {c: med.ratio(ours, ref_of_cell(*c), c, size) for c in chosen}
        unreliable = {c: med.unreliable(ours, ref_of_cell(*c), c, size) for c in chosen}
        out.append(Comparison(panel, ours, reference, ratios, unreliable, **target))

    def roof(form):
        return lambda d, red: (backward_roofline(red), form)

    def fwd_roof(d, red):
        return forward_roofline(red), "functional"

    # The targets, in the order of the table.
    g1 = "16M: backward out= <= 1.10x preallocated roofline"
    for op in BACKWARD_OPS:
        add(ROOFLINE, (op, "ours_out"), "roofline out=", roof("out"), big, group=g1, label=f"{op} out=", limit=1.10)
    g2 = "16M: backward allocating <= 1.10x allocating roofline"
    for op in BACKWARD_OPS:
        add(ROOFLINE, (op, "ours"), "roofline", roof("functional"), big, group=g2, label=op, limit=1.10)
    # ATen's smooth L1, Huber and MSE gradients already run at about the roofline: parity is the bound.
    for op in ATEN_BACKWARD_OPS:
        for variant, ref_variant, suffix in (("ours_out", "aten_out", " out="), ("ours", "aten", "")):
            add(BASELINE_PANEL, (op, variant), "aten" + suffix, lambda d, red, op=op, rv=ref_variant: (op, rv), big,
                group="16M: >= 1.0x ATen's speed, same form (ATen is at the roofline)", label=op + suffix,
                limit=1.0, speedup=True)
    # The composite's passes over memory bound the speedup (COMPOSITE_BOUND); its fresh intermediates also pay
    # first-touch page faults, which ours, one pass into one result, does not.
    for op, limit in COMPOSITE_TARGETS.items():
        add(BASELINE_PANEL, (op, "ours"), "composite", lambda d, red, op=op: (op, "composite"), big,
            group="16M: >= 2.5x (L1) / 3.0x (KL) faster than autograd's composite formula", label=op, limit=limit,
            speedup=True)
    for op in STEP_OPS:
        add(BASELINE_PANEL, (op, "ours"), "F", lambda d, red, op=op: (op, "F"), big, reds=["mean"],
            group="16M: fwd+bwd step (mean) >= 1.5x (smooth L1, Huber, MSE) / 3x (L1, KL) faster than torch.nn.functional",
            label=op, limit=STEP_TARGETS[op], speedup=True)
    for op in STEP_OPS:
        add(COMPILED, (op, "ours"), "torch.compile(F)", lambda d, red, op=op: (op, "compiled"), big,
            reds=["mean"], group="16M: fwd+bwd step (mean) <= 1.05x torch.compile(F) (5 streams either way)",
            label=op, limit=1.05)
    g6 = "4K: each op call <= 1.2x aten.smooth_l1_loss_backward (same form)"
    for op in BACKWARD_OPS:
        for variant, ref_variant, suffix in (("ours", "aten", ""), ("ours_out", "aten_out", " out=")):
            add(SMALL, (op, variant), "aten.smooth_l1_loss_backward" + suffix,
                lambda d, red, rv=ref_variant: ("smooth_l1_loss_backward", rv), small,
                group=g6, label=op + suffix, limit=1.2)
    for op in FORWARD_OPS:
        add(SMALL, (op, "ours"), "aten.smooth_l1_loss_backward",
            lambda d, red: ("smooth_l1_loss_backward", "aten"), small, group=g6, label=op, limit=1.2)
    for op in STEP_OPS:
        add(SMALL, (op, "ours"), "F", lambda d, red, op=op: (op, "F"), small, reds=["mean"],
            group="4K: fwd+bwd step (mean) <= 0.95x torch.nn.functional", label=op, limit=0.95)

    # Comparisons without a target, for the figure: the forward ops against their roofline, and the forms
    # whose baseline has no target.
    for op in FORWARD_OPS:
        add(ROOFLINE, (op, "ours"), "roofline", fwd_roof, big)
    for op, variants in BASELINE.items():
        for variant, base in variants.items():
            if not any(c.panel == BASELINE_PANEL and c.row == (op, variant) for c in out):
                add(BASELINE_PANEL, (op, variant), base.replace("_out", " out="),
                    lambda d, red, op=op, base=base: (op, base), big)
    return [c for c in out if c.values], threads


def targets_of(comparisons: list[Comparison]) -> list[Comparison]:
    """The comparisons held to a target: the rows of the table."""
    return [c for c in comparisons if c.limit is not None]
