"""sparse_jsd_loss: the divergence against a served teacher's top-k log-probabilities (docs/semantics.md,
"Distillation from a served teacher"), held to its float64 reference (tests/reference.py, sparse_jsd_reference,
itself checked against TRL 1.16's own functions in tests/with_trl/test_sparse_reference.py): values and every
gradient over beta, K, the tail, masks, labels, every reduction, num_items_in_batch, T, the transform, views and
dtypes; through the CPU kernels at every instruction set and through the ATen composite (what the NPU and other
devices run); gradcheck, opcheck, torch.compile, the same bits at 1 and 2 threads, and each rejection."""
import itertools
import math

import pytest
import torch

import npu_loss_ops
from npu_loss_ops import functional as F_ops
from reference import sparse_jsd_reference

COMPOSITE = torch._C.DispatchKey.CompositeExplicitAutograd
OPS = ("sparse_jsd_loss", "sparse_jsd_loss_backward", "_sparse_jsd_loss_and_grads")
REDUCTIONS = ["batchmean", "sum", "mean", "none"]
BETAS = [0.0, 0.3, 0.5, 1.0]
KS = [1, 2, 8, 64]
# Each dtype's tolerance against the float64 reference on the same (rounded) inputs: rtol, atol relative to the
# largest magnitude of the compared tensor.
TOLERANCE = {torch.float64: (1e-10, 1e-12), torch.float32: (2e-5, 2e-6), torch.bfloat16: (2e-2, 8e-3),
             torch.float16: (4e-3, 1e-3)}


def _support(rows, vocab, k, mask_kind, generator):
    """ids (rows, K) of distinct tokens per row, and the mask: None, or with repeats masked ('dups'), one row all
    masked ('row_off'), or TRL's padding (id 0, masked) at each row's end ('padding')."""
    ids = torch.stack([torch.randperm(vocab, generator=generator)[:k] for _ in range(rows)])
    if mask_kind is None:
        return ids, None
    mask = torch.ones(rows, k, dtype=torch.bool)
    if mask_kind == "dups" and k > 1:
        ids[:, -1] = ids[:, 0]  # a repeat, masked
        mask[:, -1] = False
    elif mask_kind == "row_off":
        mask[rows // 2] = False
    elif mask_kind == "padding" and k > 1:
        ids[::2, k // 2:] = 0
        mask[::2, k // 2:] = False
    return ids, mask


def _case(shape=(2, 3), vocab=97, k=8, dtype=torch.float32, mask_kind=None, labels=False, teacher_dtype=None,
          seed=0, teacher_grad=True):
    g = torch.Generator().manual_seed(seed)
    rows = math.prod(shape)
    student = (torch.randn(*shape, vocab, generator=g, dtype=torch.float64) * 2).to(dtype)
    teacher_logits = torch.randn(rows, vocab, generator=g, dtype=torch.float64) * 2
    ids, mask = _support(rows, vocab, k, mask_kind, g)
    teacher = teacher_logits.log_softmax(-1).gather(-1, ids).to(teacher_dtype or dtype)
    lab = None
    if labels:
        lab = torch.randint(0, vocab, shape, generator=g)
        lab.view(-1)[::3] = -100
    return dict(student=student.requires_grad_(), teacher=teacher.view(*shape, k).requires_grad_(teacher_grad),
                ids=ids.view(*shape, k), mask=None if mask is None else mask.view(*shape, k), labels=lab)


def _run(fn, c, **kw):
    """The loss and the gradients (student, teacher) of its sum weighted by a fixed cotangent."""
    student = c["student"].detach().clone().requires_grad_()
    teacher = c["teacher"].detach().clone().requires_grad_(c["teacher"].requires_grad)
    loss = fn(student, teacher, c["ids"], c["labels"], support_mask=c["mask"], **kw)
    cotangent = torch.linspace(0.5, 1.5, loss.numel(), dtype=torch.float64).view(loss.shape).to(loss.device,
                                                                                                 loss.dtype)
    inputs = [student] + ([teacher] if teacher.requires_grad else [])
    grads = torch.autograd.grad((loss * cotangent).sum(), inputs, allow_unused=True)
    return loss, grads


def _reference(student, teacher, ids, labels, support_mask=None, **kw):
    return sparse_jsd_reference(student.double(), teacher.double(), ids, labels, support_mask, **kw)


def _assert_close(ours, ref, dtype, what):
    rtol, atol = TOLERANCE[dtype]
    ref = ref.double()
    finite = torch.isfinite(ref)
    # Where TRL's own gradient is NaN (a row all masked without the tail), the op gives a finite one.
    assert torch.isfinite(ours[~finite]).all(), f"{what}: not finite where the reference is NaN"
    scale = ref[finite].abs().max().item() if finite.any() else 1.0
    torch.testing.assert_close(ours.double()[finite], ref[finite], rtol=rtol, atol=atol * max(scale, 1e-30),
                               msg=lambda m: f"{what}: {m}")


def _check(c, dtype=torch.float32, **kw):
    ours, ours_grads = _run(F_ops.sparse_jsd_loss, c, **kw)
    ref, ref_grads = _run(_reference, c, **kw)
    assert ours.dtype == torch.promote_types(c["student"].dtype, c["teacher"].dtype)
    assert ours.shape == ref.shape
    _assert_close(ours, ref, dtype, "value")
    for name, a, b in zip(("student", "teacher"), ours_grads, ref_grads):
        assert a.dtype == (c["student"] if name == "student" else c["teacher"]).dtype
        assert a.shape == b.shape
        _assert_close(a, b, dtype, f"{name}'s gradient")


@pytest.mark.parametrize("beta,k,tail,reduction", list(itertools.product(BETAS, KS, [True, False], REDUCTIONS)))
def test_matches_reference(beta, k, tail, reduction):
    _check(_case(k=k, mask_kind="dups" if k > 2 else None, seed=k), beta=beta, add_tail=tail, reduction=reduction)


@pytest.mark.parametrize("mask_kind", ["dups", "row_off", "padding"])
@pytest.mark.parametrize("tail", [True, False])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("labels", [False, True])
def test_masks_and_labels(mask_kind, tail, beta, labels):
    for reduction in REDUCTIONS:
        _check(_case(k=8, mask_kind=mask_kind, labels=labels), beta=beta, add_tail=tail, reduction=reduction)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_dtypes(dtype, beta):
    for tail, reduction in itertools.product([True, False], ["batchmean", "none"]):
        _check(_case(k=8, dtype=dtype, labels=True, mask_kind="dups"), dtype, beta=beta, add_tail=tail,
               reduction=reduction)


def test_mixed_dtypes():
    """A float32 teacher with bfloat16 logits: the result in float32, each gradient in its input's dtype."""
    _check(_case(k=8, dtype=torch.bfloat16, teacher_dtype=torch.float32), torch.bfloat16, beta=0.5)


@pytest.mark.parametrize("temperature,scale,softcap", [(2.0, 1.0, None), (0.7, 1.0, None), (1.0, 0.5, None),
                                                       (1.0, 1.0, 3.0), (1.5, 2.0, 5.0)])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_temperature_and_transform(temperature, scale, softcap, beta):
    for tail in (True, False):
        _check(_case(k=8, labels=True), beta=beta, add_tail=tail, temperature=temperature,
               student_logit_scale=scale, student_softcap=softcap)


@pytest.mark.parametrize("num_items", [7, 7.5, torch.tensor(7)])
def test_num_items_in_batch(num_items):
    for beta in (0.0, 0.5):
        _check(_case(k=8, labels=True), beta=beta, reduction="mean", num_items_in_batch=num_items)


def test_views():
    """Non-contiguous logits, teacher, ids and mask (a slice of the sequence, a transposed batch) are read as
    they are."""
    c = _case(shape=(3, 5), k=8, labels=True, mask_kind="dups")
    base = torch.randn(5, 3, 97, dtype=torch.float64).float()
    student = base.transpose(0, 1)
    student.copy_(c["student"].detach())
    view = dict(c, student=student[:, 1:].requires_grad_(), teacher=c["teacher"].detach()[:, 1:].requires_grad_(),
                ids=c["ids"][:, 1:], mask=c["mask"][:, 1:], labels=c["labels"][:, 1:])
    assert not view["student"].is_contiguous() and not view["ids"].is_contiguous()
    for beta in (0.0, 0.5):
        _check(view, beta=beta, reduction="none")
        _check(view, beta=beta)


def test_composite_matches_cpu_kernel():
    """The ATen composite (what the NPU runs, and every other device) gives the CPU kernel's results."""
    c = _case(k=8, labels=True, mask_kind="dups")
    ops = torch.ops.npu_loss
    for beta, tail, reduction in itertools.product([0.0, 0.5, 1.0], [True, False], [0, 1, 2]):
        args = (c["student"].detach(), c["teacher"].detach(), c["ids"], c["mask"], c["labels"], reduction, beta, 1.3,
                tail, 1.0, None, -100)
        cpu = ops.sparse_jsd_loss(*args)
        comp = ops.sparse_jsd_loss.default._op_dk(COMPOSITE, *args)
        torch.testing.assert_close(comp, cpu, rtol=1e-5, atol=1e-6)
        go = torch.rand_like(cpu) + 0.5
        for got, want in zip(ops.sparse_jsd_loss_backward.default._op_dk(COMPOSITE, go, *args, [True, True]),
                             ops.sparse_jsd_loss_backward(go, *args, [True, True])):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        if reduction:
            for got, want in zip(ops._sparse_jsd_loss_and_grads.default._op_dk(COMPOSITE, *args, [True, True]),
                                 ops._sparse_jsd_loss_and_grads(*args, [True, True])):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("isa", npu_loss_ops.build_info()["cpu_isas_available"])
def test_every_instruction_set(isa):
    """The kernel of each instruction set this CPU runs (chosen once per process: a fresh one each), held to the
    reference in the three dtypes the vector kernels compute in float lanes."""
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    code = (
        f"import sys; sys.path.insert(0, {here!r}); import torch, npu_loss_ops, test_sparse_jsd as t;"
        "[t._check(t._case(k=8, labels=True, mask_kind='dups', dtype=d), d, beta=b, add_tail=a, reduction=r) "
        " for d in (torch.float32, torch.bfloat16, torch.float16) for b in (0.0, 0.5) for a in (True, False)"
        " for r in ('batchmean', 'none')];"
        "print(npu_loss_ops.build_info()['cpu_isa'])")
    result = subprocess.run([sys.executable, "-c", code], env={**os.environ, "NPU_LOSS_OPS_CPU_ISA": isa},
                            capture_output=True, text=True, cwd=os.path.dirname(here))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == isa


def test_gradcheck():
    c = _case(shape=(2, 2), vocab=11, k=4, dtype=torch.float64, labels=True, mask_kind="dups")
    for beta, tail in itertools.product([0.0, 0.3, 1.0], [True, False]):
        for reduction in REDUCTIONS:
            def fn(s, t):
                return F_ops.sparse_jsd_loss(s, t, c["ids"], c["labels"], support_mask=c["mask"], beta=beta,
                                             add_tail=tail, reduction=reduction, temperature=1.5)
            s, t = c["student"].detach().requires_grad_(), c["teacher"].detach().requires_grad_()
            assert torch.autograd.gradcheck(fn, (s, t))
            if reduction != "none":
                assert torch.autograd.gradgradcheck(fn, (s, t))


def test_opcheck():
    c = _case(k=8, labels=True, mask_kind="dups")
    for reduction, tail in itertools.product([0, 1, 2], [True, False]):
        args = (c["student"].detach().requires_grad_(), c["teacher"].detach().requires_grad_(), c["ids"], c["mask"],
                c["labels"] if reduction else None, reduction, 0.5, 1.0, tail, 1.0, None, -100)
        torch.library.opcheck(torch.ops.npu_loss.sparse_jsd_loss.default, args)


def test_compile_matches_eager():
    c = _case(k=8, labels=True, mask_kind="dups")

    def fn(s, t, ids, labels, mask):
        return F_ops.sparse_jsd_loss(s, t, ids, labels, support_mask=mask, beta=0.5, temperature=1.5)

    compiled = torch.compile(fn, fullgraph=True)
    eager, eager_grads = _run(lambda s, t, i, l, support_mask: fn(s, t, i, l, support_mask), c)
    got, got_grads = _run(lambda s, t, i, l, support_mask: compiled(s, t, i, l, support_mask), c)
    torch.testing.assert_close(got, eager, rtol=0, atol=0)
    for a, b in zip(got_grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_same_bits_at_one_and_two_threads():
    c = _case(shape=(4, 8), vocab=4099, k=64, labels=True, mask_kind="dups")
    threads = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2):
            torch.set_num_threads(n)
            results.append(_run(F_ops.sparse_jsd_loss, c, beta=0.5))
    finally:
        torch.set_num_threads(threads)
    (a, ga), (b, gb) = results
    assert torch.equal(a, b)
    assert all(torch.equal(x, y) for x, y in zip(ga, gb))


def test_module():
    c = _case(k=8, labels=True)
    module = npu_loss_ops.SparseJSDLoss(beta=0.5, temperature=2.0, add_tail=False)
    assert "add_tail=False" in repr(module)
    torch.testing.assert_close(
        module(c["student"], c["teacher"], c["ids"], c["labels"]),
        F_ops.sparse_jsd_loss(c["student"], c["teacher"], c["ids"], c["labels"], beta=0.5, temperature=2.0,
                              add_tail=False))
    with pytest.raises(ValueError, match="beta"):
        npu_loss_ops.SparseJSDLoss(beta=1.5)


# ---- rejections ----


def _args(**over):
    c = _case(k=4, mask_kind="dups")
    kw = dict(student_logits=c["student"].detach(), teacher_logprobs=c["teacher"].detach(),
              teacher_token_ids=c["ids"], support_mask=c["mask"])
    kw.update(over)
    return kw


REJECTIONS = [
    (dict(teacher_token_ids=torch.full((2, 3, 4), 97)), IndexError, r"teacher_token_ids must be in \[0, 97\).*row 0"),
    (dict(teacher_token_ids=torch.full((2, 3, 4), -1)), IndexError, r"teacher_token_ids must be in \[0, 97\)"),
    (dict(teacher_token_ids=torch.zeros(2, 3, 4, dtype=torch.long), support_mask=None), ValueError,
     r"teacher_token_ids has the id 0 twice in row 0"),
    (dict(teacher_token_ids=torch.zeros(2, 3, 4)), TypeError, "teacher_token_ids must have an integer dtype"),
    (dict(support_mask=torch.ones(2, 3, 4)), TypeError, "support_mask must be a bool tensor"),
    (dict(teacher_token_ids=torch.zeros(2, 3, 5, dtype=torch.long)), RuntimeError,
     "teacher_token_ids must have teacher_logprobs's shape"),
    (dict(teacher_logprobs=torch.zeros(2, 4, 4), teacher_token_ids=torch.zeros(2, 4, 4, dtype=torch.long),
          support_mask=None), RuntimeError, "teacher_logprobs must have student_logits's leading"),
    (dict(teacher_logprobs=torch.zeros(2, 3, 0), teacher_token_ids=torch.zeros(2, 3, 0, dtype=torch.long),
          support_mask=None), RuntimeError, "teacher_logprobs must have at least one entry per row"),
    (dict(teacher_logprobs=torch.zeros(2, 3, 4, dtype=torch.long)), TypeError, "teacher_logprobs"),
    (dict(beta=1.5), ValueError, "beta"),
    (dict(temperature=0.0), ValueError, "temperature"),
    (dict(student_softcap=-1.0), ValueError, "student_softcap"),
    (dict(student_logit_scale=0.0), ValueError, "student_logit_scale"),
    (dict(add_tail=1), TypeError, "add_tail must be a bool"),
    (dict(reduction="avg"), ValueError, "reduction"),
    (dict(num_items_in_batch=0), ValueError, "sparse_jsd_loss: num_items_in_batch must be > 0"),
    (dict(labels=torch.zeros(2, 3)), TypeError, "labels must have an integer dtype"),
]


@pytest.mark.parametrize("over,error,match", REJECTIONS, ids=[r[2][:40] for r in REJECTIONS])
def test_rejections(over, error, match):
    with pytest.raises(error, match=match):
        F_ops.sparse_jsd_loss(**_args(**over))


def test_rejections_reach_the_composite():
    """The composite (the NPU's path for this member) checks the ids as the CPU kernel does."""
    kw = _args(teacher_token_ids=torch.full((2, 3, 4), 97))
    args = (kw["student_logits"], kw["teacher_logprobs"], kw["teacher_token_ids"], kw["support_mask"], None, 1, 0.0,
            1.0, True, 1.0, None, -100)
    with pytest.raises(IndexError, match=r"teacher_token_ids must be in \[0, 97\)"):
        torch.ops.npu_loss.sparse_jsd_loss.default._op_dk(COMPOSITE, *args)


def test_dropped_rows_are_not_checked():
    """An id out of range in a row the labels drop is never read, so it is no error."""
    kw = _args()
    labels = torch.zeros(2, 3, dtype=torch.long)
    labels[0, 0] = -100
    ids = kw["teacher_token_ids"].clone()
    ids[0, 0] = 1000
    F_ops.sparse_jsd_loss(**dict(kw, teacher_token_ids=ids, labels=labels))


# ---- memory: the process's peak resident size above the inputs, in a fresh process ----

MEMORY_PROBE = r"""
import sys, torch, npu_loss_ops
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
n, v, k, dtype = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), getattr(torch, sys.argv[4])
gen = torch.Generator().manual_seed(0)
student = torch.randn(n, v, generator=gen).to(dtype)
teacher, ids = torch.randn(n, v, generator=gen).log_softmax(-1).topk(k, -1)
teacher = teacher.to(dtype)
labels = torch.randint(0, v, (n,), generator=gen)
labels[torch.rand(n, generator=gen) < 0.25] = -100
w = torch.randn(4, 64, dtype=dtype, requires_grad=True)  # warm up at a small size
npu_loss_ops.sparse_jsd_loss(w, w.detach()[:, :2], torch.arange(2).expand(4, 2)).backward()
student.requires_grad_()
teacher.requires_grad_()
open("/proc/self/clear_refs", "w").write("5")
before = status("VmRSS:")
npu_loss_ops.sparse_jsd_loss(student, teacher, ids, labels, beta=0.5).backward()
print((status("VmHWM:") - before) / (n * v * student.element_size()))
"""


@pytest.mark.parametrize("n,v,dtype", [(2048, 32768, "float32"), (2048, 32768, "bfloat16"),
                                       (512, 151936, "float32")])
def test_memory_bound(n, v, dtype):
    """Forward + backward, the student's and the teacher's gradients included, peaks at most 1.1 N x V of the
    logits' dtype above the inputs (the student's gradient is one)."""
    import os
    import subprocess
    import sys

    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux's /proc/self/clear_refs")
    result = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(n), str(v), "64", dtype], capture_output=True,
                            text=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert result.returncode == 0, result.stderr[-2000:]
    peak = float(result.stdout.strip().splitlines()[-1])
    print(f"peak {peak:.3f} x N*V")
    assert peak <= 1.1, f"peak {peak:.3f} x N*V, bound 1.1"


def test_forward_ad_and_vmap():
    """torch.func's forward-mode AD and vmap (through the composite's whole-tensor form) give the reference's."""
    c = _case(k=8, dtype=torch.float64, labels=True, mask_kind="dups")
    s, t = c["student"].detach(), c["teacher"].detach()
    ts, tt = torch.randn_like(s), torch.randn_like(t)
    for beta, tail, reduction in itertools.product([0.0, 0.5], [True, False], ["batchmean", "none"]):
        def ours(a, b):
            return F_ops.sparse_jsd_loss(a, b, c["ids"], c["labels"], support_mask=c["mask"], beta=beta,
                                         add_tail=tail, reduction=reduction)

        def ref(a, b):
            return sparse_jsd_reference(a, b, c["ids"], c["labels"], c["mask"], beta=beta, add_tail=tail,
                                        reduction=reduction)
        got, want = torch.func.jvp(ours, (s, t), (ts, tt)), torch.func.jvp(ref, (s, t), (ts, tt))
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    batch = torch.stack([s, s * 0.5])

    def row_loss(a):
        return F_ops.sparse_jsd_loss(a, t, c["ids"], support_mask=c["mask"], beta=0.5, reduction="sum")
    got = torch.vmap(row_loss)(batch)
    want = torch.stack([sparse_jsd_reference(a, t, c["ids"], None, c["mask"], beta=0.5, reduction="sum")
                        for a in batch])
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_export():
    """torch.export of a module that computes the loss (labels, 'batchmean'): the op is in the graph and the
    exported program gives eager's value."""

    class Distill(torch.nn.Module):
        def forward(self, student, teacher, ids, labels, mask):
            return npu_loss_ops.SparseJSDLoss(beta=0.5)(student, teacher, ids, labels, mask)

    c = _case(k=8, labels=True, mask_kind="dups")
    args = (c["student"].detach(), c["teacher"].detach(), c["ids"], c["labels"], c["mask"])
    program = torch.export.export(Distill(), args)
    targets = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert "npu_loss.sparse_jsd_loss.default" in targets
    torch.testing.assert_close(program.module()(*args), Distill()(*args))


def test_torchscript_calls_the_op():
    """TorchScript calls the op (the Python function's keyword-only arguments are not scriptable, as for the
    generalized JSD): the same bits as the function."""
    import warnings

    c = _case(k=8, labels=True, mask_kind="dups")

    def fn(s, t, ids, mask, labels):
        return torch.ops.npu_loss.sparse_jsd_loss(s, t, ids, mask, labels, 2, 0.5, 2.0, True, 1.0, None, -100)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script is deprecated in torch 2.13
        scripted = torch.jit.script(fn)
    args = (c["student"].detach(), c["teacher"].detach(), c["ids"], c["mask"], c["labels"])
    assert torch.equal(scripted(*args), F_ops.sparse_jsd_loss(
        args[0], args[1], args[2], args[4], support_mask=args[3], beta=0.5, temperature=2.0, reduction="sum"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_on_device(device, dtype):
    """On the device (the NPU under scripts/run_npu_emulated.sh: its composite, on every chip), the CPU's values
    and gradients, every beta class, the tail on and off, labels, 'none' and a reduction."""
    if device == "cpu":
        pytest.skip("compares a device with the CPU")
    tolerance = {torch.float32: (1e-5, 1e-6), torch.bfloat16: (2e-2, 1e-2), torch.float16: (4e-3, 1e-3)}[dtype]
    for beta, tail, reduction in itertools.product([0.0, 0.5, 1.0], [True, False], ["batchmean", "none"]):
        c = _case(k=8, dtype=dtype, labels=True, mask_kind="dups")
        on_device = {k: (v.detach().to(device).requires_grad_(v.requires_grad) if isinstance(v, torch.Tensor) else v)
                     for k, v in c.items()}
        got, got_grads = _run(F_ops.sparse_jsd_loss, on_device, beta=beta, add_tail=tail, reduction=reduction)
        want, want_grads = _run(F_ops.sparse_jsd_loss, c, beta=beta, add_tail=tail, reduction=reduction)
        assert got.device.type == device
        for a, b in zip((got, *got_grads), (want, *want_grads)):
            torch.testing.assert_close(a.cpu(), b, rtol=tolerance[0], atol=tolerance[1])
