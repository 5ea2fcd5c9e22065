"""The student's entropy (`return_entropy=True`) of both forms of the generalized JSD: per row, -sum(p * log p) of
p = softmax(transformed student logits / T) (TRL's log Z - sum(p * z)), float32 of the rows' leading shape, 0 on
dropped rows, with no gradient, against a float64 reference made of torch ops; the loss and the gradients of a
call that asks for it are those of the call that does not, bit for bit; compile, opcheck and the rejections."""
from __future__ import annotations

import pytest
import torch

import npu_loss_ops
from reference import student_entropy as reference_entropy

TRANSFORMS = [  # (student_logit_scale, student_softcap)
    (1.0, None),
    (0.5, None),
    (1.0, 4.0),
    (2.0, 3.0),
]
# The entropy is float32 whatever the logits' dtype; float64 logits are computed in float64 and rounded once.
TOLERANCE = {torch.float64: (1e-6, 1e-6), torch.float32: (2e-5, 2e-5), torch.bfloat16: (2e-5, 2e-5),
             torch.float16: (2e-5, 2e-5)}


def _check(actual: torch.Tensor, expected: torch.Tensor, logits_dtype: torch.dtype, what: str) -> None:
    assert actual.dtype == torch.float32, what
    assert not actual.requires_grad, what
    assert actual.shape == expected.shape, what
    rtol, atol = TOLERANCE[logits_dtype]
    torch.testing.assert_close(actual.double(), expected, rtol=rtol, atol=atol, msg=what)


def _logits(shape, dtype, seed=0, spread=4.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * spread).to(dtype)


# ---- from logits ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("transform", TRANSFORMS, ids=str)
@pytest.mark.parametrize("temperature", [1.0, 2.0])
@pytest.mark.parametrize("reduction", ["batchmean", "sum", "mean", "none"])
def test_logits_form_entropy_matches_the_reference(dtype, transform, temperature, reduction):
    scale, softcap = transform
    student, teacher = _logits((2, 5, 41), dtype), _logits((2, 5, 41), dtype, seed=1)
    labels = torch.randint(0, 41, (2, 5), generator=torch.Generator().manual_seed(2))
    labels[0, 1] = labels[1, 4] = -100
    kw = dict(student_logit_scale=scale, student_softcap=softcap, teacher_logit_scale=1.5)
    s = student.clone().requires_grad_()
    loss, entropy = npu_loss_ops.generalized_jsd_loss(s, teacher, labels, 0.3, temperature, reduction,
                                                      **kw, return_entropy=True)
    _check(entropy, reference_entropy(student, labels, temperature, scale, softcap), dtype,
           f"{dtype} {transform} T={temperature}")
    assert entropy[0, 1] == 0 and entropy[1, 4] == 0
    # The loss and its gradient are the call's without the entropy, bit for bit.
    plain_s = student.clone().requires_grad_()
    plain = npu_loss_ops.generalized_jsd_loss(plain_s, teacher, labels, 0.3, temperature, reduction, **kw)
    assert torch.equal(loss.detach(), plain.detach())
    g = torch.ones_like(loss)
    loss.backward(g)
    plain.backward(g)
    assert torch.equal(s.grad, plain_s.grad)


def test_logits_form_entropy_without_labels_and_in_chunks(monkeypatch):
    """Every row kept without labels; and the chunked pass (rows split to bound its temporaries) gives the whole
    pass's values."""
    student, teacher = _logits((7, 3, 53), torch.float32), _logits((7, 3, 53), torch.float32, seed=1)
    _, whole = npu_loss_ops.generalized_jsd_loss(student, teacher, return_entropy=True)
    _check(whole, reference_entropy(student, None, 1.0, 1.0, None), torch.float32, "no labels")
    monkeypatch.setattr(npu_loss_ops.functional, "_ENTROPY_CHUNK_ELEMENTS", 2 * 53)
    _, chunked = npu_loss_ops.generalized_jsd_loss(student, teacher, return_entropy=True)
    assert torch.equal(whole, chunked)


def test_entropy_of_minus_infinity_logits_is_finite():
    """A logit of -inf (a masked vocabulary entry) has p = 0 and adds nothing (0 * -inf is not NaN here)."""
    student = _logits((3, 17), torch.float32)
    student[:, :5] = float("-inf")
    teacher = _logits((3, 17), torch.float32, seed=1)
    _, entropy = npu_loss_ops.generalized_jsd_loss(student, teacher, return_entropy=True)
    _check(entropy, reference_entropy(student[:, 5:], None, 1.0, 1.0, None), torch.float32, "-inf logits")
    x, w = _logits((3, 8), torch.float32), _logits((17, 8), torch.float32, seed=3)
    bias = torch.zeros(17)
    bias[:5] = float("-inf")
    _, entropy = npu_loss_ops.fused_linear_jsd_loss(x, w, x, w, student_bias=bias, teacher_bias=torch.zeros(17),
                                                    beta=1.0, return_entropy=True)
    _check(entropy, reference_entropy((x @ w.T + bias)[:, 5:], None, 1.0, 1.0, None), torch.float32,
           "-inf bias, fused")


def test_a_nan_row_has_a_nan_entropy():
    """A NaN logit makes its row's entropy NaN (not 0), on both forms; the other rows keep theirs."""
    student, teacher = _logits((3, 17), torch.float32), _logits((3, 17), torch.float32, seed=1)
    student[1, 4] = float("nan")
    _, entropy = npu_loss_ops.generalized_jsd_loss(student, teacher, return_entropy=True)
    assert entropy[1].isnan() and not entropy[[0, 2]].isnan().any()
    x, w = _logits((3, 8), torch.float32), _logits((17, 8), torch.float32, seed=3)
    x[1, 2] = float("nan")
    for chunk_size in (None, 1):
        _, entropy = npu_loss_ops.fused_linear_jsd_loss(x, w, x, w, chunk_size=chunk_size, return_entropy=True)
        assert entropy[1].isnan() and not entropy[[0, 2]].isnan().any()
    args = (x, w, x, w, None, None, None, "sum", 0.5, 1.0, 1.0, 1.0, None, None, -100, 0.0, 1.0, 1, False, True)
    composite = torch.ops.npu_loss.fused_linear_jsd_loss.default.redispatch(
        torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd), *args)[3]
    assert composite[1].isnan() and not composite[[0, 2]].isnan().any()


# ---- from hidden states --------------------------------------------------------------------------------------


def _linear_inputs(dtype, rows=(3, 4), hs=16, ht=24, vocab=45, seed=0):
    gen = torch.Generator().manual_seed(seed)
    xs = (torch.randn(*rows, hs, generator=gen) / 2).to(dtype)
    ws = torch.randn(vocab, hs, generator=gen).to(dtype)
    xt = (torch.randn(*rows, ht, generator=gen) / 2).to(dtype)
    wt = torch.randn(vocab, ht, generator=gen).to(dtype)
    bs = torch.randn(vocab, generator=gen).to(dtype)
    bt = torch.randn(vocab, generator=gen).to(dtype)
    labels = torch.randint(0, vocab, rows, generator=gen)
    labels.view(-1)[[1, labels.numel() - 1]] = -100
    return xs, ws, xt, wt, bs, bt, labels


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("transform", TRANSFORMS, ids=str)
@pytest.mark.parametrize("temperature", [1.0, 2.0])
@pytest.mark.parametrize("chunk_size", [None, 5])
@pytest.mark.parametrize("teacher_grad", [False, True])
def test_fused_form_entropy_matches_the_reference(dtype, transform, temperature, chunk_size, teacher_grad):
    """Of the logits each chunk makes (the CPU kernel's own passes; chunked, in halves where the teacher gets no
    gradient), against the reference on the logits made whole in float64 from the same inputs."""
    scale, softcap = transform
    xs, ws, xt, wt, bs, bt, labels = _linear_inputs(dtype)
    kw = dict(student_bias=bs, teacher_bias=bt, beta=0.5, temperature=temperature, chunk_size=chunk_size,
              student_logit_scale=scale, student_softcap=softcap, weight_hard_loss=0.25)

    def run(return_entropy):
        leaves = [t.clone().requires_grad_() for t in (xs, ws, xt, wt)]
        if not teacher_grad:
            leaves[2].requires_grad_(False)
            leaves[3].requires_grad_(False)
        result = npu_loss_ops.fused_linear_jsd_loss(*leaves, labels, **kw, return_entropy=return_entropy)
        loss = result[0] if return_entropy else result
        loss.backward()
        return result, [leaf.grad for leaf in leaves]

    (loss, entropy), grads = run(True)
    logits = xs.double() @ ws.double().T + bs.double()
    # The kernel reads the logits in the inputs' dtype: the reference reads them rounded the same way.
    # ... and, in bfloat16, transforms them in bfloat16 (each chunk's logits in place): a bfloat16 rounding of
    # the transformed logits, so there the tolerance is bfloat16's.
    expected = reference_entropy(logits.to(dtype), labels, temperature, scale, softcap)
    what = f"{dtype} {transform} T={temperature} chunk={chunk_size}"
    if dtype == torch.bfloat16 and transform != (1.0, None):
        torch.testing.assert_close(entropy.double(), expected, rtol=1e-2, atol=1e-2, msg=what)
    else:
        _check(entropy, expected, dtype, what)
    assert entropy.shape == labels.shape
    plain, plain_grads = run(False)
    assert torch.equal(loss.detach(), plain.detach())
    for a, b in zip(grads, plain_grads):
        assert (a is None and b is None) or torch.equal(a, b)


def test_fused_form_entropy_with_the_parts_and_without_labels():
    xs, ws, xt, wt, bs, bt, labels = _linear_inputs(torch.float32, rows=(6,))
    loss, soft, hard, entropy = npu_loss_ops.fused_linear_jsd_loss(
        xs, ws, xt, wt, labels, weight_hard_loss=0.5, return_soft_hard_loss=True, return_entropy=True)
    loss2, soft2, hard2 = npu_loss_ops.fused_linear_jsd_loss(xs, ws, xt, wt, labels, weight_hard_loss=0.5,
                                                             return_soft_hard_loss=True)
    assert torch.equal(loss, loss2) and torch.equal(soft, soft2) and torch.equal(hard, hard2)
    _check(entropy, reference_entropy(xs @ ws.T, labels, 1.0, 1.0, None), torch.float32, "parts")
    _, entropy = npu_loss_ops.fused_linear_jsd_loss(xs, ws, xt, wt, return_entropy=True)
    _check(entropy, reference_entropy(xs @ ws.T, None, 1.0, 1.0, None), torch.float32, "no labels")


def test_fused_form_entropy_composite_matches_the_kernel():
    """The composite's chunks (every device but the CPU) make it with torch ops: the CPU kernel's values within
    float32's rounding."""
    from torch._C import DispatchKey

    xs, ws, xt, wt, bs, bt, labels = _linear_inputs(torch.float32)
    args = (xs, ws, xt, wt, labels, bs, bt, "sum", 0.3, 1.5, 0.5, 1.0, 4.0, None, -100, 0.0, 1.0, 4, False, True)
    kernel = torch.ops.npu_loss.fused_linear_jsd_loss(*args)
    composite = torch.ops.npu_loss.fused_linear_jsd_loss.default.redispatch(
        torch._C.DispatchKeySet(DispatchKey.CompositeExplicitAutograd), *args)
    torch.testing.assert_close(composite[3], kernel[3], rtol=2e-6, atol=2e-6)
    assert torch.equal(composite[3][labels == -100], torch.zeros(2))


def test_module_returns_the_entropy():
    xs, ws, xt, wt, bs, bt, labels = _linear_inputs(torch.float32)
    module = npu_loss_ops.FusedLinearJSDLoss(return_entropy=True)
    assert "return_entropy=True" in repr(module)
    loss, entropy = module(xs, ws, xt, wt, labels)
    _check(entropy, reference_entropy(xs @ ws.T, labels, 1.0, 1.0, None), torch.float32, "module")
    student, teacher = _logits((4, 9), torch.float32), _logits((4, 9), torch.float32, seed=1)
    loss, entropy = npu_loss_ops.JSDLoss(return_entropy=True)(student, teacher)
    _check(entropy, reference_entropy(student, None, 1.0, 1.0, None), torch.float32, "JSDLoss")


@pytest.mark.parametrize("fused", [False, True])
def test_compiled_matches_eager(fused):
    torch._dynamo.reset()
    if fused:
        xs, ws, xt, wt, bs, bt, labels = _linear_inputs(torch.float32)

        def fn(xs, ws, xt, wt, labels):
            return npu_loss_ops.fused_linear_jsd_loss(xs, ws, xt, wt, labels, student_softcap=3.0,
                                                      return_entropy=True)
        args = (xs, ws, xt, wt, labels)
    else:
        student, teacher = _logits((4, 19), torch.float32), _logits((4, 19), torch.float32, seed=1)
        labels = torch.tensor([1, -100, 2, 3])

        def fn(s, t, labels):
            return npu_loss_ops.generalized_jsd_loss(s, t, labels, student_softcap=3.0, return_entropy=True)
        args = (student, teacher, labels)
    eager = fn(*args)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(*args)
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_opcheck_with_the_entropy():
    xs, ws, xt, wt, bs, bt, labels = _linear_inputs(torch.float64, rows=(5,))
    args = (xs.requires_grad_(), ws.requires_grad_(), xt, wt, labels, bs, bt, "batchmean", 0.5, 1.0, 1.0, 1.0, 2.0,
            None, -100, 0.0, 1.0, 2, False, True)
    torch.library.opcheck(torch.ops.npu_loss.fused_linear_jsd_loss.default, args,
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


def test_return_entropy_must_be_a_bool():
    student, teacher = _logits((2, 5), torch.float32), _logits((2, 5), torch.float32, seed=1)
    with pytest.raises(TypeError, match="generalized_jsd_loss: return_entropy must be a bool"):
        npu_loss_ops.generalized_jsd_loss(student, teacher, return_entropy=1)
    xs, ws, xt, wt, *_ = _linear_inputs(torch.float32, rows=(2,))
    with pytest.raises(TypeError, match="fused_linear_jsd_loss: return_entropy must be a bool"):
        npu_loss_ops.fused_linear_jsd_loss(xs, ws, xt, wt, return_entropy="yes")
    with pytest.raises(TypeError, match="return_entropy must be a bool"):
        npu_loss_ops.FusedLinearJSDLoss(return_entropy=None)


@pytest.mark.parametrize("fused", [False, True])
def test_on_the_device_as_on_the_cpu(fused, device):
    """Every device makes the entropy (the NPU: torch ops on each chunk, the logits form's pass), within
    float32's tolerance of the CPU's; the loss and the gradients stay the device's own."""
    results = []
    if fused:
        xs, ws, xt, wt, bs, bt, labels = _linear_inputs(torch.float32)
        for dev in ("cpu", device):
            a, b, c, d = (t.detach().to(dev).requires_grad_(i < 2) for i, t in enumerate((xs, ws, xt, wt)))
            loss, entropy = npu_loss_ops.fused_linear_jsd_loss(a, b, c, d, labels.to(dev), beta=0.3,
                                                               temperature=2.0, chunk_size=5, student_softcap=3.0,
                                                               return_entropy=True)
            loss.backward()
            results.append([x.detach().cpu() for x in (loss, entropy, a.grad)])
    else:
        student, teacher = _logits((2, 5, 41), torch.float32), _logits((2, 5, 41), torch.float32, seed=1)
        labels = torch.tensor([[1, -100, 2, 3, 4], [5, 6, 7, 8, -100]])
        for dev in ("cpu", device):
            s = student.detach().to(dev).requires_grad_()
            loss, entropy = npu_loss_ops.generalized_jsd_loss(s, teacher.to(dev), labels.to(dev), 0.3, 2.0,
                                                              student_logit_scale=0.5, return_entropy=True)
            loss.backward()
            results.append([x.detach().cpu() for x in (loss, entropy, s.grad)])
    assert results[1][1].dtype == torch.float32 and results[1][1].shape == results[0][1].shape
    for a, b in zip(*results):
        torch.testing.assert_close(b, a, rtol=2e-5, atol=2e-6)
