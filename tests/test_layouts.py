"""Layouts (docs/semantics.md: any strides — non-contiguous, transposed, expanded, sliced inputs; non-contiguous
outputs), 0-dim and 8-dim tensors, on every device of the run (conftest.py; off the CPU each result is
also compared with the CPU kernels')."""
import pytest
import torch

import npu_loss_ops
from helpers import every_bfloat16
from reference import assert_close, assert_close_on_device, cpu_result, reference_backward, reference_forward
from samples import LOSSES, Sample, all_samples, layout_kind, make_layout, make_sample


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["transposed", "sliced", "expanded"])
@pytest.mark.parametrize("loss", LOSSES)
def test_elementwise_results_do_not_depend_on_layout(loss, layout, dtype, device):
    """The strided loop and the dense fast path agree (to rounding: their log/exp may differ in the last
    bit), and both match the float64 reference."""
    s = make_sample(loss, (40, 70), (40, 70), dtype=dtype, reduction="none", layout=layout)
    ds = s.to(device)
    assert not ds.self.is_contiguous()
    dense = [a.contiguous() for a in (ds.grad_output, ds.self, ds.target)]
    value, mag, _, _ = reference_forward(s)
    strided_fwd, dense_fwd = ds.run_forward(), ds.run_forward(*dense[1:])
    cpu = cpu_result(Sample.run_forward, s, device)
    assert_close_on_device(strided_fwd, value, mag, msg="strided forward", device=device, cpu=cpu)
    assert_close(strided_fwd.cpu(), dense_fwd.cpu(), mag, msg="strided vs dense forward")
    value, mag, _, _ = reference_backward(s)
    strided_bwd, dense_bwd = ds.run_backward(), ds.run_backward(*dense)
    cpu = cpu_result(Sample.run_backward, s, device)
    assert_close_on_device(strided_bwd, value, mag, msg="strided backward", device=device, cpu=cpu)
    assert_close(strided_bwd.cpu(), dense_bwd.cpu(), mag, msg="strided vs dense backward")


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_eight_dims_permuted(loss, reduction, device):
    shape = (2, 3, 2, 1, 2, 3, 2, 2)
    s = make_sample(loss, shape, shape[:4] + (1, 3, 1, 2), dtype=torch.float32, reduction=reduction)
    perm = (7, 6, 5, 4, 3, 2, 1, 0)
    # the same values through a permuted (non-contiguous) view
    x = s.self.permute(perm).contiguous().permute(perm)
    assert x.dim() == 8 and not x.is_contiguous()
    s2 = Sample(s.loss, x, s.target, s.grad_output, s.reduction, s.beta, s.log_target, name=s.name)
    d2 = s2.to(device)
    assert d2.self.stride() == x.stride()
    out = d2.run_forward()
    value, mag, dtype, shape_ = reference_forward(s2)
    assert out.shape == shape_ and out.dtype == dtype
    assert_close_on_device(out, value, mag, device=device, cpu=cpu_result(Sample.run_forward, s2, device))
    grad = d2.run_backward()
    value, mag, dtype, shape_ = reference_backward(s2)
    assert grad.shape == shape_
    assert_close_on_device(grad, value, mag, device=device,
                           cpu=cpu_result(Sample.run_backward, s2, device))


@pytest.mark.parametrize("loss", LOSSES)
def test_all_zero_dim(loss, device):
    s = make_sample(loss, (), (), dtype=torch.float32, reduction="none")
    for reduction in ("none", "mean", "sum"):
        s.reduction = reduction
        ds = s.to(device)
        out = ds.run_forward()
        assert out.shape == ()
        value, mag, _, _ = reference_forward(s)
        assert_close_on_device(out, value, mag, device=device, cpu=cpu_result(Sample.run_forward, s, device))
        grad = ds.run_backward()
        value, mag, _, shape = reference_backward(s)
        assert grad.shape == shape == ()
        assert_close_on_device(grad, value, mag, device=device,
                               cpu=cpu_result(Sample.run_backward, s, device))


@pytest.mark.parametrize("shape", [(6, 7), (2, 3, 4), (6,), (5, 1), (1, 5), (2,)])
def test_make_layout_really_changes_strides(shape):
    """Every non-contiguous layout is really strided, 1-D tensors included (a 1-D "transposed" tensor is a
    stride-2 view), so the samples built with it reach the kernels' strided paths."""
    v = torch.randn(shape)
    for layout in ("transposed", "sliced", "expanded"):
        if layout == "expanded" and shape[0] == 1:
            continue  # nothing to expand along dim 0
        t = make_layout(v, layout)
        assert t.shape == v.shape and not t.is_contiguous(), (layout, t.stride())
        if layout != "expanded":  # expanded keeps the first row only
            assert torch.equal(t, v), layout


def test_strided_samples_are_non_contiguous():
    """The shared grid's layout samples pass non-contiguous tensors wherever a tensor has more than one
    element."""
    for loss in LOSSES:
        for s in all_samples(loss):
            if s.name.endswith(("-transposed", "-sliced", "-expanded")):
                for t in (s.self, s.target):
                    assert t.numel() <= 1 or not t.is_contiguous(), (s.name, tuple(t.shape), t.stride())


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced", "expanded"])
def test_sample_on_device_keeps_its_layout(layout, device):
    """Sample.to(device) rebuilds each view on the device: same values, sizes, strides, storage offset."""
    s = make_sample("smooth_l1_loss", (3, 5, 4), (5, 1), dtype=torch.float32, reduction="none", layout=layout)
    ds = s.to(device)
    for a, b in zip((s.grad_output, s.self, s.target), (ds.grad_output, ds.self, ds.target)):
        assert b.device.type == device
        assert (b.shape, b.stride(), b.storage_offset()) == (a.shape, a.stride(), a.storage_offset())
        assert layout_kind(b) == layout_kind(a)
        assert torch.equal(b.cpu(), a)
    assert layout_kind(ds.self) == layout


def test_bfloat16_kl_strided_matches_dense_bitwise():
    """The strided loop computes bfloat16 inputs as the bfloat16 kernels do (loops.h): KL's log of a
    bfloat16 target takes the same form on both loops (a table lookup on AVX-512, docs/cpu_kernels.md), so
    forward and gradient agree bit for bit. The targets are the bfloat16 values whose lookup log differs
    from the polynomial's, and x sweeps every bfloat16 in (-4, 4), so that cancellation in log(t) + 1 - x
    shows a last-bit difference after the bfloat16 rounding: the mixed-dtype call, which computes in
    float32 with the polynomial, must differ somewhere when the lookup is in use."""
    isa = npu_loss_ops.build_info()["cpu_isa"]
    every = every_bfloat16()
    positive = every[(every > 0) & every.isfinite()]
    lookup, poly = (npu_loss_ops._C._vec_math(fn, positive, isa) for fn in ("log_bf16", "log"))
    t_values = positive[lookup != poly]
    if t_values.numel() == 0:  # no lookup on this instruction set: log_bf16 is log
        t_values = positive[(positive - 0.5).abs() < 0.25][:64]
    x_values = every[every.abs() < 4]
    shape = (t_values.numel(), x_values.numel())
    t = t_values[:, None].expand(shape).bfloat16().contiguous()
    x = x_values[None, :].expand(shape).bfloat16().contiguous()
    g = torch.ones(shape, dtype=torch.bfloat16)
    strided = [make_layout(v, "sliced") for v in (g, x, t)]
    assert not strided[1].is_contiguous() and torch.equal(strided[1], x)
    ops = torch.ops.npu_loss
    for log_target in (False, True):
        dense_bwd = ops.kl_div_target_backward(g, x, t, 0, log_target)
        assert torch.equal(ops.kl_div_target_backward(*strided, 0, log_target), dense_bwd), log_target
        dense_fwd = ops.kl_div(x, t, 0, log_target=log_target)
        assert torch.equal(ops.kl_div(strided[1], strided[2], 0, log_target=log_target), dense_fwd)
    if (lookup != poly).any():
        mixed = ops.kl_div_target_backward(g, x.float(), t, 0, False)
        assert not torch.equal(mixed, ops.kl_div_target_backward(g, x, t, 0, False))
