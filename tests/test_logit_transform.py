"""The logit transform of the distillation family (TRL's DistillationTrainer order: each side's logits times
its scale, then softcapped as c * tanh(x / c), then divided by T): `generalized_jsd_loss`'s four keywords,
against a float64 reference made of torch ops on the transformed logits (TRL 1.16's function restated in
tests/reference.py), values and both gradients, on the CPU kernels of every instruction set (the scale folded
into 1 / T, the softcap through the kernels' tanh), the composite (every call on a device without a path of its
own), gradcheck through the tanh, opcheck, compile, and the rejections."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

import npu_loss_ops
from helpers import results_at_isa
from reference import transformed, trl_generalized_jsd_loss

COMPOSITE = torch._C.DispatchKey.CompositeExplicitAutograd
TRANSFORMS = [  # (student_logit_scale, teacher_logit_scale, student_softcap, teacher_softcap)
    (1.0, 1.0, None, None),
    (0.5, 2.0, None, None),
    (1.0, 1.0, 4.0, None),
    (0.25, 1.5, 3.0, 6.0),
]
TOLERANCE = {torch.float64: (1e-9, 1e-11), torch.float32: (2e-5, 2e-6), torch.bfloat16: (3e-2, 3e-3)}


def _keywords(transform: tuple) -> dict:
    return dict(zip(("student_logit_scale", "teacher_logit_scale", "student_softcap", "teacher_softcap"), transform))


def reference(student, teacher, labels, beta, temperature, reduction, transform, grad_output=None):
    """The value and both gradients in float64, autograd through the transform and TRL's function."""
    s = student.detach().double().requires_grad_()
    t = teacher.detach().double().requires_grad_()
    value = trl_generalized_jsd_loss(transformed(s, transform[0], transform[2]),
                                     transformed(t, transform[1], transform[3]), labels, beta, temperature,
                                     reduction)
    g = torch.ones_like(value) if grad_output is None else grad_output.double()
    gs, gt = torch.autograd.grad(value, (s, t), g)
    return value, gs, gt


def _inputs(dtype: torch.dtype, rows: int = 6, vocab: int = 37, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    student = (torch.randn(rows, vocab, generator=gen) * 4).to(dtype)
    teacher = (torch.randn(rows, vocab, generator=gen) * 4).to(dtype)
    labels = torch.randint(0, vocab, (rows,), generator=gen)
    labels[1] = -100
    return student, teacher, labels


def _close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str, of_max: bool = False) -> None:
    """Within the dtype's tolerance of each element, and of the largest (scaled by rtol instead where `of_max`:
    the products' gradients are sums over rows of rounded logits, where elementwise error means nothing)."""
    rtol, atol = TOLERANCE[dtype]
    scale = float(expected.detach().abs().max()) if expected.numel() else 0.0
    torch.testing.assert_close(actual.double(), expected, rtol=rtol, atol=(rtol if of_max else atol) * max(scale, 1.0),
                               msg=what)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("transform", TRANSFORMS, ids=str)
@pytest.mark.parametrize("beta,temperature", [(0.0, 1.0), (0.3, 2.0), (1.0, 1.0), (0.5, 0.7)])
@pytest.mark.parametrize("reduction", ["batchmean", "sum", "mean", "none"])
def test_values_and_gradients_match_the_reference(dtype, transform, beta, temperature, reduction):
    student, teacher, labels = _inputs(dtype)
    s, t = student.clone().requires_grad_(), teacher.clone().requires_grad_()
    value = npu_loss_ops.generalized_jsd_loss(s, t, labels, beta, temperature, reduction, **_keywords(transform))
    g = torch.rand(value.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    value.backward(g.to(value.dtype))
    want, want_gs, want_gt = reference(student, teacher, labels, beta, temperature, reduction, transform, g)
    label = f"beta={beta} T={temperature} {reduction} {transform}"
    _close(value.detach(), want, dtype, f"value, {label}")
    _close(s.grad, want_gs, dtype, f"student's gradient, {label}")
    _close(t.grad, want_gt, dtype, f"teacher's gradient, {label}")


@pytest.mark.parametrize("transform", TRANSFORMS[1:], ids=str)
def test_the_transform_changes_the_result(transform):
    """A check that could not fail otherwise: the transformed call differs from the plain one."""
    student, teacher, labels = _inputs(torch.float64)
    plain = npu_loss_ops.generalized_jsd_loss(student, teacher, labels)
    other = npu_loss_ops.generalized_jsd_loss(student, teacher, labels, **_keywords(transform))
    assert not torch.allclose(plain, other)


@pytest.mark.parametrize("transform", TRANSFORMS[1:], ids=str)
@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_the_kernel_and_the_composite_agree(transform, reduction):
    """The CPU's kernels and the composite give the same values and gradients within float32's tolerance, op by
    op, for every transform."""
    student, teacher, labels = _inputs(torch.float32, rows=5, vocab=301, seed=3)
    scalars = dict(beta=0.4, temperature=1.5, ignore_index=-100, **_keywords(transform))
    ops = torch.ops.npu_loss
    kernel = ops.generalized_jsd_loss.default(student, teacher, labels, reduction, **scalars)
    composite = ops.generalized_jsd_loss.default._op_dk(COMPOSITE, student, teacher, labels, reduction, **scalars)
    torch.testing.assert_close(kernel, composite, rtol=2e-5, atol=1e-6)
    g = torch.rand(kernel.shape) if reduction == 0 else torch.tensor(0.7)
    calls = [(ops.generalized_jsd_loss_backward.default, (g, student, teacher, labels, reduction))]
    if reduction != 0:
        calls.append((ops._generalized_jsd_loss_and_grads.default, (student, teacher, labels, reduction)))
    for op, args in calls:
        mine = op(*args, **scalars, output_mask=[True, True])
        theirs = op._op_dk(COMPOSITE, *args, **scalars, output_mask=[True, True])
        for a, b in zip(mine, theirs):
            torch.testing.assert_close(a, b, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("transform", TRANSFORMS[1:], ids=str)
def test_gradcheck_through_the_transform(transform):
    student, teacher, labels = _inputs(torch.float64, rows=3, vocab=5, seed=4)
    s, t = student.requires_grad_(), teacher.requires_grad_()

    def loss(a, b):
        return npu_loss_ops.generalized_jsd_loss(a, b, labels, 0.3, 1.7, "sum", **_keywords(transform))

    assert torch.autograd.gradcheck(loss, (s, t))
    assert torch.autograd.gradgradcheck(loss, (s, t))


def test_opcheck_with_the_transform():
    student, teacher, labels = _inputs(torch.float32, rows=4, vocab=11)
    scalars = (0.5, 2.0, 0.5, 1.5, 3.0, None, -100)
    ops = torch.ops.npu_loss
    for reduction in (0, 2):
        torch.library.opcheck(ops.generalized_jsd_loss.default,
                              (student.requires_grad_(), teacher, labels, reduction, *scalars))
    torch.library.opcheck(ops._generalized_jsd_loss_and_grads.default,
                          (student.detach(), teacher, labels, 2, *scalars, [True, True]))


def test_compiled_equals_eager():
    student, teacher, labels = _inputs(torch.float32)
    keywords = _keywords(TRANSFORMS[3])

    def fn(a, b):
        return npu_loss_ops.generalized_jsd_loss(a, b, labels, 0.3, 2.0, **keywords)

    eager = fn(student, teacher)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(student, teacher)
    torch.testing.assert_close(compiled, eager)


def test_the_module_takes_the_transform():
    student, teacher, labels = _inputs(torch.float64)
    module = npu_loss_ops.JSDLoss(beta=0.3, student_logit_scale=0.5, teacher_softcap=2.0)
    assert "student_logit_scale=0.5" in repr(module) and "teacher_softcap=2.0" in repr(module)
    torch.testing.assert_close(
        module(student, teacher, labels),
        npu_loss_ops.generalized_jsd_loss(student, teacher, labels, 0.3, student_logit_scale=0.5, teacher_softcap=2.0))


@pytest.mark.parametrize("name,value,error,message", [
    ("student_logit_scale", 0.0, ValueError, "student_logit_scale must be > 0, got 0"),
    ("teacher_logit_scale", -1.0, ValueError, "teacher_logit_scale must be > 0, got -1"),
    ("teacher_logit_scale", math.nan, ValueError, "teacher_logit_scale must be > 0, got nan"),
    ("student_softcap", 0.0, ValueError, "student_softcap must be > 0, got 0"),
    ("teacher_softcap", -2.0, ValueError, "teacher_softcap must be > 0, got -2"),
    ("student_logit_scale", "2", TypeError, "student_logit_scale must be a real number, got '2'"),
    ("student_logit_scale", None, TypeError, "student_logit_scale must be a real number, got None"),
    ("student_softcap", True, TypeError, "student_softcap must be a real number or None, got True"),
])
def test_rejections_name_the_argument(name, value, error, message):
    student, teacher, labels = _inputs(torch.float32)
    with pytest.raises(error, match=f"generalized_jsd_loss: {message}"):
        npu_loss_ops.generalized_jsd_loss(student, teacher, labels, **{name: value})
    with pytest.raises(error, match=message):
        npu_loss_ops.JSDLoss(**{name: value})


def linear_reference(xs, ws, bs, xt, wt, labels, beta, temperature, reduction, weight_hard, transform):
    """The fused linear JSD's float64 formula with the logits made: the soft loss on both sides' transformed
    logits, the cross entropy on the student's transformed logits, untempered (Liger's divisors)."""
    zs = transformed(xs @ ws.T + bs, transform[0], transform[2])
    zt = transformed(xt @ wt.T, transform[1], transform[3])
    soft = trl_generalized_jsd_loss(zs, zt, labels, beta, temperature, reduction)
    ce = torch.nn.functional.cross_entropy(zs, labels, reduction="sum")
    hard = ce if reduction == "sum" else ce / (labels != -100).sum().clamp(min=1)
    return soft + weight_hard * hard


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("transform", TRANSFORMS, ids=str)
@pytest.mark.parametrize("reduction,weight_hard,chunk_size,teacher_grad", [
    ("batchmean", 0.0, None, False), ("sum", 0.5, 3, False), ("mean", 0.5, None, True), ("batchmean", 1.0, 2, True)])
def test_the_linear_form_transforms_each_chunk(dtype, transform, reduction, weight_hard, chunk_size, teacher_grad):
    gen = torch.Generator().manual_seed(7)
    n, hs, ht, v = 9, 12, 20, 53
    xs, xt = torch.randn(n, hs, generator=gen, dtype=torch.float64), torch.randn(n, ht, generator=gen, dtype=torch.float64)
    ws = torch.randn(v, hs, generator=gen, dtype=torch.float64) / hs ** 0.5 * 3
    wt = torch.randn(v, ht, generator=gen, dtype=torch.float64) / ht ** 0.5 * 3
    bs = torch.randn(v, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, v, (n,), generator=gen)
    labels[[2, 5]] = -100
    ours = [t.to(dtype).requires_grad_(i < 3 or teacher_grad) for i, t in enumerate((xs, ws, bs, xt, wt))]
    loss = npu_loss_ops.fused_linear_jsd_loss(
        ours[0], ours[1], ours[3], ours[4], labels, student_bias=ours[2], beta=0.3, temperature=1.5,
        reduction=reduction, weight_hard_loss=weight_hard, chunk_size=chunk_size, **_keywords(transform))
    loss.backward()
    # The reference on the inputs as ours saw them (rounded to the dtype), in float64.
    exact = [t.detach().double().requires_grad_() for t in ours]
    want = linear_reference(exact[0], exact[1], exact[2], exact[3], exact[4], labels, 0.3, 1.5, reduction,
                            weight_hard, transform)
    want.backward()
    label = f"{reduction} hard={weight_hard} chunk={chunk_size} {transform}"
    _close(loss.detach(), want.detach(), dtype, f"loss, {label}")
    for name, mine, theirs in zip(("xs", "ws", "bs", "xt", "wt"), ours, exact):
        if mine.requires_grad:
            _close(mine.grad, theirs.grad, dtype, f"{name}'s gradient, {label}", of_max=True)


def test_every_combination_of_sides_is_distinct():
    """Each side's scale and softcap reach that side only: swapping them changes the result."""
    student, teacher, labels = _inputs(torch.float64)
    results = [npu_loss_ops.generalized_jsd_loss(student, teacher, labels, 0.3, **_keywords(t))
               for t in itertools.permutations((0.5, 1.0))]
    assert not torch.allclose(results[0], results[1])


@pytest.mark.parametrize("transform", TRANSFORMS[1:], ids=str)
def test_on_the_device_as_on_the_cpu(transform, device):
    """Every device runs the transform (the NPU through its aclnn path where its chip's rows allow it, else the
    composite: docs/npu_paths.md): its values and gradients equal the CPU's within float32's tolerance."""
    student, teacher, labels = _inputs(torch.float32, rows=4, vocab=129, seed=5)
    results = []
    for dev in ("cpu", device):
        s = student.detach().to(dev).requires_grad_()
        t = teacher.detach().to(dev).requires_grad_()
        value = npu_loss_ops.generalized_jsd_loss(s, t, labels.to(dev), 0.3, 2.0, **_keywords(transform))
        value.backward()
        results.append([x.detach().cpu() for x in (value, s.grad, t.grad)])
    for a, b in zip(*results):
        torch.testing.assert_close(b, a, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("transform", TRANSFORMS[1:], ids=str)
def test_the_linear_form_on_the_device_as_on_the_cpu(transform, device):
    """The linear form's chunks are transformed by the CPU's step in its passes, and by the driver on every other
    device (the NPU's step then runs its aclnn path untransformed): values and gradients equal the CPU's within
    float32's tolerance."""
    gen = torch.Generator().manual_seed(9)
    tensors = [torch.randn(7, 16, generator=gen), torch.randn(61, 16, generator=gen) / 2,
               torch.randn(7, 24, generator=gen), torch.randn(61, 24, generator=gen) / 2]
    labels = torch.randint(0, 61, (7,), generator=gen)
    labels[3] = -100
    results = []
    for dev in ("cpu", device):
        xs, ws, xt, wt = (t.detach().to(dev).requires_grad_(i < 2) for i, t in enumerate(tensors))
        loss = npu_loss_ops.fused_linear_jsd_loss(xs, ws, xt, wt, labels.to(dev), beta=0.3, temperature=2.0,
                                                  weight_hard_loss=0.5, chunk_size=3, **_keywords(transform))
        loss.backward()
        results.append([x.detach().cpu() for x in (loss, xs.grad, ws.grad)])
    for a, b in zip(*results):
        torch.testing.assert_close(b, a, rtol=2e-5, atol=2e-6)


# The row kernels' forms, each with a softcap: bfloat16 and float16 direct (float16's row scales), rows of
# several blocks with a tail, strided rows and mixed dtypes (the converted form; float64 on the baseline's
# double lanes), 'none' with weights. (shape, dtypes, transform, beta, T, reduction, labels, strided)
ISA_CASES = [
    ((3, 4101), (torch.bfloat16, torch.bfloat16), (0.5, 2.0, 3.0, 6.0), 0.5, 2.0, "batchmean", True, False),
    ((3, 4101), (torch.float16, torch.float16), (1.0, 1.0, 4.0, None), 0.9, 0.5, "sum", True, False),
    ((2, 3, 257), (torch.float64, torch.float32), (1.0, 1.5, None, 5.0), 0.1, 1.0, "batchmean", True, True),
    ((2, 3, 257), (torch.float32, torch.float32), (0.25, 1.5, 3.0, 6.0), 1.0, 1.0, "mean", False, True),
    ((2, 32001), (torch.float32, torch.float32), (2.0, 1.0, 30.0, None), 0.0, 1.0, "none", False, False),
]


def _isa_inputs(case):
    shape, dtypes, _, _, _, _, with_labels, strided = case
    gen = torch.Generator().manual_seed(11)
    wide = (*shape[:-1], shape[-1] + 3) if strided else shape
    student = (torch.randn(wide, generator=gen, dtype=torch.float64) * 6).to(dtypes[0])[..., :shape[-1]]
    teacher = (torch.randn(wide, generator=gen, dtype=torch.float64) * 6).to(dtypes[1])[..., :shape[-1]]
    labels = None
    if with_labels:
        labels = torch.randint(0, shape[-1], shape[:-1], generator=gen)
        labels.view(-1)[1] = -100
    return student, teacher, labels


ISA_SCRIPT = r"""
import sys, torch
sys.path.insert(0, sys.argv[2])
import npu_loss_ops, test_logit_transform as tl
results = []
for case in tl.ISA_CASES:
    student, teacher, labels = tl._isa_inputs(case)
    a, b = student.clone().requires_grad_(), teacher.clone().requires_grad_()
    value = npu_loss_ops.generalized_jsd_loss(a, b, labels, case[3], case[4], case[5], **tl._keywords(case[2]))
    g = torch.rand(value.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    value.backward(g.to(value.dtype))
    results.append((value.detach(), a.grad, b.grad))
torch.save({"isa": npu_loss_ops.build_info()["cpu_isa"], "results": results}, sys.argv[1])
"""


@pytest.mark.parametrize("isa", npu_loss_ops.build_info()["cpu_isas_available"])
def test_the_softcap_in_the_kernels_of_every_instruction_set(isa, tmp_path):
    """The row kernels of every instruction set this CPU runs (AVX-512, AVX2, the baseline: the one aarch64
    runs) against the float64 reference, values and both gradients, in each of the kernels' forms."""
    results = results_at_isa(ISA_SCRIPT, isa, str(tmp_path))
    assert len(results) == len(ISA_CASES)
    # float16 runs only here (its row scales): about 4 of its epsilons (9.8e-4), as bfloat16's 3e-2 is about 4 of
    # its own (7.8e-3).
    tolerance = {**TOLERANCE, torch.float16: (4e-3, 4e-4)}
    for case, (value, gs, gt) in zip(ISA_CASES, results):
        student, teacher, labels = _isa_inputs(case)
        g = torch.rand(value.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
        want = reference(student, teacher, labels, case[3], case[4], case[5], case[2], g)
        for what, mine, theirs, dtype in (("value", value, want[0], torch.promote_types(*case[1])),
                                          ("student's gradient", gs, want[1], case[1][0]),
                                          ("teacher's gradient", gt, want[2], case[1][1])):
            rtol, atol = tolerance[dtype]
            scale = max(float(theirs.detach().abs().max()), 1.0)
            torch.testing.assert_close(mine.double(), theirs, rtol=rtol, atol=atol * scale,
                                       msg=f"{isa} {case[:2]} {case[2]}: {what}")


@pytest.mark.parametrize("reduction", [0, 2])
@pytest.mark.parametrize("special", [math.inf, math.nan])
def test_the_softcap_in_the_kernels_keeps_nan_and_inf_as_the_composite(reduction, special):
    """Logits of +-inf and NaN through the kernels' tanh (+-inf to +-c: finite; NaN to NaN) as through the
    composite's, values and both gradients."""
    student, teacher, labels = _inputs(torch.float32, rows=4, vocab=70, seed=6)
    student[0, 3], student[2, 5], teacher[3, 7] = special, -special, special
    scalars = dict(beta=0.4, temperature=1.5, ignore_index=-100, student_logit_scale=0.5, student_softcap=3.0,
                   teacher_logit_scale=1.0, teacher_softcap=2.0)
    ops = torch.ops.npu_loss
    args = (student, teacher, labels, reduction)
    kernel = ops.generalized_jsd_loss.default(*args, **scalars)
    composite = ops.generalized_jsd_loss.default._op_dk(COMPOSITE, *args, **scalars)
    torch.testing.assert_close(kernel, composite, rtol=2e-5, atol=1e-6, equal_nan=True)
    assert kernel.isnan().any() == math.isnan(special)
    g = torch.ones_like(kernel)
    mine = ops.generalized_jsd_loss_backward.default(g, *args, **scalars, output_mask=[True, True])
    theirs = ops.generalized_jsd_loss_backward.default._op_dk(COMPOSITE, g, *args, **scalars, output_mask=[True, True])
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=1e-6, equal_nan=True)
