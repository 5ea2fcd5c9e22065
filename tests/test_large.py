"""Tensors over 2**31 elements (64-bit indexing): opt-in, they need ~10 GB of memory and take a while.
Run with NPU_LOSS_OPS_LARGE_TESTS=1."""
import os

import pytest
import torch

import npu_loss_ops  # noqa: F401

pytestmark = [
    pytest.mark.large,
    pytest.mark.skipif(os.environ.get("NPU_LOSS_OPS_LARGE_TESTS") != "1",
                       reason="opt-in: set NPU_LOSS_OPS_LARGE_TESTS=1 (needs ~10 GB of memory)"),
]

N = 2**31 + 7


def test_forward_sum_over_2_pow_31_elements():
    x = torch.full((N,), 0.5, dtype=torch.bfloat16)
    t = torch.zeros(N, dtype=torch.bfloat16)
    t[-1] = 2.5  # the very last element counts: |0.5 - 2.5| = 2 instead of 0.5
    out = torch.ops.npu_loss.l1_loss(x, t, 2)
    assert out.dtype == torch.bfloat16
    expected = 0.5 * (N - 1) + 2.0
    assert abs(out.float().item() - expected) <= 1e-2 * expected


def test_backward_over_2_pow_31_elements():
    x = torch.full((N,), 0.5, dtype=torch.bfloat16)
    t = torch.zeros((), dtype=torch.bfloat16)
    g = torch.tensor(3.0, dtype=torch.bfloat16)
    out = torch.ops.npu_loss.smooth_l1_loss_backward(g, x, t, 2, 1.0)
    assert out.shape == (N,)
    assert out[0].item() == 1.5 and out[-1].item() == 1.5 and out[2**31].item() == 1.5


def test_huber_forward_and_backward_over_2_pow_31_elements():
    """Huber's kernels index in 64 bits too: the last element, past 2**31, is outside delta."""
    x = torch.full((N,), 0.5, dtype=torch.bfloat16)
    t = torch.zeros(N, dtype=torch.bfloat16)
    t[-1] = 4.5  # |d| = 4 > delta = 2: 2 * (4 - 1) = 6 instead of 0.125
    out = torch.ops.npu_loss.huber_loss(x, t, 2, 2.0)
    assert out.dtype == torch.bfloat16
    expected = 0.125 * (N - 1) + 6.0
    assert abs(out.float().item() - expected) <= 1e-2 * expected
    del out
    g = torch.tensor(3.0, dtype=torch.bfloat16)
    grad = torch.ops.npu_loss.huber_loss_backward(g, x, t, 2, 2.0)
    assert grad.shape == (N,)
    assert grad[0].item() == 1.5 and grad[2**31].item() == 1.5 and grad[-1].item() == -6.0
