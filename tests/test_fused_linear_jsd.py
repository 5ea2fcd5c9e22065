"""The fused linear JSD (docs/semantics.md, "The fused linear JSD"): npu_loss_ops.fused_linear_jsd_loss and
FusedLinearJSDLoss against a float64 reference that makes the logits (TRL's formula, tests/reference.py, plus
the cross entropy as Liger-Kernel weights it) over beta, temperature, labels, shapes, biases, the hard loss and
the teacher's gradients in every dtype; gradcheck, opcheck, torch.compile against eager, the same bits with 1
and 2 threads, retain_graph, every bad input, and the memory bound (in fresh processes)."""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
from typing import Optional

import pytest
import torch
import torch.nn.functional as F

import npu_loss_ops
from helpers import backward_eager_and_compiled, package_parent
from reference import trl_generalized_jsd_loss

ops = torch.ops.npu_loss
# The ops this file covers (tests/test_registration.py: every op has a sample family).
OPS = ("fused_linear_jsd_loss", "_fused_linear_jsd_loss_and_grads")
# Relative to each result's largest magnitude: the gradients are sums over V (the inputs') or over the rows
# (the weights'), where elementwise relative error means nothing. bfloat16 and float16 logits are rounded
# once by the matmul (2^-9 and 2^-12), which the softmax carries into every gradient.
RTOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.bfloat16: 3e-2, torch.float16: 4e-3}


def reference(xs, ws, xt, wt, labels, bs=None, bt=None, beta=0.5, temperature=1.0, reduction="batchmean",
              weight_hard_loss=0.0, weight_soft_loss=1.0, ignore_index=-100):
    """The formula with the logits made, in the inputs' dtype (float64 for the reference)."""
    zs = xs @ ws.T + (bs if bs is not None else 0)
    zt = xt @ wt.T + (bt if bt is not None else 0)
    soft = trl_generalized_jsd_loss(zs, zt, labels, beta, temperature, reduction, ignore_index=ignore_index)
    if labels is None:
        return weight_soft_loss * soft, soft, torch.zeros((), dtype=soft.dtype)
    ce = F.cross_entropy(zs.reshape(-1, zs.size(-1)), labels.reshape(-1), ignore_index=ignore_index, reduction="sum")
    hard = ce if reduction == "sum" else ce / (labels != ignore_index).sum().clamp(min=1)
    return weight_soft_loss * soft + weight_hard_loss * hard, soft, hard


def _inputs(shape, hs, ht, v, bias, seed=0, spread=2.0):
    gen = torch.Generator().manual_seed(seed)
    t = {"xs": torch.randn(*shape, hs, generator=gen, dtype=torch.float64),
         "ws": torch.randn(v, hs, generator=gen, dtype=torch.float64) / hs ** 0.5 * spread,
         "xt": torch.randn(*shape, ht, generator=gen, dtype=torch.float64),
         "wt": torch.randn(v, ht, generator=gen, dtype=torch.float64) / ht ** 0.5 * spread}
    if bias:
        t["bs"] = torch.randn(v, generator=gen, dtype=torch.float64)
        t["bt"] = torch.randn(v, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, v, shape, generator=gen)
    labels[torch.rand(shape, generator=gen) < 0.3] = -100
    return t, labels


def _check(dtype, shape, v, beta, temperature, reduction, with_labels, bias, hard, teacher_grad, chunk_size,
           spread=2.0, labels=None):
    t, drawn = _inputs(shape, 12, 20, v, bias, spread=spread)
    labels = (drawn if labels is None else labels) if with_labels else None
    wh = 0.5 if hard else 0.0
    grads_of = ["xs", "ws", "bs", "xt", "wt", "bt"] if teacher_grad else ["xs", "ws", "bs"]
    grads_of = [k for k in grads_of if k in t]
    ref = {k: x.clone().requires_grad_(k in grads_of) for k, x in t.items()}
    expected, soft, hard_part = reference(ref["xs"], ref["ws"], ref["xt"], ref["wt"], labels, ref.get("bs"),
                                          ref.get("bt"), beta, temperature, reduction, wh, 0.75)
    ours = {k: x.detach().to(dtype).requires_grad_(k in grads_of) for k, x in t.items()}
    loss, got_soft, got_hard = npu_loss_ops.fused_linear_jsd_loss(
        ours["xs"], ours["ws"], ours["xt"], ours["wt"], labels, student_bias=ours.get("bs"),
        teacher_bias=ours.get("bt"), beta=beta, temperature=temperature, reduction=reduction,
        weight_hard_loss=wh, weight_soft_loss=0.75, chunk_size=chunk_size, return_soft_hard_loss=True)
    assert loss.dtype == dtype and loss.shape == () and not got_soft.requires_grad
    for name, a, e in (("loss", loss, expected), ("soft", got_soft, soft), ("hard", got_hard, hard_part)):
        if e.isnan():
            assert a.isnan(), name
            continue
        assert abs(a.double() - e.detach()) <= RTOL[dtype] * max(abs(e.item()), 1e-3), (name, a.item(), e.item())
    if expected.isnan():
        return
    loss.backward()
    expected.backward()
    for k in grads_of:
        e, a = ref[k].grad, ours[k].grad
        assert a.dtype == dtype and a.shape == e.shape, k
        scale = e.abs().max().clamp(min=1e-12)
        # float16's gradients are rounded once into float16, whose subnormal spacing (2^-24) bounds the error of
        # a gradient as small as the teacher's under 'mean' (about 1e-6 here)
        floor = 2.0 ** -24 if dtype == torch.float16 else 0.0
        err = ((a.double() - e).abs().max() - floor).clamp(min=0).item() / scale.item()
        assert err <= RTOL[dtype], f"{k}: {err:.2e} of its largest magnitude {scale.item():.2e}"


# The family's matrix in float64 and float32, every flag against every other; the half dtypes on a slice of it.
FLAGS = list(itertools.product(("batchmean", "sum", "mean"), (0.0, 0.3, 1.0), (True, False), (True, False),
                               (True, False), (True, False)))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("reduction,beta,with_labels,bias,hard,teacher_grad", FLAGS)
def test_matches_the_float64_reference(dtype, reduction, beta, with_labels, bias, hard, teacher_grad):
    if hard and not with_labels:
        pytest.skip("the hard loss needs labels (a ValueError, test_bad_input)")
    temperature = 2.0 if beta == 0.3 else 1.0
    shape = (3, 5) if bias else (15,)
    _check(dtype, shape, 37, beta, temperature, reduction, with_labels, bias, hard, teacher_grad, chunk_size=4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("reduction", ["batchmean", "sum", "mean"])
@pytest.mark.parametrize("beta,temperature,hard,teacher_grad",
                         [(0.5, 1.0, True, True), (0.0, 1.0, False, True), (1.0, 1.0, True, False),
                          (0.3, 2.0, True, True)])
def test_half_dtypes_match_the_float64_reference(dtype, reduction, beta, temperature, hard, teacher_grad):
    # bfloat16's row kernel makes the hard loss in its own passes (its own log-sum-exp where T != 1); float16's
    # row scales leave it to ATen ops.
    _check(dtype, (4, 9), 301, beta, temperature, reduction, True, True, hard, teacher_grad, chunk_size=None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("temperature", [1.0, 0.5, 3.0])
def test_hard_loss_over_wide_logits(dtype, temperature):
    """The hard loss where the CPU kernel makes it: logits spread over hundreds (a softmax that underflows in
    most lanes, and the tempered one elsewhere than the untempered), labels in the first element, the last
    (the tail's lanes: V = 301) and between, ignored rows among them. The teacher's gradients are left out:
    with both softmaxes near one-hot on different tokens, the JSD saturates at log 2 and they are rounding."""
    labels = torch.tensor([0, 300, -100, 150, 299, 1, 64, -100, 31, 32, 33, 300])
    _check(dtype, (12,), 301, 0.5, temperature, "batchmean", True, True, True, False, chunk_size=5, spread=60.0,
           labels=labels)


DEVICE_CASES = [(dt, beta, hard, teacher_grad, bias) for dt in (torch.float32, torch.bfloat16, torch.float16)
                for beta, hard, teacher_grad, bias in ((0.5, True, True, True), (0.0, False, True, False),
                                                        (1.0, True, False, True))]


@pytest.mark.parametrize("dtype,beta,hard,teacher_grad,bias", DEVICE_CASES,
                         ids=[f"{str(c[0])[6:]}-beta{c[1]:g}-hard{int(c[2])}-teacher{int(c[3])}-bias{int(c[4])}"
                              for c in DEVICE_CASES])
def test_on_the_device_as_on_the_cpu(device, dtype, beta, hard, teacher_grad, bias):
    """On the device (the NPU: each chunk's matmuls and the family's aclnn path), the loss, its parts and every
    gradient as the CPU kernels give them, within the dtype's tolerance of each result's largest magnitude."""
    t, labels = _inputs((3, 7), 12, 20, 301, bias)
    grads_of = [k for k in (["xs", "ws", "bs", "xt", "wt", "bt"] if teacher_grad else ["xs", "ws", "bs"]) if k in t]

    def run(dev):
        x = {k: v.to(dtype).to(dev).requires_grad_(k in grads_of) for k, v in t.items()}
        parts = npu_loss_ops.fused_linear_jsd_loss(
            x["xs"], x["ws"], x["xt"], x["wt"], labels.to(dev), student_bias=x.get("bs"), teacher_bias=x.get("bt"),
            beta=beta, temperature=1.5, reduction="mean", weight_hard_loss=0.5 if hard else 0.0, chunk_size=8,
            return_soft_hard_loss=True)
        parts[0].backward()
        return [p.detach().cpu() for p in parts] + [x[k].grad.cpu() for k in grads_of]

    want = run("cpu")
    got = run(device)
    for name, g, w in zip(["loss", "soft", "hard"] + grads_of, got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        scale = float(w.double().abs().max()) or 1.0
        floor = 2.0 ** -24 if dtype == torch.float16 else 0.0  # float16's subnormal spacing (_check says why)
        err = max(float((g.double() - w.double()).abs().max()) - floor, 0.0) / scale
        assert err <= RTOL[dtype], f"{name}: {err:.2e} of its largest magnitude {scale:.2e}"


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_float16_rows_with_tiny_gradients(reduction):
    """A student close to its teacher: the family stores each float16 row times 2^j up to 2^60, far beyond float16's
    range, and the gradients are made from those rows in float32 (the product of the row scale and the loss's
    factor), so none is flushed to zero by the row scale itself."""
    t, labels = _inputs((48,), 12, 12, 301, False, seed=8)
    t["xt"] = t["xs"].clone()
    t["wt"] = t["ws"] + 0.02 * torch.randn(t["ws"].shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    ref = {k: v.clone().requires_grad_(k in ("xs", "ws")) for k, v in t.items()}
    expected = reference(ref["xs"], ref["ws"], ref["xt"], ref["wt"], labels, reduction=reduction)[0]
    expected.backward()
    x = {k: v.half().requires_grad_(k in ("xs", "ws")) for k, v in t.items()}
    with torch.no_grad():
        row_scale = ops._generalized_jsd_loss_and_grads(
            x["xs"] @ x["ws"].T, x["xt"] @ x["wt"].T, labels, 2, 0.5, 1.0, 1.0, 1.0, None, None, -100, [True, False])[3]
    assert row_scale.min() < 2.0 ** -24  # some rows' scales are below float16's smallest subnormal
    npu_loss_ops.fused_linear_jsd_loss(x["xs"], x["ws"], x["xt"], x["wt"], labels, reduction=reduction,
                                       chunk_size=16).backward()
    # Row by row for the input's gradient (a row whose scale were flushed would lose its whole gradient: 100%);
    # within 25%: float16's rounding of logits of magnitude ~2 (2^-10) is up to about a tenth of the difference
    # between the student's and the teacher's logits here (measured: 1% to 11% per row).
    e, a = ref["xs"].grad, x["xs"].grad.double()
    kept = labels != -100
    err = ((a - e).abs().amax(-1) - 2.0 ** -24).clamp(min=0) / e.abs().amax(-1).clamp(min=1e-30)
    assert err[kept].max() <= 0.25, f"xs: rows off by up to {err[kept].max():.2e} of their largest magnitude"
    e, a = ref["ws"].grad, x["ws"].grad.double()
    assert float((a - e).abs().max()) <= 0.25 * float(e.abs().max())


@pytest.mark.parametrize("teacher_grad", [True, False], ids=["teacher_grad", "student_grad"])
@pytest.mark.parametrize("chunk_size", [1, 2, 3, 7, 64, None])
def test_chunk_size_does_not_change_the_result(chunk_size, teacher_grad):
    """Any chunk gives the reference's numbers (float64: the chunking reorders the row sums only); without the
    teacher's gradients its logits are made in halves of the chunk, an odd chunk's and the last's too."""
    _check(torch.float64, (2, 11), 53, 0.5, 1.0, "batchmean", True, True, True, teacher_grad, chunk_size)


def test_no_row_kept():
    t, labels = _inputs((6,), 8, 8, 10, False)
    labels[:] = -100
    xs = t["xs"].float().requires_grad_()
    args = (xs, t["ws"].float(), t["xt"].float(), t["wt"].float(), labels)
    for reduction, want in (("batchmean", 0.0), ("sum", 0.0)):
        loss = npu_loss_ops.fused_linear_jsd_loss(*args, reduction=reduction, weight_hard_loss=0.5)
        assert loss.item() == want
        loss.backward()
        assert torch.count_nonzero(xs.grad) == 0
        xs.grad = None
    loss = npu_loss_ops.fused_linear_jsd_loss(*args, reduction="mean")
    assert loss.isnan()  # as the family's 'mean' of no element
    loss.backward()
    assert torch.count_nonzero(xs.grad) == 0


@pytest.mark.parametrize("beta,temperature,hard", [(0.0, 1.0, 0.5), (0.3, 2.0, 0.0), (0.5, 1.0, 0.5), (1.0, 2.0, 0.5)])
def test_matches_liger(beta, temperature, hard):
    """Liger-Kernel's LigerFusedLinearJSDLoss (its torch path, uncompiled) with the same weights: the loss, its
    parts and the student's gradients (where liger-kernel is installed; the default venv does not have it)."""
    liger_loss = pytest.importorskip("liger_kernel.chunked_loss").LigerFusedLinearJSDLoss
    t, labels = _inputs((40,), 16, 24, 301, False, seed=6)
    liger = liger_loss(weight_hard_loss=hard, weight_soft_loss=0.75, beta=beta, temperature=temperature,
                       compiled=False, chunk_size=16, return_soft_hard_loss=True)
    x = {k: v.float().requires_grad_(k in ("xs", "ws")) for k, v in t.items()}
    want = liger(x["xs"], x["ws"], x["xt"], x["wt"], labels)
    want[0].backward()
    y = {k: v.float().requires_grad_(k in ("xs", "ws")) for k, v in t.items()}
    got = npu_loss_ops.fused_linear_jsd_loss(y["xs"], y["ws"], y["xt"], y["wt"], labels, beta=beta,
                                             temperature=temperature, weight_hard_loss=hard, weight_soft_loss=0.75,
                                             return_soft_hard_loss=True)
    got[0].backward()
    for name, a, b in zip(("loss", "soft", "hard"), got, want):
        torch.testing.assert_close(a.detach(), b.detach().float(), rtol=2e-6, atol=0, msg=name)
    for k in ("xs", "ws"):
        err = ((y[k].grad - x[k].grad).abs().max() / x[k].grad.abs().max()).item()
        assert err <= 2e-6, f"{k}: {err:.2e}"


def test_liger_defaults_are_documented_not_taken():
    """The defaults are TRL's use of Liger (hard 0.0, soft 1.0): the loss is the family's JSD of the logits."""
    t, labels = _inputs((10,), 8, 16, 40, False)
    loss = npu_loss_ops.fused_linear_jsd_loss(t["xs"], t["ws"], t["xt"], t["wt"], labels)
    jsd = npu_loss_ops.generalized_jsd_loss(t["xs"] @ t["ws"].T, t["xt"] @ t["wt"].T, labels)
    torch.testing.assert_close(loss, jsd, rtol=1e-12, atol=0)


def test_module_is_the_functional():
    t, labels = _inputs((2, 5), 8, 16, 40, True)
    module = npu_loss_ops.FusedLinearJSDLoss(beta=0.3, temperature=2.0, weight_hard_loss=0.5, weight_soft_loss=0.5,
                                             reduction="sum", chunk_size=3)
    got = module(t["xs"], t["ws"], t["xt"], t["wt"], labels, t["bs"], t["bt"])
    want = npu_loss_ops.fused_linear_jsd_loss(
        t["xs"], t["ws"], t["xt"], t["wt"], labels, student_bias=t["bs"], teacher_bias=t["bt"], beta=0.3,
        temperature=2.0, weight_hard_loss=0.5, weight_soft_loss=0.5, reduction="sum", chunk_size=3)
    assert torch.equal(got, want)
    assert "chunk_size=3" in repr(module)


@pytest.mark.parametrize("reduction", ["batchmean", "sum", "mean"])
@pytest.mark.parametrize("hard", [0.0, 0.7])
def test_gradcheck(reduction, hard):
    gen = torch.Generator().manual_seed(1)
    tensors = [torch.randn(*s, generator=gen, dtype=torch.float64, requires_grad=True)
               for s in ((6, 4), (9, 4), (6, 5), (9, 5), (9,), (9,))]
    labels = torch.tensor([1, -100, 3, 8, 0, -100])

    def fn(xs, ws, xt, wt, bs, bt):
        return npu_loss_ops.fused_linear_jsd_loss(xs, ws, xt, wt, labels, student_bias=bs, teacher_bias=bt, beta=0.3,
                                                  temperature=1.5, reduction=reduction, weight_hard_loss=hard,
                                                  chunk_size=4)

    assert torch.autograd.gradcheck(fn, tensors)


def _op_args(mask=(True, True, False, False, True, False), hard=0.5):
    """The forward with gradients' arguments: (student_input, student_weight, teacher_input, teacher_weight,
    labels, student_bias, teacher_bias, reduction, beta, temperature, ignore_index, weight_hard_loss,
    weight_soft_loss, chunk_size, return_soft_hard_loss, return_entropy, output_mask)."""
    gen = torch.Generator().manual_seed(2)
    n, v = 12, 70
    xs, ws, xt, wt = (torch.randn(*s, generator=gen) for s in ((n, 8), (v, 8), (n, 6), (v, 6)))
    bs = torch.randn(v, generator=gen)
    labels = torch.randint(0, v, (n,), generator=gen)
    labels[::4] = -100
    for t, want in zip((xs, ws, bs, xt, wt), mask):
        t.requires_grad_(want)
    return (xs, ws, xt, wt, labels, bs, None, "batchmean", 0.5, 1.0, 1.0, 1.0, None, None, -100, hard, 1.0, 5, True, True, list(mask))


@pytest.mark.parametrize("mask", [(True, True, False, False, True, False), (True, True, True, True, True, False),
                                  (False,) * 6])
def test_opcheck(mask):
    """Both ops: the schema, the fake (Meta) kernel against the real one, autograd registration."""
    args = _op_args(mask)
    torch.library.opcheck(ops._fused_linear_jsd_loss_and_grads.default, args)
    torch.library.opcheck(ops.fused_linear_jsd_loss.default, args[:-1])


def test_opcheck_non_contiguous_inputs():
    """Strided hidden states, a transposed weight and a strided bias: the fake kernel's results have the real
    kernel's strides."""
    xs, ws, xt, wt, labels, bs, _, *rest = _op_args((True, True, True, True, True, False))
    xs2 = torch.randn(xs.shape[1], xs.shape[0]).t().requires_grad_()
    ws2 = torch.randn(ws.shape[1], ws.shape[0]).t().requires_grad_()
    bs2 = torch.randn(2 * bs.shape[0])[::2].requires_grad_()
    torch.library.opcheck(ops._fused_linear_jsd_loss_and_grads.default,
                          (xs2, ws2, xt, wt, labels, bs2, None, *rest[:-1], [True, True, True, False, True, False]))


def test_the_forward_with_gradients_is_the_functional_s():
    """The op's eleven results: the three values, each gradient asked for (empty otherwise), the stored scale (1
    but for float16), the entropy (asked for), and the same gradients autograd gives."""
    xs, ws, xt, wt, labels, bs, _, *rest = _op_args((True, True, True, True, True, False))
    results = ops._fused_linear_jsd_loss_and_grads(xs, ws, xt, wt, labels, bs, None, *rest[:-1],
                                                   [True, True, True, False, True, False])
    assert len(results) == 11 and results[9].tolist() == [1.0, 1.0] and results[9].dtype == torch.float32
    assert results[10].shape == labels.shape and results[10].dtype == torch.float32
    assert results[6].numel() == 0 and results[8].numel() == 0
    loss = npu_loss_ops.fused_linear_jsd_loss(xs, ws, xt, wt, labels, student_bias=bs, weight_hard_loss=0.5,
                                              chunk_size=5)
    assert torch.equal(loss, results[0])
    got = torch.autograd.grad(loss, (xs, ws, bs, wt))
    for a, b in zip(got, (results[3], results[4], results[5], results[7])):
        assert torch.equal(a, b)


def _loss_and_grads(fn, *tensors):
    loss = fn(*tensors)
    return (loss, *torch.autograd.grad(loss, [t for t in tensors if t.requires_grad]))


def _fused(xs, ws, xt, wt, labels, bs):
    return npu_loss_ops.fused_linear_jsd_loss(xs, ws, xt, wt, labels, student_bias=bs, weight_hard_loss=0.5,
                                              chunk_size=7)


def test_compiled_matches_eager():
    xs, ws, xt, wt, labels, bs, *_ = _op_args((True, True, True, False, True, False))
    eager = _loss_and_grads(lambda *a: _fused(*a[:4], labels, a[4]), xs, ws, xt, wt, bs)
    torch._dynamo.reset()
    compiled_fn = torch.compile(lambda *a: _fused(*a[:4], labels, a[4]), fullgraph=True)
    compiled = _loss_and_grads(compiled_fn, xs, ws, xt, wt, bs)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


@pytest.mark.parametrize("n,h,v,chunk_size,dtype,teacher_grad", [(256, 64, 4096, 64, torch.float32, True),
                                                                  (512, 256, 8192, None, torch.float32, True),
                                                                  (512, 256, 8192, None, torch.float32, False),
                                                                  (512, 256, 8192, None, torch.float16, True)])
def test_same_bits_with_one_and_two_threads(n, h, v, chunk_size, dtype, teacher_grad):
    """The chunks run in order and the family's op gives the same bits at any thread count; the logits' products
    are made in fixed blocks of the vocabulary, one thread each, and the gradients' by the BLAS, which gives the
    same bits at 1 and 2 threads at these shapes (docs/semantics.md). float16 without oneDNN's kernels for it
    takes the float32 blocks, whose products are shared among the threads in fixed tiles."""
    native = getattr(torch.ops.mkldnn, "_is_mkldnn_fp16_supported", None)
    if dtype == torch.float16 and (native is None or native()):
        pytest.skip("oneDNN has float16 kernels here: the products are not made in float32 blocks")
    gen = torch.Generator().manual_seed(3)
    xs, ws, xt, wt = (torch.randn(*s, generator=gen).to(dtype) for s in ((n, h), (v, h), (n, 2 * h), (v, 2 * h)))
    labels = torch.randint(0, v, (n,), generator=gen)
    labels[::5] = -100
    xs.requires_grad_(), ws.requires_grad_(), xt.requires_grad_(teacher_grad), wt.requires_grad_(teacher_grad)
    threads = torch.get_num_threads()
    results = []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            results.append(_loss_and_grads(lambda *a: npu_loss_ops.fused_linear_jsd_loss(
                *a, labels, weight_hard_loss=0.5, chunk_size=chunk_size), xs, ws, xt, wt))
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_float64_gradients_keep_float64_factors():
    """A grad_output that float32 cannot hold (1/3) scales float64 gradients in float64: the logits form's,
    made from the same logits, to float64's rounding (the stored scales are float32 tensors)."""
    xs, ws, xt, wt, labels, bs, *_ = _op_args((True, True, False, False, True, False))
    xs, ws, bs = (t.detach().double().requires_grad_() for t in (xs, ws, bs))
    xt, wt = xt.double(), wt.double()
    loss = npu_loss_ops.fused_linear_jsd_loss(xs, ws, xt, wt, labels, student_bias=bs, reduction="sum") / 3
    got = torch.autograd.grad(loss, (xs, ws, bs))
    value = npu_loss_ops.generalized_jsd_loss(xs @ ws.T + bs, xt @ wt.T, labels, reduction="sum") / 3
    want = torch.autograd.grad(value, (xs, ws, bs))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13 * float(b.abs().max()))


def test_retain_graph_gives_the_same_gradients_twice():
    xs, ws, xt, wt, labels, bs, *_ = _op_args()
    loss = _fused(xs, ws, xt, wt, labels, bs)
    first = torch.autograd.grad(loss, (xs, ws, wt), retain_graph=True)
    second = torch.autograd.grad(loss, (xs, ws, wt))
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    loss = _fused(xs, ws, xt, wt, labels, bs)
    (loss * 3).backward()  # a grad_output other than 1, scaled in place
    torch.testing.assert_close(ws.grad, 3 * first[1], rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_compiled_autograd(dtype):
    """loss.backward() under compiled autograd captures the linear form's node in its graph (the stored gradients
    and their scales lifted as the graph's inputs, scaled into new tensors) and gives eager's gradients, bit for
    bit, float16's stored scales included."""
    args = _op_args((True, True, True, False, True, False))
    xs, ws, xt, wt, bs = (t.detach().to(dtype) for t in (*args[:4], args[5]))
    labels = args[4]

    def make_loss():
        leaves = [t.clone().requires_grad_() for t in (xs, ws, bs, wt)]
        return _fused(leaves[0], leaves[1], xt, leaves[3], labels, leaves[2]) * 3, leaves

    eager, compiled, captured = backward_eager_and_compiled(make_loss)
    for a, b in zip(eager, compiled):
        assert torch.equal(b, a)
    assert len(captured) == 1 and "NpuLossFusedLinearJsdLoss" in captured[0], captured


def test_double_backward_is_refused():
    xs, ws, xt, wt, labels, bs, *_ = _op_args()
    loss = _fused(xs, ws, xt, wt, labels, bs)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(loss, xs, create_graph=True)


def test_no_grad_makes_no_gradient():
    xs, ws, xt, wt, labels, bs, *_ = _op_args()
    with torch.no_grad():
        loss = _fused(xs, ws, xt, wt, labels, bs)
    assert not loss.requires_grad
    torch.testing.assert_close(loss, _fused(xs, ws, xt, wt, labels, bs).detach(), rtol=0, atol=0)


def _bad(**changes):
    gen = torch.Generator().manual_seed(4)
    args = {"student_input": torch.randn(2, 3, 8, generator=gen), "student_weight": torch.randn(20, 8, generator=gen),
            "teacher_input": torch.randn(2, 3, 6, generator=gen), "teacher_weight": torch.randn(20, 6, generator=gen),
            "labels": torch.tensor([[1, 2, -100], [3, 4, 5]])}
    args.update(changes)
    return args


BAD = [
    (dict(reduction="none"), ValueError, "reduction 'none' is not supported"),
    (dict(reduction="avg"), ValueError, "reduction must be 'batchmean', 'sum' or 'mean', got 'avg'"),
    (dict(beta=1.5), ValueError, r"beta must be in \[0, 1\], got 1.5"),
    (dict(temperature=0.0), ValueError, "temperature must be > 0"),
    (dict(weight_hard_loss=-0.5), ValueError, "weight_hard_loss must be >= 0"),
    (dict(weight_soft_loss=float("nan")), ValueError, "weight_soft_loss must be >= 0"),
    (dict(labels=None, weight_hard_loss=0.5), ValueError, "weight_hard_loss != 0 needs labels"),
    (dict(chunk_size=0), ValueError, "chunk_size must be >= 1"),
    (dict(chunk_size=2.0), TypeError, r"chunk_size must be an integer or None, got 2.0 \(float\)"),
    # Each scalar's type, as its op's schema declares it: no int() or float() on the way.
    (dict(ignore_index=1.5), TypeError, r"fused_linear_jsd_loss: ignore_index must be an integer, got 1.5 \(float\)"),
    (dict(ignore_index="-100"), TypeError, "ignore_index must be an integer, got '-100'"),
    (dict(ignore_index=True), TypeError, "ignore_index must be an integer, got True"),
    (dict(beta="0.5"), TypeError, r"beta must be a real number, got '0.5' \(str\)"),
    (dict(beta=None), TypeError, "beta must be a real number, got None"),
    (dict(beta=torch.tensor(True)), TypeError, "beta must be a real number, got a tensor of shape \\(\\) and dtype torch.bool"),
    (dict(temperature=False), TypeError, "temperature must be a real number, got False"),
    (dict(weight_hard_loss="0.5"), TypeError, "weight_hard_loss must be a real number, got '0.5'"),
    (dict(weight_soft_loss=None), TypeError, "weight_soft_loss must be a real number, got None"),
    (dict(return_soft_hard_loss="no"), TypeError, "return_soft_hard_loss must be a bool, got 'no'"),
    (dict(return_soft_hard_loss=1), TypeError, "return_soft_hard_loss must be a bool, got 1"),
    (dict(reduction=None), TypeError, "reduction must be a str, got None"),
    (dict(student_weight=torch.randn(20, 7)), RuntimeError,
     r"student_weight must be \(vocabulary, 8\), the hidden size of student_input, got shape \[20, 7\]"),
    (dict(teacher_weight=torch.randn(20, 5)), RuntimeError, r"teacher_weight must be \(vocabulary, 6\)"),
    (dict(teacher_weight=torch.randn(21, 6)), RuntimeError, "teacher_weight must have student_weight's vocabulary 20"),
    (dict(student_weight=torch.randn(20, 8, 1)), RuntimeError, "student_weight must be 2-D"),
    (dict(teacher_input=torch.randn(3, 2, 6)), RuntimeError, "teacher_input must have student_input's leading shape"),
    (dict(student_input=torch.randn(()), labels=None), RuntimeError, "student_input must have at least one dimension"),
    (dict(student_weight=torch.randn(20, 8, dtype=torch.float64)), TypeError,
     "student_weight must have student_input's dtype float32, got float64"),
    (dict(student_bias=torch.randn(20, dtype=torch.float64)), TypeError, "student_bias must have student_input's dtype"),
    (dict(teacher_bias=torch.randn(19)), RuntimeError, r"teacher_bias must have the shape \[20\]"),
    (dict(student_input=torch.randint(0, 3, (2, 3, 8)), student_weight=torch.randint(0, 3, (20, 8))), TypeError,
     "student_input must have dtype float32"),
    (dict(labels=torch.ones(2, 3)), TypeError, "labels must have an integer dtype"),
    (dict(labels=torch.tensor([1, 2, 3])), RuntimeError, "labels must have the inputs' leading shape"),
    (dict(labels=torch.tensor([[1, 2, 20], [3, 4, 5]]), weight_hard_loss=0.5), ValueError,
     r"with the hard loss, every kept label must be in \[0, 20\)"),
    (dict(labels=torch.tensor([[1, 2, -1], [3, 4, 5]]), return_soft_hard_loss=True), ValueError,
     r"with the hard loss, every kept label must be in \[0, 20\)"),
    (dict(teacher_weight=torch.randn(20, 6, device="meta")), RuntimeError,
     "expected all tensors on the same device, but teacher_weight is on meta and student_input is on cpu"),
]


@pytest.mark.parametrize("changes,error,match", BAD, ids=[m.split(" ")[0] + str(i) for i, (_, _, m) in enumerate(BAD)])
def test_bad_input(changes, error, match):
    """Each bad argument is named, by the functional and by the module (the module's construction checks aside)."""
    with pytest.raises(error, match=match):
        npu_loss_ops.fused_linear_jsd_loss(**_bad(**changes))


def test_a_kept_label_outside_the_vocabulary_without_the_hard_loss_is_a_row_like_any():
    """As the family: without the cross entropy the loss reads nothing of labels but ignore_index."""
    args = _bad(labels=torch.tensor([[1, 2, 99], [3, 4, 5]]))
    loss = npu_loss_ops.fused_linear_jsd_loss(**args)
    same = npu_loss_ops.fused_linear_jsd_loss(**{**args, "labels": torch.tensor([[1, 2, 0], [3, 4, 5]])})
    assert torch.equal(loss, same)


# The module's arguments: every scalar of BAD (the tensors aside), checked at construction by the function's rules.
MODULE_ARGS = ("beta", "temperature", "ignore_index", "reduction", "weight_hard_loss", "weight_soft_loss",
               "chunk_size")
MODULE_BAD = [(changes, error, match) for changes, error, match in BAD if set(changes) <= set(MODULE_ARGS)]


@pytest.mark.parametrize("changes,error,match", MODULE_BAD,
                         ids=[m.split(" ")[0] + str(i) for i, (_, _, m) in enumerate(MODULE_BAD)])
def test_module_checks_at_construction(changes, error, match):
    with pytest.raises(error, match=match):
        npu_loss_ops.FusedLinearJSDLoss(**changes)


# ---- memory: the process's peak resident size above the inputs, the weights and their gradients ----

MEMORY_PROBE = r"""
import sys, torch, npu_loss_ops
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
n, h, v, dtype, mode = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), getattr(torch, sys.argv[4]), sys.argv[5]
gen = torch.Generator().manual_seed(0)
xs = torch.randn(n, h, generator=gen).to(dtype)
xt = torch.randn(n, 2 * h, generator=gen).to(dtype)
ws = (torch.randn(v, h, generator=gen) / h ** 0.5).to(dtype)
wt = (torch.randn(v, 2 * h, generator=gen) / (2 * h) ** 0.5).to(dtype)
labels = torch.randint(0, v, (n,), generator=gen)
labels[torch.rand(n, generator=gen) < 0.25] = -100
hard = 0.5 if mode == "hard" else 0.0
caps = dict(student_softcap=30.0, teacher_softcap=30.0) if mode == "softcap" else {}
small = [t[:8].clone() for t in (xs, xt)] + [ws[:64].clone(), wt[:64].clone()]
for t in small[::2]:
    t.requires_grad_()
npu_loss_ops.fused_linear_jsd_loss(small[0], small[2], small[1], small[3], labels[:8] % 64,
                                   weight_hard_loss=hard).backward()  # warm up at a small size
grads = [xs, ws] + ([xt, wt] if mode == "teacher" else [])
for t in grads:
    t.requires_grad_()
gradient_bytes = sum(t.numel() * t.element_size() for t in grads)
open("/proc/self/clear_refs", "w").write("5")
before = status("VmRSS:")
npu_loss_ops.fused_linear_jsd_loss(xs, ws, xt, wt, labels, weight_hard_loss=hard, **caps).backward()
assert all(t.grad is not None for t in grads)
peak = (status("VmHWM:") - before - gradient_bytes) / (n * v * xs.element_size())
native = {torch.bfloat16: "_is_mkldnn_bf16_supported", torch.float16: "_is_mkldnn_fp16_supported"}.get(dtype)
print(peak, getattr(torch.ops.mkldnn, native)() if native else True)
"""
# The bound (docs/semantics.md, "The fused linear JSD"), in units of one N x V tensor of the inputs' dtype, above
# the inputs, the weights and their gradients.
FUSED_BOUND = 0.25
# "bfloat16/blocked": with oneDNN held to AVX2 (ONEDNN_MAX_CPU_ISA), as on a CPU without AVX-512, where torch has
# no bfloat16 kernels of its own for the products and the op makes them in float32 blocks (as float16's here).
FUSED_MEMORY_CASES = [(n, 256, v, dtype, mode) for n, v in ((4096, 32768), (1024, 151936))
                      for dtype in ("float32", "bfloat16", "float16", "bfloat16/blocked")
                      for mode in ("student", "hard", "teacher")]
# A softcap keeps a chunk of its slope: the chunk takes fewer rows, within the same bound.
FUSED_MEMORY_CASES += [(4096, 256, 32768, dtype, "softcap") for dtype in ("float32", "bfloat16")]


@pytest.mark.parametrize("n,h,v,dtype,mode", FUSED_MEMORY_CASES,
                         ids=[f"{n}x{h}x{v}-{d}-{m}" for n, h, v, d, m in FUSED_MEMORY_CASES])
def test_memory_bound(n, h, v, dtype, mode):
    """Forward + backward peak at most 0.25 N x V above the inputs, the weights and their gradients: the student's
    ('student'), with the hard loss ('hard'), the teacher's too ('teacher'), and with both sides softcapped
    ('softcap'); with torch's own products and with the float32 blocks."""
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux's /proc/self/clear_refs")
    dtype, _, products = dtype.partition("/")
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    if products == "blocked":
        env["ONEDNN_MAX_CPU_ISA"] = "AVX2"
    result = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(n), str(h), str(v), dtype, mode],
                            capture_output=True, text=True, cwd=package_parent(), env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    peak_text, native = result.stdout.strip().splitlines()[-1].split()
    peak = float(peak_text)
    if products == "blocked" and native == "True":
        pytest.skip("oneDNN kept its bfloat16 kernels under ONEDNN_MAX_CPU_ISA=AVX2")
    print(f"peak {peak:.3f} x N*V, native products: {native}")  # shown with -s
    assert peak <= FUSED_BOUND, f"peak {peak:.3f} x N*V, bound {FUSED_BOUND}"


# ---- the PyTorch features, called as users call them, against the formula with the logits made ----

def _feature_inputs():
    gen = torch.Generator().manual_seed(7)
    xs, ws = torch.randn(6, 4, generator=gen, dtype=torch.float64), torch.randn(9, 4, generator=gen, dtype=torch.float64)
    xt, wt = torch.randn(6, 5, generator=gen, dtype=torch.float64), torch.randn(9, 5, generator=gen, dtype=torch.float64)
    return xs, ws, xt, wt, torch.tensor([1, 2, -100, 3, 4, 0])


def _fused_of(xt, wt, labels):
    return lambda a, b: npu_loss_ops.fused_linear_jsd_loss(a, b, xt, wt, labels, weight_hard_loss=0.5)


def _formula_of(xt, wt, labels):
    return lambda a, b: reference(a, b, xt, wt, labels, weight_hard_loss=0.5)[0]


def test_forward_mode_ad_and_jvp_match_the_formula():
    xs, ws, xt, wt, labels = _feature_inputs()
    tangents = (torch.randn_like(xs), torch.randn_like(ws))
    got = torch.func.jvp(_fused_of(xt, wt, labels), (xs, ws), tangents)
    want = torch.func.jvp(_formula_of(xt, wt, labels), (xs, ws), tangents)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=0)
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level():
        loss = _fused_of(xt, wt, labels)(fwAD.make_dual(xs, tangents[0]), fwAD.make_dual(ws, tangents[1]))
        torch.testing.assert_close(fwAD.unpack_dual(loss).tangent, want[1], rtol=1e-10, atol=0)


def test_vmap_matches_the_formula():
    xs, ws, xt, wt, labels = _feature_inputs()
    batch = torch.stack([xs, xs * 0.5])
    got = torch.vmap(lambda a: _fused_of(xt, wt, labels)(a, ws))(batch)
    want = torch.stack([_formula_of(xt, wt, labels)(a, ws) for a in batch])
    torch.testing.assert_close(got, want, rtol=1e-10, atol=0)


def test_torch_func_grad_is_refused_as_double_backward():
    """torch.func.grad and vjp differentiate with create_graph=True: refused by name, never a wrong answer."""
    xs, ws, xt, wt, labels = _feature_inputs()
    with pytest.raises(RuntimeError, match="fused_linear_jsd_loss: double backward"):
        torch.func.grad(_fused_of(xt, wt, labels))(xs, ws)


def test_export_and_torchscript_call_the_op():
    xs, ws, xt, wt, labels = _feature_inputs()

    # Every tensor an input: torch 2.7's export (strict by default) rejects tensors a module closes over.
    class Loss(torch.nn.Module):
        def forward(self, a, b, c, d, e):
            return ops.fused_linear_jsd_loss(a, b, c, d, e, None, None, "sum")[0]

    args = (xs, ws, xt, wt, labels)
    exported = torch.export.export(Loss(), args)
    assert torch.equal(exported.module()(*args), Loss()(*args))
    scripted = torch.jit.script(_scripted_call)
    assert torch.equal(scripted(xs, ws, xt, wt, labels), npu_loss_ops.fused_linear_jsd_loss(xs, ws, xt, wt, labels))


def _scripted_call(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor,
                   labels: Optional[torch.Tensor]) -> torch.Tensor:  # noqa: UP045  (TorchScript's spelling)
    return torch.ops.npu_loss.fused_linear_jsd_loss(a, b, c, d, labels)[0]
