"""Layouts (SPEC: any strides — non-contiguous, transposed, expanded, sliced inputs; non-contiguous
outputs), 0-dim and 8-dim tensors, and the NPU path (skipped without torch_npu)."""
import pytest
import torch

import npu_loss_ops
from reference import assert_close, reference_backward, reference_forward
from samples import LOSSES, Sample, make_layout, make_sample


def _forward(s, x, t):
    args, kwargs = s.forward_args(x, t)
    return s.forward_op()(*args, **kwargs)


def _backward(s, g, x, t):
    args, kwargs = s.backward_args(g, x, t)
    return s.backward_op()(*args, **kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["transposed", "sliced", "expanded"])
@pytest.mark.parametrize("loss", LOSSES)
def test_elementwise_results_do_not_depend_on_layout(loss, layout, dtype):
    """The strided route and the dense fast path agree (to rounding: their log/exp may differ in the last
    bit), and both match the float64 reference."""
    s = make_sample(loss, (40, 70), (40, 70), dtype=dtype, reduction="none", layout=layout)
    assert not s.self.is_contiguous()
    dense = [a.contiguous() for a in (s.grad_output, s.self, s.target)]
    value, mag, _, _ = reference_forward(s)
    strided_fwd, dense_fwd = _forward(s, s.self, s.target), _forward(s, *dense[1:])
    assert_close(strided_fwd, value, mag, msg="strided forward")
    assert_close(strided_fwd, dense_fwd, mag, msg="strided vs dense forward")
    value, mag, _, _ = reference_backward(s)
    strided_bwd, dense_bwd = _backward(s, s.grad_output, s.self, s.target), _backward(s, *dense)
    assert_close(strided_bwd, value, mag, msg="strided backward")
    assert_close(strided_bwd, dense_bwd, mag, msg="strided vs dense backward")


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_eight_dims_permuted(loss, reduction):
    shape = (2, 3, 2, 1, 2, 3, 2, 2)
    s = make_sample(loss, shape, shape[:4] + (1, 3, 1, 2), dtype=torch.float32, reduction=reduction)
    perm = (7, 6, 5, 4, 3, 2, 1, 0)
    # the same values through a permuted (non-contiguous) view
    x = s.self.permute(perm).contiguous().permute(perm)
    assert x.dim() == 8 and not x.is_contiguous()
    s2 = Sample(s.loss, x, s.target, s.grad_output, s.reduction, s.beta, s.log_target, name=s.name)
    out = _forward(s2, s2.self, s2.target)
    value, mag, dtype, shape_ = reference_forward(s2)
    assert out.shape == shape_ and out.dtype == dtype
    assert_close(out, value, mag)
    grad = _backward(s2, s2.grad_output, s2.self, s2.target)
    value, mag, dtype, shape_ = reference_backward(s2)
    assert grad.shape == shape_
    assert_close(grad, value, mag)


@pytest.mark.parametrize("loss", LOSSES)
def test_all_zero_dim(loss):
    s = make_sample(loss, (), (), dtype=torch.float32, reduction="none")
    for reduction in ("none", "mean", "sum"):
        s.reduction = reduction
        out = _forward(s, s.self, s.target)
        assert out.shape == ()
        value, mag, _, _ = reference_forward(s)
        assert_close(out, value, mag)
        grad = _backward(s, s.grad_output, s.self, s.target)
        value, mag, _, shape = reference_backward(s)
        assert grad.shape == shape == ()
        assert_close(grad, value, mag)


def test_make_layout_really_changes_strides():
    v = torch.randn(6, 7)
    for layout in ("transposed", "sliced", "expanded"):
        t = make_layout(v, layout)
        assert t.shape == v.shape and not t.is_contiguous(), layout


# ---------------------------------------------------------------------------------------------------
# NPU (skipped where torch_npu and the aclnn kernels are not available; see conftest.py)


def _npu():
    return torch.device(torch._C._get_privateuse1_backend_name())


@pytest.mark.npu
@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_npu_matches_cpu(loss, dtype):
    for s in [make_sample(loss, (7, 13), (7, 13), dtype=dtype, reduction=r) for r in ("none", "mean", "sum")]:
        cpu = s.backward_op()(*s.backward_args()[0])
        moved = s.map_tensors(lambda t: t.to(_npu()))
        npu = moved.backward_op()(*moved.backward_args()[0])
        value, mag, _, _ = reference_backward(s)
        assert_close(npu.cpu(), value, mag, msg=f"npu {s.name}")
        assert npu.dtype == cpu.dtype and npu.shape == cpu.shape


@pytest.mark.npu
def test_npu_rejects_float64():
    x = torch.randn(3, device=_npu(), dtype=torch.float64)
    with pytest.raises(TypeError, match="float64"):
        torch.ops.npu_loss.l1_loss_backward(x, x, x, 1)


def test_npu_marker_reflects_availability():
    assert isinstance(getattr(npu_loss_ops, "npu_kernels_available", lambda: False)(), bool)
