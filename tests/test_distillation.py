"""The distillation family: npu_loss_ops.generalized_jsd_loss (TRL 1.16's GKDTrainer.generalized_jsd_loss, to
the letter, plus the keyword ignore_index), JSDLoss, and the three ops under them.

Values and gradients (the student's and the teacher's) against a float64 restatement of TRL's function
(reference.trl_generalized_jsd_loss) on the very inputs the op saw, within each dtype's tolerance of every
element's error scale (reference.jsd_magnitudes); TRL itself where it is installed. Then gradcheck and
gradgradcheck, opcheck, torch.compile and torch.export against eager, every torch.func transform, the same bits
with 1 and 2 threads, retain_graph, every bad input (real, fake and meta tensors), the memory bounds (in fresh
processes), DTensor on two gloo processes. The tests that take `device` also run on the emulated NPU."""
from __future__ import annotations

import inspect
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch

import npu_loss_ops
from helpers import backward_eager_and_compiled, package_parent, results_at_isa
from reference import RTOL, assert_close, assert_close_on_device, jsd_magnitudes, trl_generalized_jsd_loss

# The ops this file exercises (tests/test_registration.py checks that every registered op is some test's).
OPS = ("generalized_jsd_loss", "generalized_jsd_loss_backward", "_generalized_jsd_loss_and_grads")

BETAS = (0.0, 1e-6, 0.1, 0.5, 0.9, 1 - 1e-6, 1.0)
TEMPERATURES = (0.5, 1.0, 2.0)
REDUCTIONS = ("batchmean", "sum", "mean", "none")
ops = torch.ops.npu_loss


@dataclass(frozen=True)
class Case:
    shape: tuple[int, ...]  # the logits' shape as the loss sees it (after the slice, if any)
    beta: float = 0.5
    temperature: float = 1.0
    reduction: str = "batchmean"
    labels: str = "some"  # "none" (no labels), "some" ignored, "all" ignored
    layout: str = "contiguous"  # or "slice": logits[:, :-1] of a (B, T + 1, V) tensor, as GKD passes them
    dtypes: tuple[torch.dtype, torch.dtype] = (torch.float32, torch.float32)  # student's, teacher's
    num_items: str | None = None  # "int", "float", "tensor"

    @property
    def id(self) -> str:
        names = {torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16", torch.float16: "f16"}
        dtypes = "-".join(names[d] for d in self.dtypes)
        extra = f"-n{self.num_items}" if self.num_items else ""
        return (f"{'x'.join(map(str, self.shape))}-{self.layout}-{dtypes}-b{self.beta:g}-T{self.temperature:g}-"
                f"{self.reduction}-labels_{self.labels}{extra}")


def _matrix() -> list[Case]:
    cases = []
    # Every beta at every temperature and reduction.
    cases += [Case((6, 7), b, t, r) for b in BETAS for t in TEMPERATURES for r in REDUCTIONS]
    # Labels, shapes and layouts.
    cases += [Case(shape, reduction=r, labels=lab, layout=layout)
              for shape, layout in (((5, 1000), "contiguous"), ((2, 3, 1000), "contiguous"), ((2, 3, 1000), "slice"))
              for lab in ("none", "some", "all") for r in REDUCTIONS]
    # A vocabulary of 32,001 (odd, beyond every vector width).
    cases += [Case((3, 32001), b, 2.0, r) for b in (0.0, 0.5, 1.0) for r in ("batchmean", "none")]
    # Dtypes, one and mixed (a bfloat16 teacher with a float32 student, TRL's case).
    dtypes = [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16), (torch.float64, torch.float64),
              (torch.float32, torch.bfloat16), (torch.float16, torch.float32), (torch.float64, torch.float32)]
    cases += [Case((2, 3, 257), b, 1.0, r, layout="slice", dtypes=d) for d in dtypes for b in (0.0, 0.5, 1.0)
              for r in ("batchmean", "none")]
    # num_items_in_batch, with GKD's own call's reduction ('batchmean') among them.
    cases += [Case((4, 33), 0.5, 1.0, r, num_items=n) for n in ("int", "float", "tensor")
              for r in ("batchmean", "sum", "none")]
    return cases


CASES = _matrix()
# What the emulated NPU runs (each call there is a dozen aclnn launches per chunk): every form of the loss,
# every reduction, labels or not, a slice, and the half dtypes.
DEVICE_CASES = ([Case((2, 3, 33), b, 2.0, r, lab, "slice") for b in (0.0, 0.5, 1.0) for r in REDUCTIONS
                 for lab in ("none", "some")]
                + [Case((2, 3, 33), 0.5, 1.0, r, "some", "slice", d) for r in ("batchmean", "none")
                   for d in ((torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32))])


def _inputs(case: Case, seed: int = 0):
    """The case's logits (views as the case's layout says) and labels, made from a seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    full = case.shape if case.layout == "contiguous" else (case.shape[0], case.shape[1] + 1, case.shape[2])
    student = (torch.randn(full, generator=gen) * 3).to(case.dtypes[0])
    teacher = (torch.randn(full, generator=gen) * 3).to(case.dtypes[1])
    labels = torch.randint(0, case.shape[-1], full[:-1], generator=gen)
    if case.labels == "some":
        labels[torch.rand(full[:-1], generator=gen) < 0.3] = -100
        labels.view(-1)[0] = -100
    elif case.labels == "all":
        labels.fill_(-100)
    if case.layout == "slice":
        student, teacher, labels = student[:, :-1], teacher[:, :-1], labels[:, :-1]
    return student, teacher, (None if case.labels == "none" else labels)


def _num_items(case: Case):
    return {None: None, "int": 7, "float": 6.5, "tensor": torch.tensor(5)}[case.num_items]


def _kwargs(case: Case) -> dict:
    return dict(beta=case.beta, temperature=case.temperature, reduction=case.reduction,
                num_items_in_batch=_num_items(case))


def _reference(case: Case, student, teacher, labels, grad_output=None):
    """The float64 reference of the value and both gradients (for `grad_output`, ones by default), and their
    error scales: ((value, gs, gt), (value's, gs's, gt's))."""
    s = student.detach().double().requires_grad_()
    t = teacher.detach().double().requires_grad_()
    value = trl_generalized_jsd_loss(s, t, labels, **_kwargs(case))
    g = torch.ones_like(value) if grad_output is None else grad_output.double()
    gs, gt = torch.autograd.grad(value, (s, t), g)
    mv, ms, mt = jsd_magnitudes(student, teacher, labels, case.beta, case.temperature)
    # Each element's weight in the result: the reduction's divisor, or grad_output's element ('none').
    if case.num_items is not None or case.reduction != "none":
        if case.num_items is not None:
            divisor = float(_num_items(case))
        elif case.reduction == "batchmean":
            divisor = max(int((labels != -100).sum()), 1) if labels is not None else max(student.shape[0], 1)
        elif case.reduction == "mean":
            divisor = max(int((labels != -100).sum()) if labels is not None else student[..., 0].numel(), 1) * student.shape[-1]
        else:
            divisor = 1.0
        weight = g.abs() / divisor
        mag_value = mv.sum() / divisor
    else:
        weight = torch.zeros(mv.shape, dtype=torch.float64)
        if labels is not None:
            weight[labels != -100] = g.abs()
        else:
            weight = g.abs()
        mag_value = mv[labels != -100] if labels is not None else mv
    if case.num_items is not None and case.reduction == "none":
        mag_value = mv.sum() / divisor
    wmax = weight.amax(-1, keepdim=True) if weight.dim() else weight
    return (value, gs, gt), (mag_value, ms * wmax, mt * wmax)


def _check(case: Case, device: str, grad_output=None, seed: int = 0, inputs=None):
    """Values and both gradients on `device` against the float64 reference, for the case's seeded inputs or
    `inputs` (student, teacher, labels)."""
    student, teacher, labels = inputs if inputs is not None else _inputs(case, seed)
    a = student.detach().to(device).requires_grad_()
    b = teacher.detach().to(device).requires_grad_()
    out = npu_loss_ops.generalized_jsd_loss(a, b, None if labels is None else labels.to(device), **_kwargs(case))
    (value, gs, gt), (mv, ms, mt) = _reference(case, student, teacher, labels, grad_output)
    result_dtype = torch.promote_types(*case.dtypes)
    assert out.dtype == result_dtype and out.shape == value.shape, (out.dtype, out.shape, value.shape)
    g = torch.ones_like(out) if grad_output is None else grad_output.to(device, out.dtype)
    out.backward(g)
    assert_close(out.cpu(), value, mv, dtype=result_dtype, msg=f"{case.id}: value")
    assert_close(a.grad.cpu(), gs, ms, dtype=case.dtypes[0], msg=f"{case.id}: student's gradient")
    assert_close(b.grad.cpu(), gt, mt, dtype=case.dtypes[1], msg=f"{case.id}: teacher's gradient")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_matches_trl(case):
    """Values and both gradients within the dtype's tolerance of TRL's formula in float64."""
    _check(case, "cpu")


@pytest.mark.parametrize("case", DEVICE_CASES, ids=[c.id for c in DEVICE_CASES])
def test_matches_trl_on_device(case, device):
    _check(case, device)


@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_grad_output_weights_every_element(reduction):
    """A grad_output that is not ones reaches each element ('none') or scales the whole gradient."""
    case = Case((2, 4, 19), 0.3, 1.5, reduction, "some", "slice")
    shape = _reference(case, *_inputs(case))[0][0].shape
    _check(case, "cpu", grad_output=torch.randn(shape, generator=torch.Generator().manual_seed(3)))


def test_large_vocabulary():
    """Qwen's vocabulary (151,936), float32 and bfloat16, against the reference."""
    for dtypes in ((torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16)):
        _check(Case((3, 151936), 0.5, 1.0, "batchmean", dtypes=dtypes), "cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_rising_and_steep_rows(dtype):
    """Rows whose maximum rises in every block of the statistics pass (logits increasing along the row: each
    block's kept exps are rescaled by their own factor), the same falling, and rows steep enough that
    log-probabilities fall below -87 (where the mixture is not a normal float and the kernel takes the softplus
    form): values and both gradients within the dtype's tolerance of TRL's formula in float64."""
    v = 4101
    ramp, steep = torch.linspace(-30, 30, v), torch.linspace(-150, 10, v)
    student = torch.stack([ramp, ramp.flip(0), steep, steep * 0.5, steep.flip(0)]).to(dtype)
    teacher = torch.stack([ramp * 0.8, ramp, steep.flip(0), steep, steep * 0.7]).to(dtype)
    for beta in (0.0, 0.5, 0.9, 1.0):
        _check(Case((5, v), beta, 1.0, "batchmean", labels="none", dtypes=(dtype, dtype)), "cpu",
               inputs=(student, teacher, None))


def test_trl_itself_where_installed():
    """TRL's own GKDTrainer.generalized_jsd_loss, where trl 1.16 is installed (it is not in the default venv),
    gives the float32 values and gradients (student's and teacher's) ours gives, to float32's tolerance, and
    switching the trainer to ours is the one line docs/usage.md shows, called as compute_loss calls it."""
    gkd = pytest.importorskip("trl.experimental.gkd.gkd_trainer")
    trl_fn = gkd.GKDTrainer.generalized_jsd_loss
    for case in (Case((2, 5, 101), b, t, r, layout=layout) for b in (0.0, 0.5, 1.0) for t in (1.0, 2.0)
                 for r in ("batchmean", "sum", "mean", "none") for layout in ("contiguous", "slice")):
        student, teacher, labels = _inputs(case)
        for items in (None, 6):
            results = []
            for fn in (npu_loss_ops.generalized_jsd_loss, trl_fn):
                a, b = student.detach().requires_grad_(), teacher.detach().requires_grad_()
                value = fn(a, b, labels, case.beta, case.temperature, case.reduction, items)
                (value * torch.linspace(0.5, 2, value.shape[-1]) if value.dim() else value).sum().backward()
                results.append((value, a.grad, b.grad))
            for what, ours, theirs in zip(("value", "student's gradient", "teacher's gradient"), *results):
                torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6,
                                           msg=lambda m: f"{case.id} num_items={items}, {what}: {m}")
    original = gkd.GKDTrainer.generalized_jsd_loss
    try:
        gkd.GKDTrainer.generalized_jsd_loss = staticmethod(npu_loss_ops.generalized_jsd_loss)
        student, teacher, labels = _inputs(Case((2, 5, 11)))
        trainer = object.__new__(gkd.GKDTrainer)  # compute_loss's call, without a model
        value = trainer.generalized_jsd_loss(student_logits=student, teacher_logits=teacher, labels=labels, beta=0.5,
                                             num_items_in_batch=torch.tensor(4))
        assert torch.equal(value, npu_loss_ops.generalized_jsd_loss(student, teacher, labels, num_items_in_batch=4))
    finally:
        gkd.GKDTrainer.generalized_jsd_loss = original


def test_num_items_of_other_number_types_and_devices():
    """num_items_in_batch may be any real number (NumPy's too, as TRL takes), and a tensor on another device is
    divided by without being read (meta tensors stand for a device here)."""
    np = pytest.importorskip("numpy")
    student, teacher, labels = _inputs(Case((4, 9)))
    want = npu_loss_ops.generalized_jsd_loss(student, teacher, labels, num_items_in_batch=4)
    for n in (np.int64(4), np.float32(4.0), torch.tensor(4.0)):
        assert torch.equal(npu_loss_ops.generalized_jsd_loss(student, teacher, labels, num_items_in_batch=n), want)
    meta = npu_loss_ops.generalized_jsd_loss(student.to("meta"), teacher.to("meta"), labels.to("meta"),
                                             num_items_in_batch=torch.tensor(-1.0, device="meta"))
    assert meta.shape == () and meta.device.type == "meta"


def test_signature_is_trls_plus_ignore_index():
    """TRL 1.16's signature, positional arguments and defaults as it writes them, and the keyword-only
    ignore_index: GKDTrainer.compute_loss's call (num_items_in_batch=) works unchanged."""
    params = inspect.signature(npu_loss_ops.generalized_jsd_loss).parameters
    assert [(p.name, p.default) for p in params.values() if p.kind == p.POSITIONAL_OR_KEYWORD] == [
        ("student_logits", inspect.Parameter.empty), ("teacher_logits", inspect.Parameter.empty), ("labels", None),
        ("beta", 0.5), ("temperature", 1.0), ("reduction", "batchmean"), ("num_items_in_batch", None)]
    assert params["ignore_index"].kind == inspect.Parameter.KEYWORD_ONLY and params["ignore_index"].default == -100


def test_ignore_index_and_labels_outside_the_vocabulary():
    """Rows whose label is ignore_index are dropped; any other label, even outside [0, V), only keeps its row."""
    student, teacher, _ = _inputs(Case((6, 9)))
    labels = torch.tensor([5, 7, 1000, -1, 7, 0])
    got = npu_loss_ops.generalized_jsd_loss(student, teacher, labels, reduction="sum", ignore_index=7)
    want = trl_generalized_jsd_loss(student.double(), teacher.double(), labels, reduction="sum", ignore_index=7)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=0)


def test_every_row_ignored():
    """No row kept: 'batchmean' and 'sum' are 0 with zero gradients, 'mean' is NaN, 'none' is (0, V): TRL's."""
    case = Case((3, 5), labels="all")
    student, teacher, labels = _inputs(case)
    for reduction, want in (("batchmean", 0.0), ("sum", 0.0), ("mean", float("nan"))):
        a = student.clone().requires_grad_()
        out = npu_loss_ops.generalized_jsd_loss(a, teacher, labels, reduction=reduction)
        torch.testing.assert_close(out, torch.tensor(want), equal_nan=True)
        if reduction != "mean":
            out.backward()
            assert torch.equal(a.grad, torch.zeros_like(a))
    assert npu_loss_ops.generalized_jsd_loss(student, teacher, labels, reduction="none").shape == (0, 5)


# ---- every CPU instruction set (NPU_LOSS_OPS_CPU_ISA), each in a fresh interpreter ----

ISA_CASES = DEVICE_CASES + [
    Case((3, 32001), 0.5, 2.0, "batchmean", dtypes=(torch.bfloat16, torch.bfloat16)),
    Case((3, 4101), 0.9, 0.5, "sum", "some", dtypes=(torch.float16, torch.float16)),
    Case((2, 3, 257), 0.1, 1.0, "batchmean", "some", "slice", (torch.float64, torch.float32)),
    Case((2, 3, 257), 1.0, 1.0, "mean", "some", "slice", (torch.float32, torch.float32)),
]
ISA_SCRIPT = r"""
import sys, torch
sys.path.insert(0, sys.argv[2])
import npu_loss_ops, test_distillation as td
results = []
for case in td.ISA_CASES:
    student, teacher, labels = td._inputs(case)
    a, b = student.clone().requires_grad_(), teacher.clone().requires_grad_()
    value = npu_loss_ops.generalized_jsd_loss(a, b, labels, **td._kwargs(case))
    value.backward(torch.ones_like(value))
    results.append((value.detach(), a.grad, b.grad))
torch.save({"isa": npu_loss_ops.build_info()["cpu_isa"], "results": results}, sys.argv[1])
"""


@pytest.fixture(scope="module")
def isa_results(tmp_path_factory):
    return {isa: results_at_isa(ISA_SCRIPT, isa, str(tmp_path_factory.mktemp(isa)))
            for isa in npu_loss_ops.build_info()["cpu_isas_available"]}


@pytest.mark.parametrize("isa", npu_loss_ops.build_info()["cpu_isas_available"])
def test_every_instruction_set_matches_trl(isa_results, isa):
    """The row kernels of every instruction set this CPU runs (AVX-512, AVX2, the baseline: the one aarch64
    runs), values and both gradients, against TRL's formula in float64."""
    results = isa_results[isa]
    assert len(results) == len(ISA_CASES)
    for case, (value, gs, gt) in zip(ISA_CASES, results):
        student, teacher, labels = _inputs(case)
        (rv, rs, rt), (mv, ms, mt) = _reference(case, student, teacher, labels)
        assert_close(value, rv, mv, dtype=torch.promote_types(*case.dtypes), msg=f"{isa} {case.id}: value")
        assert_close(gs, rs, ms, dtype=case.dtypes[0], msg=f"{isa} {case.id}: student's gradient")
        assert_close(gt, rt, mt, dtype=case.dtypes[1], msg=f"{isa} {case.id}: teacher's gradient")


# ---- the composite (the NPU's path for now), through its own kernels on the CPU ----

COMPOSITE = torch._C.DispatchKey.CompositeExplicitAutograd
OP_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


def _composite_results(op_reduction, student, teacher, labels, beta, temperature, grad_output=None):
    """The value and both gradients from the composite kernels: the forward op, and the gradients from the
    forward with gradients (row scales applied) when reduced, else from the backward op."""
    args = (student, teacher, labels, op_reduction, beta, temperature, 1.0, 1.0, None, None, -100)
    value = ops.generalized_jsd_loss.default._op_dk(COMPOSITE, *args)
    if op_reduction != 0 and grad_output is None:
        again, gs, gt, row_scale = ops._generalized_jsd_loss_and_grads.default._op_dk(COMPOSITE, *args, [True, True])
        assert torch.equal(again, value) or (again.isnan() and value.isnan())
        scale = row_scale.unsqueeze(-1)
        return value, (gs.float() * scale).to(gs.dtype), (gt.float() * scale).to(gt.dtype)
    g = torch.ones_like(value) if grad_output is None else grad_output
    gs, gt = ops.generalized_jsd_loss_backward.default._op_dk(COMPOSITE, g, *args, [True, True])
    return value, gs, gt


COMPOSITE_CASES = [c for c in CASES if c.reduction in OP_REDUCTIONS and c.num_items is None]


@pytest.mark.parametrize("case", COMPOSITE_CASES, ids=[c.id for c in COMPOSITE_CASES])
def test_composite_matches_trl(case):
    """The composite's values and both gradients within the dtype's tolerance of TRL's formula in float64,
    every case of the matrix the op's own reductions cover (its chunks, masks and row scales included)."""
    student, teacher, labels = _inputs(case)
    value, gs, gt = _composite_results(OP_REDUCTIONS[case.reduction], student, teacher, labels, case.beta,
                                       case.temperature)
    (rv, rs, rt), (mv, ms, mt) = _reference(case, student, teacher, labels)
    result_dtype = torch.promote_types(*case.dtypes)
    assert value.dtype == result_dtype and value.shape == rv.shape
    assert_close(value, rv, mv, dtype=result_dtype, msg=f"{case.id}: value")
    assert_close(gs, rs, ms, dtype=case.dtypes[0], msg=f"{case.id}: student's gradient")
    assert_close(gt, rt, mt, dtype=case.dtypes[1], msg=f"{case.id}: teacher's gradient")


PATHS = ["kernel", "composite"]


def _op_call(path, op, *args):
    return op.default(*args) if path == "kernel" else op.default._op_dk(COMPOSITE, *args)


@pytest.mark.parametrize("path", PATHS)
def test_dropped_rows_never_reach_a_sum(path):
    """A NaN or an infinity in a row whose label drops it changes nothing: the value and the gradients are
    those without the row, and the dropped row's gradients are zeros (TRL drops the rows with jsd[mask])."""
    student, teacher, labels = _inputs(Case((4, 9), labels="none"))
    labels = torch.tensor([3, -100, 5, -100])
    bad_s, bad_t = student.clone(), teacher.clone()
    bad_s[1, 2], bad_t[1, 4], bad_s[3, 0], bad_t[3, 1] = float("nan"), float("inf"), float("-inf"), float("nan")
    kept = labels != -100
    for reduction in (1, 2):
        clean = _op_call(path, ops._generalized_jsd_loss_and_grads, student[kept], teacher[kept], None, reduction,
                         0.5, 2.0, 1.0, 1.0, None, None, -100, [True, True])
        value, gs, gt, _ = _op_call(path, ops._generalized_jsd_loss_and_grads, bad_s, bad_t, labels, reduction, 0.5,
                                    2.0, 1.0, 1.0, None, None, -100, [True, True])
        torch.testing.assert_close(value, clean[0])
        torch.testing.assert_close(gs[kept], clean[1])
        torch.testing.assert_close(gt[kept], clean[2])
        assert torch.equal(gs[~kept], torch.zeros(2, 9)) and torch.equal(gt[~kept], torch.zeros(2, 9))
    g = torch.randn(2, 9)
    gs, gt = _op_call(path, ops.generalized_jsd_loss_backward, g, bad_s, bad_t, labels, 0, 0.5, 2.0, 1.0, 1.0, None, None, -100,
                      [True, True])
    assert torch.isfinite(gs).all() and torch.isfinite(gt).all()
    assert torch.equal(gs[~kept], torch.zeros(2, 9))


@pytest.mark.parametrize("path", PATHS)
def test_mean_of_no_row(path):
    """The op's 'mean' with every row dropped: NaN (nothing to average), and zero gradients (no row to weigh),
    on both paths alike."""
    student, teacher, _ = _inputs(Case((3, 5), labels="none"))
    labels = torch.full((3,), -100)
    value, gs, gt, _ = _op_call(path, ops._generalized_jsd_loss_and_grads, student, teacher, labels, 1, 0.5, 1.0, 1.0, 1.0, None, None, -100,
                                [True, True])
    assert value.isnan() and torch.equal(gs, torch.zeros(3, 5)) and torch.equal(gt, torch.zeros(3, 5))


@pytest.mark.parametrize("path", PATHS)
def test_unsigned_labels_compare_as_integers(path):
    """A uint8 label of 156 is not -100 (the comparison is of integers, never wrapped to the labels' dtype)."""
    student, teacher, _ = _inputs(Case((3, 5), labels="none"))
    for dtype in (torch.uint8, torch.int8, torch.int32):
        labels = torch.tensor([156 if dtype == torch.uint8 else 1, 2, 3], dtype=dtype)
        got = _op_call(path, ops.generalized_jsd_loss, student, teacher, labels, 0, 0.5, 1.0, 1.0, 1.0, None, None, -100)
        assert got.shape == (3, 5), dtype


@pytest.mark.parametrize("path", PATHS)
def test_empty_logits(path):
    """No row, or a vocabulary of 0: 'none' empty, 'sum' 0, 'mean' NaN, empty gradients; on both paths."""
    for shape in ((0, 5), (3, 0), (2, 0, 4)):
        s, t = torch.randn(shape), torch.randn(shape)
        labels = torch.zeros(shape[:-1], dtype=torch.long)
        for lab in (None, labels):
            assert _op_call(path, ops.generalized_jsd_loss, s, t, lab, 0, 0.5, 1.0, 1.0, 1.0, None, None, -100).numel() == 0
            assert _op_call(path, ops.generalized_jsd_loss, s, t, lab, 2, 0.5, 1.0, 1.0, 1.0, None, None, -100).item() == 0
            value, gs, gt, row_scale = _op_call(path, ops._generalized_jsd_loss_and_grads, s, t, lab, 1, 0.5, 1.0, 1.0, 1.0, None, None,
                                                -100, [True, True])
            assert value.isnan() and gs.shape == shape and gt.shape == shape and row_scale.shape == shape[:-1]


@pytest.mark.parametrize("path", PATHS)
def test_grad_output_rows_of_none_with_labels(path):
    """The backward op of 'none' with labels takes one grad_output row per row kept, on every backend."""
    s, t = torch.randn(3, 7), torch.randn(3, 7)
    for rows in (1, 3):
        with pytest.raises(RuntimeError, match=f"one row per row its labels keep \\(2\\), got {rows}"):
            _op_call(path, ops.generalized_jsd_loss_backward, torch.ones(rows, 7), s, t, torch.tensor([0, -100, 1]),
                     0, 0.5, 1.0, 1.0, 1.0, None, None, -100, [True, True])


@pytest.mark.parametrize("path", PATHS)
def test_float16_gradients_keep_their_precision_under_loss_scaling(path):
    """float16 logits at V = 32,000 with a loss scale of 1024: each gradient within two float16 roundings of
    the exact one. The gradients made in the forward are stored with a power-of-two scale per row (most of them
    lie below float16's smallest normal before the loss scale reaches them: stored as they are, they lost 1.2 %
    at the median and 53,000 of 64 x 32,000 flushed to zero)."""
    gen = torch.Generator().manual_seed(5)
    s = (torch.randn(16, 32000, generator=gen) * 2).half()
    t = (torch.randn(16, 32000, generator=gen) * 2).half()
    scale = 1024.0
    if path == "kernel":
        a, b = s.clone().requires_grad_(), t.clone().requires_grad_()
        (npu_loss_ops.generalized_jsd_loss(a, b, reduction="sum") * scale).backward()
        gs, gt = a.grad, b.grad
    else:
        _, gs, gt, row_scale = _op_call(path, ops._generalized_jsd_loss_and_grads, s, t, None, 2, 0.5, 1.0, 1.0, 1.0, None, None, -100,
                                        [True, True])
        gs = (gs.float() * row_scale[:, None] * scale).half()
        gt = (gt.float() * row_scale[:, None] * scale).half()
    a64, b64 = s.double().requires_grad_(), t.double().requires_grad_()
    (trl_generalized_jsd_loss(a64, b64, None, 0.5, 1.0, "sum") * scale).backward()
    for got, exact in ((gs, a64.grad), (gt, b64.grad)):
        # Two roundings to float16: 2 ulp of a normal value (2 * 2^-11 relative), 2 steps of a subnormal one.
        torch.testing.assert_close(got.double(), exact, rtol=2 * 2.0 ** -11, atol=2 * 2.0 ** -24)


def test_checks_run_under_vmap():
    """vmap runs the composite, after the same checks: a bad beta is the documented ValueError, not NaN."""
    s, t = torch.randn(2, 3, 5), torch.randn(2, 3, 5)
    with pytest.raises(ValueError, match="beta must be in \\[0, 1\\], got 1.5"):
        torch.func.vmap(lambda a, b: npu_loss_ops.generalized_jsd_loss(a, b, beta=1.5))(s, t)
    with pytest.raises(TypeError, match="labels must have an integer dtype"):
        torch.func.vmap(lambda a, b: npu_loss_ops.generalized_jsd_loss(a, b, torch.ones(3)))(s, t)
    with pytest.raises(RuntimeError, match="the same shape"):
        torch.func.vmap(lambda a, b: npu_loss_ops.generalized_jsd_loss(a, b[..., :4]))(s, t)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0])
def test_gradcheck(beta, reduction):
    """gradcheck and gradgradcheck in float64 at V = 7, both logits requiring grad (double backward goes
    through the composite)."""
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(2, 3, 7, dtype=torch.float64, generator=gen, requires_grad=True)
    b = torch.randn(2, 3, 7, dtype=torch.float64, generator=gen, requires_grad=True)
    labels = torch.tensor([[1, -100, 2], [3, 4, -100]])

    def fn(x, y):
        return npu_loss_ops.generalized_jsd_loss(x, y, labels, beta, 1.5, reduction)

    assert torch.autograd.gradcheck(fn, (a, b))
    assert torch.autograd.gradgradcheck(fn, (a, b))


def _op_samples():
    gen = torch.Generator().manual_seed(6)
    s, t = torch.randn(4, 9, generator=gen), torch.randn(4, 9, generator=gen)
    labels = torch.tensor([1, -100, 2, 3])
    for reduction in (0, 1, 2):
        for lab in (None, labels):
            yield "generalized_jsd_loss", (s.clone().requires_grad_(), t.clone().requires_grad_(), lab, reduction,
                                           0.5, 2.0, 1.0, 1.0, None, None, -100)
    for reduction in (1, 2):
        yield "_generalized_jsd_loss_and_grads", (s, t, labels, reduction, 0.5, 2.0, 1.0, 1.0, None, None, -100, [True, False])
    yield "generalized_jsd_loss_backward", (torch.randn(3, 9, generator=gen), s, t, labels, 0, 0.5, 2.0, 1.0, 1.0, None, None, -100,
                                            [True, True])
    yield "generalized_jsd_loss_backward", (torch.tensor(2.0), s, t, None, 1, 0.0, 1.0, 1.0, 1.0, None, None, -100, [False, True])


OP_SAMPLES = list(_op_samples())


@pytest.mark.parametrize("name,args", OP_SAMPLES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(OP_SAMPLES)])
def test_opcheck(name, args):
    torch.library.opcheck(getattr(ops, name).default, args)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_compiled_matches_eager(reduction):
    """torch.compile(fullgraph=True) of the loss gives eager's values, and its compiled backward eager's
    gradients ('none' with labels has a size only the data tells: an unbacked size)."""
    import torch._dynamo

    student, teacher, labels = _inputs(Case((2, 4, 21), layout="slice"))

    def loss(a, b):
        return npu_loss_ops.generalized_jsd_loss(a, b, labels, 0.5, 2.0, reduction)

    results = []
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        torch._dynamo.reset()
        for fn in (loss, torch.compile(loss, fullgraph=True)):
            a, b = student.clone().requires_grad_(), teacher.clone().requires_grad_()
            out = fn(a, b)
            out.sum().backward()
            results.append((out.detach(), a.grad, b.grad))
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager, rtol=1e-6, atol=1e-7)


# Dynamo keeps the op's unbacked row count in the graph without capture_dynamic_output_shape_ops from this
# release on (measured on 2.13); 2.7.1 refuses it without the flag (a graph break; fullgraph=True raises).
NONE_WITH_LABELS_NEEDS_NO_FLAG = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 13)


@pytest.mark.parametrize("capture", [False, True])
def test_none_with_labels_compiles_whatever_capture_dynamic_output_shape_ops_says(capture):
    """'none' with labels: the fake kernel gives the rows kept an unbacked size, and the op carries no
    dynamic_output_shape tag, so Dynamo compiles it under fullgraph=True with capture_dynamic_output_shape_ops
    either way (docs/usage.md, "Distillation"), to eager's values and gradients. On an older torch that needs
    the flag, fullgraph=True without it raises naming the flag, and the default compile breaks the graph there
    and still gives eager's results."""
    import torch._dynamo

    student, teacher, labels = _inputs(Case((2, 4, 21)))

    def loss(a, b):
        return npu_loss_ops.generalized_jsd_loss(a, b, labels, 0.5, 2.0, "none")

    fullgraph = capture or NONE_WITH_LABELS_NEEDS_NO_FLAG
    results = []
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=capture):
        torch._dynamo.reset()
        if not fullgraph:
            try:
                torch.compile(loss, fullgraph=True)(student.clone(), teacher.clone())
            except torch._dynamo.exc.Unsupported as e:
                assert "capture_dynamic_output_shape_ops" in str(e)
            torch._dynamo.reset()
        for fn in (loss, torch.compile(loss, fullgraph=fullgraph)):
            a, b = student.clone().requires_grad_(), teacher.clone().requires_grad_()
            out = fn(a, b)
            (out * torch.linspace(0.5, 2, 21)).sum().backward()
            results.append((out.detach(), a.grad, b.grad))
    torch._dynamo.reset()
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_compiled_autograd(reduction):
    """loss.backward() under compiled autograd captures the row loss's node in its graph and gives eager's
    gradients, the teacher's included (the saved gradients are the graph's inputs, scaled into new tensors)."""
    student, teacher, labels = _inputs(Case((2, 4, 21), layout="slice"))

    def make_loss():
        a, b = student.clone().requires_grad_(), teacher.clone().requires_grad_()
        out = npu_loss_ops.generalized_jsd_loss(a, b, labels, 0.5, 2.0, reduction)
        loss = (out * torch.linspace(0.5, 2, out.shape[-1])).sum() if reduction == "none" else out * 1.5
        return loss, [a, b]

    eager, compiled, captured = backward_eager_and_compiled(make_loss)
    for e, c in zip(eager, compiled):
        torch.testing.assert_close(c, e, rtol=1e-6, atol=1e-7)
    assert len(captured) == 1 and "NpuLossGeneralizedJsdLoss" in captured[0], captured


def test_torchscript_calls_the_op():
    """TorchScript cannot compile the Python API (a keyword-only argument with a default: docs/usage.md), but a
    scripted function may call the op, and gets the Python API's value."""
    import warnings

    student, teacher, labels = _inputs(Case((2, 4, 21)))

    def fn(a: torch.Tensor, b: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torch.ops.npu_loss.generalized_jsd_loss(a, b, labels, 2, 0.5, 2.0, 1.0, 1.0, None, None, -100)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script is deprecated in torch 2.13
        scripted = torch.jit.script(fn)
        with pytest.raises(torch.jit.frontend.NotSupportedError, match="keyword-only"):
            torch.jit.script(npu_loss_ops.generalized_jsd_loss)
    assert torch.equal(scripted(student, teacher, labels),
                       npu_loss_ops.generalized_jsd_loss(student, teacher, labels, 0.5, 2.0, "sum"))


def test_export():
    """torch.export of a module that computes the loss (labels, 'batchmean'): the op is in the graph and the
    exported program gives eager's value."""

    class Distill(torch.nn.Module):
        def forward(self, student, teacher, labels):
            return npu_loss_ops.JSDLoss(beta=0.3)(student, teacher, labels)

    student, teacher, labels = _inputs(Case((2, 4, 21)))
    program = torch.export.export(Distill(), (student, teacher, labels))
    targets = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert "npu_loss.generalized_jsd_loss.default" in targets
    torch.testing.assert_close(program.module()(student, teacher, labels), Distill()(student, teacher, labels))


def test_torch_func_transforms():
    """grad, vjp, jacrev, jacfwd, jvp, hessian and vmap (the composite under vmap) against the reference."""
    from torch.func import grad, hessian, jacfwd, jacrev, jvp, vmap, vjp

    gen = torch.Generator().manual_seed(7)
    s, t = torch.randn(3, 4, 9, dtype=torch.float64, generator=gen), torch.randn(3, 4, 9, dtype=torch.float64, generator=gen)
    labels = torch.tensor([[1, -100, 2, 3]] * 3)

    def ours(a, b, reduction="sum", lab=labels):
        return npu_loss_ops.generalized_jsd_loss(a, b, lab, 0.3, 1.5, reduction)

    def ref(a, b, reduction="sum", lab=labels):
        return trl_generalized_jsd_loss(a, b, lab, 0.3, 1.5, reduction)

    close = lambda x, y: torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-11)  # noqa: E731
    for got, want in zip(grad(ours, argnums=(0, 1))(s, t), grad(ref, argnums=(0, 1))(s, t)):
        close(got, want)
    v = torch.randn(4, 9, dtype=torch.float64, generator=gen)
    close(vjp(lambda a: ours(a, t, "none"), s)[1](v[labels[0] != -100].expand(3, -1, -1).reshape(-1, 9))[0],
          vjp(lambda a: ref(a, t, "none"), s)[1](v[labels[0] != -100].expand(3, -1, -1).reshape(-1, 9))[0])
    close(jacrev(ours)(s[0], t[0], "batchmean", labels[0]), jacrev(ref)(s[0], t[0], "batchmean", labels[0]))
    close(jacfwd(ours)(s[0], t[0], "mean", labels[0]), jacfwd(ref)(s[0], t[0], "mean", labels[0]))
    for reduction in ("sum", "none"):
        close(jvp(lambda a, b: ours(a, b, reduction), (s, t), (t, s))[1],
              jvp(lambda a, b: ref(a, b, reduction), (s, t), (t, s))[1])
    close(hessian(ours)(s[0, 0], t[0, 0], "sum", None), hessian(ref)(s[0, 0], t[0, 0], "sum", None))
    close(vmap(lambda a, b: ours(a, b, "batchmean", None))(s, t),
          torch.stack([ref(s[i], t[i], "batchmean", None) for i in range(3)]))
    close(vmap(grad(lambda a, b: ours(a, b, "sum", None)))(s, t),
          torch.stack([grad(lambda a, b: ref(a, b, "sum", None))(s[i], t[i]) for i in range(3)]))


def test_forward_mode_ad():
    """Dual tensors: the tangent of every reduction, the teacher's tangent too."""
    import torch.autograd.forward_ad as fwAD

    gen = torch.Generator().manual_seed(8)
    s, t = torch.randn(2, 6, 11, dtype=torch.float64, generator=gen), torch.randn(2, 6, 11, dtype=torch.float64, generator=gen)
    ts, tt = torch.randn_like(s), torch.randn_like(t)
    labels = torch.tensor([[1, -100, 2, 3, 4, 5]] * 2)
    for reduction in REDUCTIONS:
        tangents = []
        for fn in (npu_loss_ops.generalized_jsd_loss, trl_generalized_jsd_loss):
            with fwAD.dual_level():
                out = fn(fwAD.make_dual(s, ts), fwAD.make_dual(t, tt), labels, 0.0, 2.0, reduction)
                tangents.append(fwAD.unpack_dual(out).tangent)
        torch.testing.assert_close(tangents[0], tangents[1], rtol=1e-9, atol=1e-12)


def test_same_bits_with_one_and_two_threads():
    """The CPU kernels split the threads over rows, and every row's sums run in one order: the value and
    both gradients have the same bits whatever the thread count."""
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (2, 1):
            torch.set_num_threads(n)
            for dtypes in ((torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float16)):
                student, teacher, labels = _inputs(Case((4, 17, 1000), dtypes=dtypes, layout="slice"))
                a, b = student.clone().requires_grad_(), teacher.clone().requires_grad_()
                for reduction in ("sum", "none"):
                    out = npu_loss_ops.generalized_jsd_loss(a, b, labels, 0.5, 1.0, reduction)
                    out.backward(torch.ones_like(out))
                    results.append((n, out.detach(), a.grad.clone(), b.grad.clone()))
    finally:
        torch.set_num_threads(threads)
    half = len(results) // 2
    for two, one in zip(results[:half], results[half:]):
        for x, y in zip(two[1:], one[1:]):
            assert torch.equal(x, y)


def test_retain_graph():
    """The gradients made in the forward are scaled in place by the backward, unless the graph is kept: with
    retain_graph=True a second backward gives the same gradient again; a third, without it, is an error."""
    student, teacher, labels = _inputs(Case((3, 4, 13)))
    a = student.clone().requires_grad_()
    out = npu_loss_ops.generalized_jsd_loss(a, teacher, labels) * 3
    out.backward(retain_graph=True)
    first = a.grad.clone()
    out.backward(retain_graph=True)
    torch.testing.assert_close(a.grad, 2 * first, rtol=0, atol=0)
    out.backward()
    torch.testing.assert_close(a.grad, 3 * first, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.backward()


def test_no_gradient_where_none_is_needed():
    """Under no_grad, or with no input requiring grad, the forward makes no gradient (and returns no node);
    with only the teacher requiring grad, only the teacher's."""
    student, teacher, labels = _inputs(Case((3, 4, 13)))
    with torch.no_grad():
        assert npu_loss_ops.generalized_jsd_loss(student.requires_grad_(), teacher, labels).grad_fn is None
    student.requires_grad_(False)
    b = teacher.clone().requires_grad_()
    npu_loss_ops.generalized_jsd_loss(student, b, labels, reduction="mean").backward()
    assert b.grad is not None and student.grad is None


def test_autocast_keeps_the_logits_dtype():
    """Under torch.autocast the family runs in the logits' own dtype (a float32 copy of N x V logits would break
    the memory bounds): float32 logits give a float32 loss, bfloat16 ones a bfloat16 loss."""
    for dtype in (torch.float32, torch.bfloat16):
        student, teacher, labels = _inputs(Case((3, 9), dtypes=(dtype, dtype)))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = npu_loss_ops.generalized_jsd_loss(student, teacher, labels)
        assert out.dtype == dtype
        torch.testing.assert_close(out, npu_loss_ops.generalized_jsd_loss(student, teacher, labels), rtol=0, atol=0)


def test_module():
    """JSDLoss holds the arguments, checks them at construction, and computes the functional's value."""
    loss = npu_loss_ops.JSDLoss(beta=0.3, temperature=2.0, ignore_index=-1, reduction="sum")
    assert (loss.beta, loss.temperature, loss.ignore_index, loss.reduction) == (0.3, 2.0, -1, "sum")
    student, teacher, labels = _inputs(Case((3, 9)))
    labels = labels.masked_fill(labels == -100, -1)
    assert torch.equal(loss(student, teacher, labels),
                       npu_loss_ops.generalized_jsd_loss(student, teacher, labels, 0.3, 2.0, "sum", ignore_index=-1))
    assert torch.equal(loss(student, teacher, labels, 4), npu_loss_ops.generalized_jsd_loss(
        student, teacher, labels, 0.3, 2.0, "sum", num_items_in_batch=4, ignore_index=-1))
    # At construction, by the function's rules: every scalar of BAD, each with the function's class and message.
    module_bad = [(kwargs, error, match) for _, kwargs, error, match in BAD
                  if set(kwargs) <= {"beta", "temperature", "ignore_index", "reduction"}]
    assert len(module_bad) >= 15
    for kwargs, error, match in module_bad:
        with pytest.raises(error, match=match):
            npu_loss_ops.JSDLoss(**kwargs)


# ---- bad input: a clear exception naming the argument, the same on real, fake and meta tensors ----

def _bad_inputs():
    s, t = torch.randn(3, 7), torch.randn(3, 7)
    labels = torch.tensor([1, 2, -100])
    yield "beta", dict(beta=1.5), ValueError, "beta must be in \\[0, 1\\], got 1.5"
    yield "beta-negative", dict(beta=-0.1), ValueError, "beta must be in \\[0, 1\\]"
    yield "beta-nan", dict(beta=float("nan")), ValueError, "beta must be in \\[0, 1\\], got nan"
    yield "temperature", dict(temperature=0.0), ValueError, "temperature must be > 0, got 0"
    yield "temperature-negative", dict(temperature=-1.0), ValueError, "temperature must be > 0"
    yield "temperature-nan", dict(temperature=float("nan")), ValueError, "temperature must be > 0, got nan"
    yield "reduction", dict(reduction="average"), ValueError, \
        "reduction must be 'batchmean', 'sum', 'mean' or 'none', got 'average'"
    yield "num_items-zero", dict(num_items_in_batch=0), ValueError, "num_items_in_batch must be > 0, got 0"
    yield "num_items-tensor", dict(num_items_in_batch=torch.tensor(-2)), ValueError, "num_items_in_batch must be > 0"
    yield "num_items-two", dict(num_items_in_batch=torch.tensor([2, 3])), ValueError, "one-element real tensor"
    yield "num_items-string", dict(num_items_in_batch="4"), TypeError, "num_items_in_batch must be a real number or a tensor, got '4' \\(str\\)"
    yield "num_items-bool", dict(num_items_in_batch=True), TypeError, "num_items_in_batch must be a real number or a tensor, got True"
    yield "num_items-bool-tensor", dict(num_items_in_batch=torch.tensor(True)), TypeError, \
        "num_items_in_batch must be a real number or a one-element floating or integer tensor, got a tensor of dtype torch.bool"
    yield "num_items-complex", dict(num_items_in_batch=torch.tensor(4j)), TypeError, "num_items_in_batch must be a real"
    yield "num_items-meta", dict(num_items_in_batch=torch.tensor(4.0, device="meta")), ValueError, \
        "num_items_in_batch must be on (the CPU|the logits' device \\(npu:0\\) or the CPU), got a tensor on meta"
    yield "beta-string", dict(beta="0.5"), TypeError, "generalized_jsd_loss: beta must be a real number, got '0.5' \\(str\\)"
    yield "beta-none", dict(beta=None), TypeError, "beta must be a real number, got None"
    yield "beta-bool", dict(beta=True), TypeError, "beta must be a real number, got True \\(bool\\)"
    yield "beta-bool-tensor", dict(beta=torch.tensor(True)), TypeError, "beta must be a real number, got a tensor"
    yield "temperature-string", dict(temperature="2"), TypeError, "temperature must be a real number"
    yield "ignore_index-float", dict(ignore_index=1.5), TypeError, "ignore_index must be an integer, got 1.5 \\(float\\)"
    yield "ignore_index-string", dict(ignore_index="-100"), TypeError, "ignore_index must be an integer, got '-100'"
    yield "ignore_index-bool", dict(ignore_index=False), TypeError, "ignore_index must be an integer, got False"
    yield "reduction-none", dict(reduction=None), TypeError, "reduction must be a str, got None"
    yield "logits-9dim", dict(student_logits=torch.randn([1] * 8 + [7]), teacher_logits=torch.randn([1] * 8 + [7]),
                              labels=None), RuntimeError, "has 9 dimensions, but at most 8 are supported"
    yield "shapes", dict(teacher_logits=torch.randn(4, 7)), RuntimeError, "student_logits and teacher_logits must have the same shape"
    yield "vocabularies", dict(teacher_logits=torch.randn(3, 8)), RuntimeError, "the same shape \\(the same vocabulary too\\)"
    yield "labels-shape", dict(labels=torch.tensor([1, 2])), RuntimeError, "labels must have the logits' leading shape"
    yield "labels-float", dict(labels=labels.float()), TypeError, "labels must have an integer dtype, got float32"
    yield "labels-bool", dict(labels=labels > 0), TypeError, "labels must have an integer dtype, got bool"
    yield "logits-int", dict(student_logits=s.long()), TypeError, "student_logits must have dtype"
    yield "logits-0dim", dict(student_logits=torch.tensor(1.0), teacher_logits=torch.tensor(1.0)), RuntimeError, \
        "student_logits must have at least one dimension"
    yield "devices", dict(teacher_logits=t.to("meta")), RuntimeError, "expected all tensors on the same device"


BAD = list(_bad_inputs())
# The function's own checks, before the op (the types of its scalars, the reduction string, num_items_in_batch),
# and the devices, which FakeTensorMode itself checks.
PYTHON_ONLY = {b[0] for b in BAD if b[0].startswith(("num_items", "reduction", "ignore_index"))
               or b[0].endswith(("-string", "-none", "-bool", "-bool-tensor"))} | {"devices"}


@pytest.mark.parametrize("name,kwargs,error,match", BAD, ids=[b[0] for b in BAD])
def test_bad_input(name, kwargs, error, match):
    args = dict(student_logits=torch.randn(3, 7), teacher_logits=torch.randn(3, 7), labels=torch.tensor([1, 2, -100]))
    args.update(kwargs)
    with pytest.raises(error, match=match):
        npu_loss_ops.generalized_jsd_loss(**args)


@pytest.mark.parametrize("name,kwargs,error,match",
                         [b for b in BAD if b[0] not in PYTHON_ONLY], ids=[b[0] for b in BAD if b[0] not in PYTHON_ONLY])
def test_bad_input_fake_and_meta(name, kwargs, error, match):
    """The ops' checks on fake (torch.compile, export) and meta tensors are the kernels' own."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    args = dict(student_logits=torch.randn(3, 7), teacher_logits=torch.randn(3, 7), labels=torch.tensor([1, 2, -100]),
                reduction="sum", beta=0.5, temperature=1.0)
    args.update(kwargs)
    order = ("student_logits", "teacher_logits", "labels", "reduction", "beta", "temperature")
    call = [args[k] for k in order]
    call[3] = {"sum": 2}.get(call[3], call[3])
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for v in call]
        with pytest.raises(error, match=match):
            ops.generalized_jsd_loss(*fake, ignore_index=-100)
    meta = [v.to("meta") if isinstance(v, torch.Tensor) else v for v in call]
    with pytest.raises(error, match=match):
        ops.generalized_jsd_loss(*meta, ignore_index=-100)


def test_bad_reduction_and_grad_output_of_the_ops():
    """The ops' own integer reduction, and grad_output of the backward op."""
    s, t = torch.randn(3, 7), torch.randn(3, 7)
    with pytest.raises(ValueError, match="reduction must be 0 \\(none\\), 1 \\(mean\\) or 2 \\(sum\\), got 3"):
        ops.generalized_jsd_loss(s, t, None, 3, 0.5, 1.0, 1.0, 1.0, None, None, -100)
    with pytest.raises(ValueError, match="_generalized_jsd_loss_and_grads: reduction must be 1 \\(mean\\) or 2"):
        ops._generalized_jsd_loss_and_grads(s, t, None, 0, 0.5, 1.0, 1.0, 1.0, None, None, -100, [True, True])
    with pytest.raises(RuntimeError, match="grad_output of a reduced loss must be 0-dim"):
        ops.generalized_jsd_loss_backward(torch.ones(3), s, t, None, 2, 0.5, 1.0, 1.0, 1.0, None, None, -100, [True, True])
    with pytest.raises(RuntimeError, match="grad_output of 'none' must have the logits' shape"):
        ops.generalized_jsd_loss_backward(torch.ones(3, 6), s, t, None, 0, 0.5, 1.0, 1.0, 1.0, None, None, -100, [True, True])


# ---- the three ops on the device: every beta class, reduction and labels, against TRL and the CPU kernels ----

OP_DEVICE_CASES = [Case((2, 3, 33), b, 2.0, r, lab, "slice", d) for b in (0.0, 0.5, 1.0) for r in OP_REDUCTIONS
                   for lab in ("none", "some")
                   for d in ((torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                             (torch.float16, torch.float32))]


@pytest.mark.parametrize("case", OP_DEVICE_CASES, ids=[c.id for c in OP_DEVICE_CASES])
def test_ops_on_device(case, device):
    """The forward, the backward op (a grad_output that is not ones) and the forward with both gradients (row
    scales applied) on `device`: within the dtype's tolerance of TRL's formula in float64 and of the CPU
    kernels. On the NPU this is the aclnn path where the chip's row names an API (docs/npu_paths.md), else the
    composite."""
    student, teacher, labels = _inputs(case)
    red = OP_REDUCTIONS[case.reduction]

    def args(dev):
        return (student.to(dev), teacher.to(dev), None if labels is None else labels.to(dev), red, case.beta,
                case.temperature, 1.0, 1.0, None, None, -100)

    result_dtype = torch.promote_types(*case.dtypes)
    cpu_value = ops.generalized_jsd_loss(*args("cpu"))
    g = torch.randn(cpu_value.shape, generator=torch.Generator().manual_seed(7)).to(result_dtype)
    (rv, rs, rt), (mv, ms, mt) = _reference(case, student, teacher, labels, g)
    value = ops.generalized_jsd_loss(*args(device))
    assert_close_on_device(value, rv, mv, result_dtype, f"{case.id}: value", device=device, cpu=cpu_value)
    cpu_gs, cpu_gt = ops.generalized_jsd_loss_backward(g, *args("cpu"), [True, True])
    gs, gt = ops.generalized_jsd_loss_backward(g.to(device), *args(device), [True, True])
    assert_close_on_device(gs, rs, ms, case.dtypes[0], f"{case.id}: backward's student gradient", device=device,
                           cpu=cpu_gs)
    assert_close_on_device(gt, rt, mt, case.dtypes[1], f"{case.id}: backward's teacher gradient", device=device,
                           cpu=cpu_gt)
    if red == 0:
        return  # the forward with gradients makes those of a reduced loss
    (rv, rs, rt), (mv, ms, mt) = _reference(case, student, teacher, labels)
    results = []
    for dev in (device, "cpu"):
        value, gs, gt, row_scale = ops._generalized_jsd_loss_and_grads(*args(dev), [True, True])
        scale = row_scale.unsqueeze(-1)
        results.append((value, (gs.float() * scale).to(gs.dtype), (gt.float() * scale).to(gt.dtype)))
    (value, gs, gt), (cpu_value, cpu_gs, cpu_gt) = results
    assert_close_on_device(value, rv, mv, result_dtype, f"{case.id}: with_grads' value", device=device, cpu=cpu_value)
    assert_close_on_device(gs, rs, ms, case.dtypes[0], f"{case.id}: with_grads' student gradient", device=device,
                           cpu=cpu_gs)
    assert_close_on_device(gt, rt, mt, case.dtypes[1], f"{case.id}: with_grads' teacher gradient", device=device,
                           cpu=cpu_gt)


@pytest.mark.parametrize("mask", [(True, False), (False, True)], ids=["student", "teacher"])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_one_gradient_on_device(device, beta, mask):
    """The backward op and the forward with gradients asked for one gradient: that one as with both, and an empty
    tensor for the other."""
    student, teacher, labels = _inputs(Case((4, 17), beta, 1.0, "sum", "some"))
    args = [student.to(device), teacher.to(device), labels.to(device), 2, beta, 1.0, 1.0, 1.0, None, None, -100]
    both = ops.generalized_jsd_loss_backward(torch.tensor(1.5, device=device), *args, [True, True])
    one = ops.generalized_jsd_loss_backward(torch.tensor(1.5, device=device), *args, list(mask))
    kept = 0 if mask[0] else 1
    torch.testing.assert_close(one[kept].cpu(), both[kept].cpu())
    assert one[1 - kept].numel() == 0
    forward = ops._generalized_jsd_loss_and_grads(*args, list(mask))
    torch.testing.assert_close(forward[1 + kept].cpu(), both[kept].cpu() / 1.5)
    assert forward[2 - kept].numel() == 0


def test_every_row_dropped_on_device(device):
    """Every row dropped: 'mean' NaN and 'sum' 0, zero gradients, empty 'none' values; on every device."""
    student, teacher, _ = _inputs(Case((4, 9), labels="none"))
    labels = torch.full((4,), -100, device=device)
    s, t = student.to(device), teacher.to(device)
    for beta in (0.0, 0.5, 1.0):
        value, gs, gt, _ = ops._generalized_jsd_loss_and_grads(s, t, labels, 1, beta, 1.0, 1.0, 1.0, None, None, -100, [True, True])
        assert value.cpu().isnan() and not gs.cpu().any() and not gt.cpu().any()
        assert ops.generalized_jsd_loss(s, t, labels, 2, beta, 1.0, 1.0, 1.0, None, None, -100).item() == 0
        assert ops.generalized_jsd_loss(s, t, labels, 0, beta, 1.0, 1.0, 1.0, None, None, -100).shape == (0, 9)
        gs, gt = ops.generalized_jsd_loss_backward(torch.tensor(2.0, device=device), s, t, labels, 2, beta, 1.0, 1.0, 1.0, None, None, -100,
                                                   [True, True])
        assert not gs.cpu().any() and not gt.cpu().any()


@pytest.mark.parametrize("name,kwargs,error,match", BAD, ids=[b[0] for b in BAD])
def test_bad_input_on_device(name, kwargs, error, match, device):
    """The same exception and message on every device (the checks run before any kernel). The logits and labels
    are on the device; num_items_in_batch stays a CPU tensor (on another device only its shape is checked: reading
    its value would wait for the device every step)."""
    args = dict(student_logits=torch.randn(3, 7), teacher_logits=torch.randn(3, 7), labels=torch.tensor([1, 2, -100]))
    args.update(kwargs)
    args = {k: v.to(device) if k != "num_items_in_batch" and isinstance(v, torch.Tensor) and v.device.type == "cpu"
            else v for k, v in args.items()}
    with pytest.raises(error, match=match):
        npu_loss_ops.generalized_jsd_loss(**args)


# ---- memory: the process's peak resident size above the inputs, in a fresh process ----

MEMORY_PROBE = r"""
import sys, torch, npu_loss_ops
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
n, v, dtype, mode, path = int(sys.argv[1]), int(sys.argv[2]), getattr(torch, sys.argv[3]), sys.argv[4], sys.argv[5]
gen = torch.Generator().manual_seed(0)
student = torch.randn(n, v, generator=gen).to(dtype)
teacher = torch.randn(n, v, generator=gen).to(dtype)
labels = torch.randint(0, v, (n,), generator=gen)
labels[torch.rand(n, generator=gen) < 0.25] = -100
ops, composite = torch.ops.npu_loss, torch._C.DispatchKey.CompositeExplicitAutograd
def composite_call(student, teacher, labels):  # what autograd's forward calls, through the composite kernels
    if mode == "no_grad":
        return ops.generalized_jsd_loss.default._op_dk(composite, student, teacher, labels, 2, 0.5, 1.0, 1.0, 1.0, None, None, -100)
    return ops._generalized_jsd_loss_and_grads.default._op_dk(
        composite, student, teacher, labels, 2, 0.5, 1.0, 1.0, 1.0, None, None, -100, [True, mode == "both"])
w = torch.randn(4, 64, dtype=dtype, requires_grad=True)  # warm up at a small size
npu_loss_ops.generalized_jsd_loss(w, w.detach() * 2, None).backward()
composite_call(w.detach(), w.detach() * 2, None)
student.requires_grad_(mode != "no_grad" and path == "kernel")
teacher.requires_grad_(mode == "both" and path == "kernel")
open("/proc/self/clear_refs", "w").write("5")
before = status("VmRSS:")
if path == "composite":
    result = composite_call(student, teacher, labels)
elif mode == "no_grad":
    with torch.no_grad():
        npu_loss_ops.generalized_jsd_loss(student, teacher, labels)
else:
    npu_loss_ops.generalized_jsd_loss(student, teacher, labels).backward()
print((status("VmHWM:") - before) / (n * v * student.element_size()))
"""
# The bounds of forward + backward, in units of one N x V tensor of the logits' dtype (docs/semantics.md,
# "Distillation").
BOUNDS = {"student": 1.25, "both": 2.25, "no_grad": 0.25}
# The CPU kernels through autograd, at both shapes in both dtypes; the composite (the NPU's path on the chips
# without the aclnn path: the same ATen ops, on the CPU) through the op autograd's forward calls, at both shapes in bfloat16, where its
# float32 temporaries weigh most against the unit (it takes seconds a call on the CPU). That op is the
# composite's whole peak: the backward only scales its gradients in place. The shapes are whole: a chunk is at
# least one row, which at a quarter of the rows would already be a third of N x V.
MEMORY_CASES = [(n, v, dtype, mode, path) for n, v in ((2048, 32768), (512, 151936))
                for dtype in ("float32", "bfloat16") for mode in BOUNDS for path in ("kernel", "composite")
                if path == "kernel" or dtype == "bfloat16"]


@pytest.mark.parametrize("n,v,dtype,mode,path", MEMORY_CASES,
                         ids=[f"{n}x{v}-{d}-{m}-{p}" for n, v, d, m, p in MEMORY_CASES])
def test_memory_bounds(n, v, dtype, mode, path):
    """Chunks of rows and the gradients made in the forward: forward + backward peaks at most 1.25 N x V with
    the student's gradient, 2.25 with the teacher's too, 0.25 under no_grad (the gradients count)."""
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux's /proc/self/clear_refs")
    result = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(n), str(v), dtype, mode, path],
                            capture_output=True, text=True, cwd=package_parent(),
                            env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert result.returncode == 0, result.stderr[-2000:]
    peak = float(result.stdout.strip().splitlines()[-1])
    print(f"peak {peak:.3f} x N*V")  # shown with -s
    assert peak <= BOUNDS[mode], f"peak {peak:.3f} x N*V, bound {BOUNDS[mode]}"


@pytest.mark.parametrize("mode", list(BOUNDS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_memory_bounds_on_device(device, dtype, mode):
    """On the NPU, the allocator's peak above the inputs (torch.npu.max_memory_allocated) of a forward and
    backward through autograd, as users call it, within the same bounds, whatever the chip's path (the aclnn
    path's chunks or the composite's). A quarter of the rows are dropped."""
    if device == "cpu":
        pytest.skip("the CPU's bounds are test_memory_bounds' (the process's resident size, in a fresh process)")
    n, v = 256, 16384
    gen = torch.Generator().manual_seed(0)
    s = torch.randn(n, v, generator=gen).to(device, dtype).requires_grad_(mode != "no_grad")
    t = torch.randn(n, v, generator=gen).to(device, dtype).requires_grad_(mode == "both")
    labels = torch.arange(n).remainder(7)
    labels[::4] = -100
    labels = labels.to(device)
    torch.npu.synchronize()
    torch.npu.reset_peak_memory_stats()
    base = torch.npu.memory_allocated()
    with torch.set_grad_enabled(mode != "no_grad"):
        loss = npu_loss_ops.generalized_jsd_loss(s, t, labels, beta=0.5, temperature=2.0)
        if mode != "no_grad":
            loss.backward()
    torch.npu.synchronize()
    peak = (torch.npu.max_memory_allocated() - base) / (n * v * s.element_size())
    assert peak <= BOUNDS[mode], f"peak {peak:.3f} x N*V, bound {BOUNDS[mode]}"
