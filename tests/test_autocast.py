"""Under torch.autocast the losses compute in float32, as torch.nn's do (docs/semantics.md, "Reduced precision")."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import npu_loss_ops
from reference import assert_close_on_device
from samples import LOSSES


def _target(name, shape):
    return torch.rand(shape) if name == "kl_div" else torch.randn(shape)


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_cpu_autocast_matches_torch_nn(name, reduction):
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 5)
    x = torch.randn(7, 6)
    t = _target(name, (7, 5))
    grads = []
    results = []
    for fn in (getattr(npu_loss_ops, name), getattr(F, name)):
        lin.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            y = lin(x)
            assert y.dtype == torch.bfloat16  # the model runs in bf16 ...
            loss = fn(y, t, reduction=reduction)
        results.append(loss)
        loss.sum().backward()
        grads.append(lin.weight.grad.clone())
    ours, ref = results
    assert ours.dtype == ref.dtype == torch.float32  # ... the loss in float32
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    # Same bf16 activations, float32 loss: the weight gradients agree to bf16 matmul accuracy.
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("name", LOSSES)
def test_cpu_autocast_leaves_float64_alone(name):
    x = torch.randn(4, 3, dtype=torch.float64)
    t = _target(name, (4, 3)).double()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = getattr(npu_loss_ops, name)(x, t)
    assert out.dtype == torch.float64


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("low", [torch.float16, torch.bfloat16])
def test_autocast_computes_in_float32(name, reduction, low, device):
    """Under torch.autocast(<device type>) (AutocastCPU, and AutocastPrivateUse1 on the NPU) the loss of
    low-precision activations is computed in float32, as torch.nn's are, and the gradient flows back in
    the activations' dtype. (torch_npu itself turns autocast off for bfloat16 on chips without bf16 —
    Ascend 910/310P, with a warning: there the loss stays in bfloat16, as torch.nn's would.)"""
    x = torch.randn(7, 5).to(low)
    t = _target(name, (7, 5)).to(low)

    def run(dev, autocast=True):
        xd = x.to(dev).requires_grad_(True)
        with torch.autocast(dev, dtype=low, enabled=autocast), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            enabled = torch.is_autocast_enabled(dev)
            out = getattr(npu_loss_ops, name)(xd, t.to(dev), reduction=reduction)
        (gx,) = torch.autograd.grad(out.sum(), xd)
        return out, gx, enabled

    out, gx, enabled = run(device)
    if not enabled:
        assert device == "npu" and low == torch.bfloat16 and not torch.npu.is_bf16_supported(), (
            f"autocast({device}, {low}) was turned off")
    assert out.dtype == (torch.float32 if enabled else low) and gx.dtype == low
    # float64 references on the very (rounded) values the ops saw
    x64 = x.double().requires_grad_(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = getattr(F, name)(x64, t.double(), reduction=reduction)
    (ref_gx,) = torch.autograd.grad(ref.sum(), x64)
    cpu_out, cpu_gx, _ = run("cpu", enabled) if device != "cpu" else (None, None, None)
    mag = None
    if name == "kl_div":  # log(t) - x cancels: bound by the |terms|
        tt = t.double()
        mag = torch.xlogy(tt, tt).abs() + (tt * x.double()).abs()
        mag = mag if reduction == "none" else (mag.sum() if reduction == "sum" else mag.mean())
    assert_close_on_device(out, ref, mag, msg="loss", device=device, cpu=cpu_out)
    assert_close_on_device(gx, ref_gx, msg="gradient", device=device, cpu=cpu_gx)
