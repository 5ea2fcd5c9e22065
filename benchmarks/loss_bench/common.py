"""What the loss benchmark measures: dtypes, reductions, sizes, the ops, their baselines and rooflines."""
from __future__ import annotations

from dataclasses import dataclass

import torch

REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
FULL_SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
QUICK_SIZES = [4 << 10, 256 << 10, 16 << 20]
# The targets are stated at 16M elements (bandwidth-bound) and 4K elements (per-call overhead), on 2 threads.
TARGET_SIZE, SMALL_SIZE, TARGET_THREADS = 16 << 20, 4 << 10, 2
BETA = 1.0  # smooth L1's beta and Huber's delta: F's defaults
# A timed cell is "disturbed" (shown as unreliable, neither PASS nor MISS) when the process got less than this
# share of the CPU time its busy threads would use (run.disturbed). ATen's and our parallel grain: a call splits
# into chunks of this many elements, one per thread at most.
DISTURBED_BELOW = 0.75
PARALLEL_GRAIN = 32768

BACKWARD_OPS = ["smooth_l1_loss_backward", "huber_loss_backward", "mse_loss_backward", "l1_loss_backward",
                "kl_div_target_backward", "kl_div_target_backward[log]"]
FORWARD_OPS = ["smooth_l1_loss", "huber_loss", "mse_loss", "l1_loss", "kl_div", "kl_div[log]"]
STEP_OPS = ["step:smooth_l1_loss", "step:huber_loss", "step:mse_loss", "step:l1_loss", "step:kl_div"]
# The backward ops ATen has as ops of their own (the others' gradients are composites of other ops).
ATEN_BACKWARD_OPS = ["smooth_l1_loss_backward", "huber_loss_backward", "mse_loss_backward"]
ALL_OPS = BACKWARD_OPS + FORWARD_OPS + STEP_OPS
ROOFLINES = {  # name -> (ATen op as called, element streams)
    "roofline_3r1w": ("aten.addcmul", 4),
    "roofline_2r1w": ("aten.add", 3),
    "roofline_2r0w": ("aten.dot for float32, aten.sum of one (2, n) buffer for 16-bit floats", 2),
}
# The baseline each of our variants is compared with (same form), by op.
BASELINE = {
    "smooth_l1_loss_backward": {"ours": "aten", "ours_out": "aten_out"},
    "huber_loss_backward": {"ours": "aten", "ours_out": "aten_out"},
    "mse_loss_backward": {"ours": "aten", "ours_out": "aten_out"},
    "l1_loss_backward": {"ours": "composite", "ours_out": "composite_out"},
    "kl_div_target_backward": {"ours": "composite", "ours_out": "composite_out"},
    "kl_div_target_backward[log]": {"ours": "composite", "ours_out": "composite_out"},
    **{op: {"ours": "aten"} for op in FORWARD_OPS},
    **{op: {"ours": "F"} for op in STEP_OPS},
}


def backward_roofline(reduction: str) -> str:
    """'none' reads g, x, t and writes the result; 'mean'/'sum' take a 0-dim g, so one read stream less."""
    return "roofline_3r1w" if reduction == "none" else "roofline_2r1w"


def forward_roofline(reduction: str) -> str:
    """'none' writes the elementwise loss; 'mean'/'sum' only read x and t."""
    return "roofline_2r1w" if reduction == "none" else "roofline_2r0w"


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
    """One measured configuration: every selected op's variants run on the same inputs."""
    threads: int
    dtype: str
    reduction: str
    numel: int

    @property
    def label(self) -> str:
        return f"{self.threads}t {DTYPE_SHORT[self.dtype]} {self.reduction} {format_size(self.numel)}"
