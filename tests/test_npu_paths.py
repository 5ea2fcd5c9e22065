"""Which aclnn API each op runs on each chip family.

On any machine: docs/npu_paths.md's tables ("Which chips run which path") are the table of
the path rows of csrc/losses.h, row by row (`_C._chip_paths()`), so the two cannot drift apart.

On device="npu" under the host-emulated CANN (scripts/run_npu_emulated.sh, one process per chip): what each
op ran, read from the emulator's trace. The expected API is written out here a second time on purpose: the
path rows decide the path, this file states what the documentation promises.
"""
import importlib.util
import os
import sys

import pytest
import torch

import npu_loss_ops
from reference import TBE_BIAS_TOLERANCE, tbe_bias_ok
from samples import BACKWARD_OP

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "npu_emulator"))
import emulator  # noqa: E402

# The aclnn APIs the elementwise losses' chip paths name (what a call may run); which one each call must run is
# written out below. The row losses' paths are tested apart (test_jsd_path_per_chip).
_ELEMENTWISE_OPS = {op for d in npu_loss_ops._C._losses() if d["kind"] == "elementwise"
                    for op in (d["forward"], d["backward"])}
LOSS_APIS = {row["api"] for row in npu_loss_ops._C._chip_paths()
             if row["api"] != "composite" and row["op"] in _ELEMENTWISE_OPS}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# The tolerance each dtype's NPU result is compared with the CPU kernels' by: the largest error the paths
# accepts from the TBE kernels' beta + 1e-6 divisor (reference.py says why those numbers), which also holds
# the one-unit-in-the-last-place rounding differences of every other path.
TOLERANCE = TBE_BIAS_TOLERANCE
# The beta classes the paths distinguish: 0 (the L1 gradient), below the 950 kernel's 1e-6 limit,
# small enough that the TBE kernels' beta + 1e-6 bias exceeds float32's tolerance (and float16's at 1e-4),
# an ordinary beta, and +inf (the 950 kernel's d * (1/beta) is NaN at d = +-inf).
BETAS = [0.0, 1e-7, 1e-4, 1e-3, 1.0, float("inf")]
# Huber's deltas: the beta classes but 0 (delta > 0), around delta == 1 (the scaling and the float32 path of
# half dtypes start above it), a delta whose half-dtype scaling would leave float16's range, and +inf.
DELTAS = [1e-7, 1e-4, 1e-3, 0.25, 1.0, 3.0, 1e4, float("inf")]
HALF = (torch.float16, torch.bfloat16)


def _gen_docs():
    """scripts/gen_docs.py, the generator of the docs tables."""
    spec = importlib.util.spec_from_file_location(
        "gen_docs", os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "scripts", "gen_docs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("doc", sorted(_gen_docs().BLOCKS))
def test_doc_tables_are_generated_from_the_declarations(doc):
    """Every generated docs table (docs/npu_paths.md's path tables, reasons included; docs/semantics.md's
    schemas, "mean" divisors and result shapes and dtypes) is what scripts/gen_docs.py writes from the
    declarations (csrc/losses.h): the committed doc is the generated one."""
    gen_docs = _gen_docs()
    with open(os.path.join(gen_docs.ROOT, doc)) as f:
        committed = f.read()
    assert "| `aclnnKlDiv` |" in gen_docs.path_tables()  # the generator reads the table
    assert "mse_loss_backward.grad_input(Tensor grad_output" in gen_docs.schemas()
    assert gen_docs.regenerate(doc, committed) == committed, f"run python scripts/gen_docs.py and commit {doc}"


def test_every_op_has_path_rows():
    """Each op registered under torch.ops.npu_loss takes its NPU path from rows of the table (an out= overload
    by its functional op's), and the table has no other op."""
    registered = {name.removeprefix("npu_loss::").split(".")[0]
                  for name in torch._C._dispatch_get_all_op_names() if name.startswith("npu_loss::")}
    with_paths = {row["op"] for row in npu_loss_ops._C._chip_paths()}
    # A row loss's forward with gradients takes its forward's rows.
    with_paths |= {d["with_grads"] for d in npu_loss_ops._C._losses() if d["kind"] == "rows" and d["forward"] in with_paths}
    # So does a linear form's.
    with_paths |= {d["linear"]["with_grads"] for d in npu_loss_ops._C._losses()
                   if d["kind"] == "rows" and d["linear"] and d["linear"]["forward"] in with_paths}
    assert with_paths == registered


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dt: str(dt)[6:])
def test_beta_classes(dtype):
    """The paths' beta classes are the documented ones, and `small` is exactly where reference.py's
    tbe_bias_ok says the TBE kernels' beta + 1e-6 divisor leaves the dtype's tolerance."""
    name = str(dtype)[6:]
    classify = npu_loss_ops._C._npu_beta_class
    assert classify(0.0, name) == "0"
    assert classify(float("inf"), name) == "inf"
    assert classify(1e-7, name) == classify(0.99e-6, name) == "tiny"
    limit = {torch.float32: 0.1, torch.float16: 1e-3, torch.bfloat16: 6.25e-5}[dtype]  # the doc's limits
    assert classify(0.99 * limit, name) == "small"
    assert classify(limit, name) == classify(1.0, name) == "normal"
    for beta in [1e-6, 3e-6, 1e-5, 6e-5, 7e-5, 1e-4, 5e-4, 1e-3, 2e-3, 0.01, 0.05, 0.1, 0.2, 1.0, 1e6]:
        assert (classify(beta, name) == "small") == (not tbe_bias_ok(beta, dtype)), beta


@pytest.fixture
def npu(device):
    if device != "npu":
        pytest.skip("the aclnn paths exist only on the NPU")
    if not emulator.active():
        pytest.skip("needs the emulated CANN's trace (scripts/run_npu_emulated.sh)")
    return torch.device("npu")


def family():
    """The chip family of the emulated SoC, by the names torch_npu knows (docs/npu_paths.md's chip table)."""
    soc = npu_loss_ops.build_info()["npu_soc"]
    if soc.startswith("Ascend310B"):
        return "310B"
    if soc.startswith("Ascend950") or soc.startswith("Ascend96"):
        return "950"
    if (soc.startswith("Ascend910B") and soc != "Ascend910B") or soc.startswith("Ascend910_9"):
        return "910B"
    if soc.startswith("Ascend310P"):
        return "310P"
    if soc.startswith("Ascend910"):
        return "910"
    return "unknown"


def have(api):
    return npu_loss_ops._C_npu.aclnn_api_available(api)


def expected_api(op, dtype, beta=1.0, log_target=False):
    """The aclnn loss API the op must run, or None for the composite fallback."""
    fam = family()
    bf16 = dtype == torch.bfloat16
    if fam in ("310B", "unknown"):
        return None
    no_bf16 = fam in ("910", "310P")  # the TBE families without bf16
    if op == "huber_loss":  # smooth L1's forward with beta = delta, the composite at delta == +inf
        ok = beta < float("inf") and have("aclnnSmoothL1Loss") and not (no_bf16 and bf16)
        return "aclnnSmoothL1Loss" if ok else None
    if op == "huber_loss_backward":  # smooth L1's gradient with beta = delta, the composite at delta == +inf
        if beta == float("inf"):
            return None
        return expected_api("smooth_l1_loss_backward", dtype, beta)
    if op == "smooth_l1_loss_backward":
        if fam == "950":
            if beta == 0:
                return "aclnnL1LossBackward" if have("aclnnL1LossBackward") else None
            ok = 1e-6 <= beta < float("inf") and have("aclnnSmoothL1LossBackward")
            return "aclnnSmoothL1LossBackward" if ok else None
        if no_bf16 and bf16:
            return None
        ok = tbe_bias_ok(beta, dtype) and have("aclnnSmoothL1LossBackward")
        return "aclnnSmoothL1LossBackward" if ok else None
    if op in ("smooth_l1_loss", "l1_loss", "l1_loss_backward"):
        api = {"smooth_l1_loss": "aclnnSmoothL1Loss", "l1_loss": "aclnnL1Loss",
               "l1_loss_backward": "aclnnL1LossBackward"}[op]
        return api if have(api) and not (no_bf16 and bf16) else None
    if op == "mse_loss":
        return "aclnnMseLoss" if have("aclnnMseLoss") and not (no_bf16 and bf16) else None
    if op == "mse_loss_backward":  # not on 910; on 310P in fp32/fp16
        ok = (fam in ("910B", "950") or (fam == "310P" and not bf16)) and have("aclnnMseLossBackward")
        return "aclnnMseLossBackward" if ok else None
    if op == "kl_div_target_backward":
        return "aclnnKlDivTargetBackward" if fam in ("910B", "950") and have("aclnnKlDivTargetBackward") else None
    if op == "kl_div":
        if not have("aclnnKlDiv"):
            return None
        if fam == "950" or (fam == "910B" and log_target) or (no_bf16 and log_target and not bf16):
            return "aclnnKlDiv"
        return None
    raise AssertionError(op)


def call(op, dtype, beta, log_target, dev):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, generator=gen)
    t = torch.rand(3, 5, generator=gen) + 0.1 if op.startswith("kl") else torch.randn(3, 5, generator=gen)
    g = torch.randn(3, 5, generator=gen)
    x, t, g = (v.to(dtype) for v in (x, t, g))
    ops = torch.ops.npu_loss
    args = {
        "smooth_l1_loss": lambda x, t, g: ops.smooth_l1_loss(x, t, 0, beta),
        "smooth_l1_loss_backward": lambda x, t, g: ops.smooth_l1_loss_backward(g, x, t, 0, beta),
        "l1_loss": lambda x, t, g: ops.l1_loss(x, t, 0),
        "l1_loss_backward": lambda x, t, g: ops.l1_loss_backward(g, x, t, 0),
        "kl_div": lambda x, t, g: ops.kl_div(x, t, 0, log_target=log_target),
        "kl_div_target_backward": lambda x, t, g: ops.kl_div_target_backward(g, x, t, 0, log_target),
        "huber_loss": lambda x, t, g: ops.huber_loss(x, t, 0, beta),
        "huber_loss_backward": lambda x, t, g: ops.huber_loss_backward(g, x, t, 0, beta),
        "mse_loss": lambda x, t, g: ops.mse_loss(x, t, 0),
        "mse_loss_backward": lambda x, t, g: ops.mse_loss_backward(g, x, t, 0),
    }[op]
    emulator.trace_reset()
    got = args(x.to(dev), t.to(dev), g.to(dev)).cpu()
    torch.npu.synchronize()
    trace = emulator.trace()
    want = args(x, t, g)
    return got, want, trace


CASES = (
    [("smooth_l1_loss_backward", dt, beta, False) for dt in DTYPES for beta in BETAS]
    + [("smooth_l1_loss", dt, 1.0, False) for dt in DTYPES]
    + [(op, dt, 1.0, False) for op in ("l1_loss", "l1_loss_backward", "mse_loss", "mse_loss_backward")
       for dt in DTYPES]
    + [(op, dt, 1.0, lt) for op in ("kl_div", "kl_div_target_backward") for dt in DTYPES for lt in (False, True)]
    + [(op, dt, delta, False) for op in ("huber_loss", "huber_loss_backward") for dt in DTYPES for delta in DELTAS]
)


@pytest.mark.parametrize("op,dtype,beta,log_target", CASES,
                         ids=[f"{op}-{str(dt)[6:]}-beta{beta:g}-log{int(lt)}" for op, dt, beta, lt in CASES])
def test_aclnn_api_per_chip(npu, op, dtype, beta, log_target):
    got, want, trace = call(op, dtype, beta, log_target, npu)
    ran = {name for name in trace if name in LOSS_APIS}
    api = expected_api(op, dtype, beta, log_target)
    assert ran == ({api} if api else set()), f"{op} on {family()}: ran {sorted(ran)}, expected {api or 'composite'}"
    assert not [k for k in trace if k.startswith("aclop:")], f"the aclop path was taken: {trace}"
    assert not [k for k in trace if "GetWorkspaceSize:" in k], f"an aclnn call was rejected: {trace}"
    torch.testing.assert_close(got, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


def huber_launches(op, dtype, delta):
    """Every aclnn launch a Huber call makes where its row names the aclnn API (docs/npu_paths.md, the
    launch table): smooth L1's kernel, plus one scaling of the result (forward) or of grad_output (backward)
    unless delta == 1; with a half dtype the forward's two inputs and the backward's grad_output (delta != 1)
    are first copied to float32."""
    api = "aclnnSmoothL1Loss" if op == "huber_loss" else "aclnnSmoothL1LossBackward"
    if delta == 1:
        return {api: 1}
    in_float32 = dtype in HALF
    if op == "huber_loss":
        return {api: 1, "aclnnInplaceCopy": 2, "aclnnMuls": 1} if in_float32 else {api: 1, "aclnnInplaceMuls": 1}
    return {api: 1, "aclnnInplaceCopy": 1, "aclnnInplaceMuls": 1} if in_float32 else {api: 1, "aclnnMuls": 1}


HUBER_LAUNCH_CASES = [(op, dt, red, delta) for op in ("huber_loss", "huber_loss_backward") for dt in DTYPES
                      for red in (0, 1, 2) for delta in (0.25, 1.0, 3.0)]


@pytest.mark.parametrize("op,dtype,reduction,delta", HUBER_LAUNCH_CASES,
                         ids=[f"{op}-{str(dt)[6:]}-red{red}-delta{delta:g}" for op, dt, red, delta in HUBER_LAUNCH_CASES])
def test_huber_launches(npu, op, dtype, reduction, delta):
    """Huber on smooth L1's kernels: the aclnn calls of one call, each counted, per reduction (the scaling
    of 'mean'/'sum' touches a 0-dim tensor, of 'none' a full-size one)."""
    gen = torch.Generator().manual_seed(2)
    x, t = (torch.randn(3, 5, generator=gen).mul(4).to(dtype) for _ in range(2))
    g = torch.randn((3, 5) if reduction == 0 else (), generator=gen).to(dtype)
    args = (x, t, reduction, delta) if op == "huber_loss" else (g, x, t, reduction, delta)
    fn = getattr(torch.ops.npu_loss, op)
    dev_args = [a.to(npu) if isinstance(a, torch.Tensor) else a for a in args]
    torch.npu.synchronize()
    emulator.trace_reset()
    got = fn(*dev_args)
    torch.npu.synchronize()
    trace = emulator.trace()
    launches = {k: v for k, v in trace.items() if k.startswith("aclnn") and ":" not in k}
    api = expected_api(op, dtype, delta)
    if api is None:
        assert not set(launches) & LOSS_APIS, launches
    else:
        assert launches == huber_launches(op, dtype, delta), f"{op} on {family()}: {launches}"
    assert not [k for k in trace if "GetWorkspaceSize:" in k or k.startswith("aclop:")], trace
    torch.testing.assert_close(got.cpu(), fn(*args), rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=lambda dt: str(dt)[6:])
def test_huber_half_dtype_range(npu, dtype):
    """delta * smooth L1 where the half dtype cannot hold smooth L1's value or delta * grad_output: float16
    'none' at delta = 1e4 and d = 1e-2 is 5e-5 (smooth L1's 5e-9 underflows float16), and its gradient at
    grad_output = 10 is 0.1 (delta * 10 overflows float16); at delta = 0.5 and d = 1.2e5 (beyond float16)
    huber is 6e4 (smooth L1's 1.2e5 overflows)."""
    x = torch.tensor([1e-2, 0.0, -2.0, 3e4], dtype=dtype)
    t = torch.zeros(4, dtype=dtype)
    g = torch.full((4,), 10.0, dtype=dtype)
    for reduction in (0, 1, 2):
        got = torch.ops.npu_loss.huber_loss(x.to(npu), t.to(npu), reduction, 1e4).cpu()
        want = torch.ops.npu_loss.huber_loss(x, t, reduction, 1e4)
        torch.testing.assert_close(got, want, rtol=TOLERANCE[dtype], atol=0)
        grad = g if reduction == 0 else g[0]
        got = torch.ops.npu_loss.huber_loss_backward(grad.to(npu), x.to(npu), t.to(npu), reduction, 1e4).cpu()
        want = torch.ops.npu_loss.huber_loss_backward(grad, x, t, reduction, 1e4)
        torch.testing.assert_close(got, want, rtol=TOLERANCE[dtype], atol=0)
    assert torch.ops.npu_loss.huber_loss(x[:1].to(npu), t[:1].to(npu), 0, 1e4).item() > 0
    x, t = torch.tensor([6e4, 1.0], dtype=dtype), torch.tensor([-6e4, 0.0], dtype=dtype)
    for reduction in (0, 1, 2):
        got = torch.ops.npu_loss.huber_loss(x.to(npu), t.to(npu), reduction, 0.5).cpu()
        torch.testing.assert_close(got, torch.ops.npu_loss.huber_loss(x, t, reduction, 0.5),
                                   rtol=TOLERANCE[dtype], atol=0)
    assert torch.ops.npu_loss.huber_loss(x.to(npu), t.to(npu), 0, 0.5)[0].item() < float("inf")


def test_chip_reported_before_first_op(npu):
    info = npu_loss_ops.build_info()
    assert info["npu_kernels"] is True
    assert info["npu_soc"] == os.environ["NPU_EMU_SOC"]
    assert info["npu_chip"] == npu_loss_ops._C_npu.chip_family_of(info["npu_soc"])


# Every SoC name torch_npu 2.13 knows, with the family it must map to (docs/npu_paths.md's chip table).
SOC_FAMILIES = {
    **{f"Ascend910{s}": "Ascend910 " for s in ("PremiumA", "ProA", "A", "ProB", "B")},
    **{f"Ascend310P{i}": "Ascend310P " for i in (1, 2, 3, 4, 5, 7)},
    **{f"Ascend910B{s}": "Ascend910B/Ascend910_93" for s in ("1", "2", "2C", "3", "4", "4-1")},
    **{f"Ascend910_93{i}": "Ascend910B/Ascend910_93" for i in ("91", "92", "81", "82", "72", "62", "63")},
    **{f"Ascend310B{i}": "composite fallback only" for i in (1, 2, 3, 4)},
    "Ascend950DT_9571": "Ascend950", "Ascend950PR_9599": "Ascend950", "Ascend960": "Ascend950",
    "Ascend310": "composite fallback only", "": "composite fallback only",
}


@pytest.mark.parametrize("soc,family_name", sorted(SOC_FAMILIES.items()))
def test_soc_name_to_family(npu, soc, family_name):
    assert npu_loss_ops._C_npu.chip_family_of(soc).startswith(family_name)


def test_older_cann_without_the_loss_apis_runs_the_composite(npu):
    """An emulated CANN without the loss APIs: every op must take the composite, never fail in the macro."""
    missing = [api for api in sorted(LOSS_APIS) if not have(api)]
    if not missing:
        pytest.skip("this CANN has every loss API (the older-CANN run uses emulator lib-without-loss-apis)")
    assert missing == sorted(LOSS_APIS)
    for op, dtype, beta, log_target in CASES[::3]:
        got, want, trace = call(op, dtype, beta, log_target, npu)
        assert not set(trace) & LOSS_APIS
        torch.testing.assert_close(got, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


# ---- the generalized JSD: its aclnn path or the chunked composite, per chip, beta class and dtype ----

JSD_PATH_APIS = {"aclnnLogAddExp", "aclnnKlDivTargetBackward", "aclnnLogSoftmaxBackward"}

# The logit transform (student_logit_scale, teacher_logit_scale, student_softcap, teacher_softcap): none, the
# scales alone (folded into the scaling of the logits over T), the student's softcap, and both sides' of each.
TRANSFORMS = {"none": (1.0, 1.0, None, None), "scale": (2.0, 0.5, None, None), "softcap": (1.0, 1.0, 3.0, None),
              "both": (0.5, 2.0, 4.0, 2.5)}


def softcapped(transform):
    return transform is not None and (transform[2] is not None or transform[3] is not None)


def jsd_row_api(gradients, dtype, beta, transform=None):
    """The API the generalized JSD's row names for a call (docs/npu_paths.md), or None for the composite:
    Ascend 910B/910_93 and 950 in every dtype; never on 910 (the current aclnnExp document lists no Atlas
    training series), 310P (nor aclnnAdd, aclnnSub, aclnnDivs there) and 310B. A softcapped call's row names
    the softcap's aclnnInplaceTanh (ops-math lists it on 910, 910B/910_93 and 950); a scaled one's is the
    untransformed call's."""
    fam = family()
    ends = beta in (0.0, 1.0)
    if fam not in ("910B", "950"):
        return None
    if softcapped(transform):
        if not have("aclnnInplaceTanh") or (ends and gradients and not have("aclnnKlDivTargetBackward")):
            return None
        return "aclnnInplaceTanh"
    if not ends:
        return "aclnnLogAddExp"
    if gradients:
        return "aclnnKlDivTargetBackward" if have("aclnnKlDivTargetBackward") else None
    return "aclnnLogSoftmax"


JSD_CASES = [(op, dt, beta, mask) for op in ("forward", "backward", "with_grads") for dt in DTYPES
             for beta in (0.0, 0.5, 1.0)
             for mask in ([(True, True)] if op == "forward" else [(True, True), (True, False), (False, True)])]


@pytest.mark.parametrize("op,dtype,beta,mask", JSD_CASES,
                         ids=[f"{op}-{str(dt)[6:]}-beta{beta:g}-{int(m[0])}{int(m[1])}" for op, dt, beta, m in JSD_CASES])
def test_jsd_path_per_chip(npu, op, dtype, beta, mask):
    """What each call of the three ops ran, from the trace: on an aclnn row, aclnnLogSoftmax, aclnnLogAddExp for
    the mixture, and for the gradients aclnnLogSoftmaxBackward, with aclnnKlDivTargetBackward for the teacher's at
    beta 0 and the student's at beta 1; on a composite row none of those three and the composite's aclnnDivs
    (its logits over T). No call of the aclnn path outside its API's documented chips and dtypes, no call
    rejected; the results within tolerance of the CPU kernels'."""
    want, got, trace = _cpu_and_traced_npu(_jsd_call(4, op, dtype, beta, mask, TRANSFORMS["none"]), npu)
    _assert_jsd_path(trace, op != "forward", dtype, beta, mask, op)
    assert "aclnnDivs" not in trace or jsd_row_api(op != "forward", dtype, beta) is None, trace
    _assert_close_to_cpu(got, want, dtype)


JSD_TRANSFORM_CASES = [(op, dt, beta, transform, mask) for op in ("forward", "backward", "with_grads")
                       for dt in DTYPES for beta in (0.0, 0.5, 1.0) for transform in ("scale", "softcap", "both")
                       for mask in {"forward": [(True, True)], "backward": [(True, True)],
                                    "with_grads": [(True, True), (False, True)]}[op]]


@pytest.mark.parametrize(
    "op,dtype,beta,transform,mask", JSD_TRANSFORM_CASES,
    ids=[f"{op}-{str(dt)[6:]}-beta{beta:g}-{tr}-{int(m[0])}{int(m[1])}" for op, dt, beta, tr, m in JSD_TRANSFORM_CASES])
def test_jsd_transform_path_per_chip(npu, op, dtype, beta, transform, mask):
    """A call that transforms its logits (the scales, a softcap), from the trace: on Ascend 910B/910_93 and 950 the
    aclnn path, the softcap's aclnnInplaceTanh (and, for a softcapped side's gradient, its slope's aclnnMul and
    aclnnAdds) before the calls of its beta class, and never the composite's tanh; on 910, 310P and 310B the
    composite (torch_npu's tanh, and none of the package's calls). The results within tolerance of the CPU's."""
    tr = TRANSFORMS[transform]
    want, got, trace = _cpu_and_traced_npu(_jsd_call(6, op, dtype, beta, mask, tr), npu)
    gradients = op != "forward"
    _assert_jsd_path(trace, gradients, dtype, beta, mask, f"{op} ({transform})", tr)
    api = jsd_row_api(gradients, dtype, beta, tr)
    if api is None:
        assert "aclnnInplaceTanh" not in trace, f"{family()}: the composite ran the package's tanh: {trace}"
        assert ("aclnnTanh" in trace) == softcapped(tr), f"{family()}: the composite's tanh: {trace}"
    else:
        assert "aclnnTanh" not in trace, f"{family()}: the composite's tanh ran on an aclnn row: {trace}"
        assert ("aclnnInplaceTanh" in trace) == softcapped(tr), trace
        slopes = gradients and any(m and tr[2 + side] is not None for side, m in enumerate(mask))
        assert not slopes or {"aclnnMul", "aclnnAdds"} <= set(trace), trace
    _assert_close_to_cpu(got, want, dtype)


def _jsd_call(seed, op, dtype, beta, mask, transform):
    """run(device) for one of the generalized JSD's three ops ("forward", "backward", "with_grads") on 5 rows of 37
    logits, two of them dropped, 'sum', T = 1.5 and the logit transform `transform`: its results, float16's
    stored gradients times their row scales."""
    gen = torch.Generator().manual_seed(seed)
    s, t = (torch.randn(5, 37, generator=gen).mul(3).to(dtype) for _ in range(2))
    labels = torch.tensor([1, -100, 2, 3, -100])
    ops = torch.ops.npu_loss

    def run(dev):
        args = (s.to(dev), t.to(dev), labels.to(dev), 2, beta, 1.5, *transform, -100)
        if op == "forward":
            return [ops.generalized_jsd_loss(*args)]
        if op == "backward":
            return list(ops.generalized_jsd_loss_backward(torch.tensor(0.75, dtype=dtype, device=dev), *args,
                                                          list(mask)))
        value, gs, gt, row_scale = ops._generalized_jsd_loss_and_grads(*args, list(mask))
        scale = row_scale.unsqueeze(-1)  # float16's gradients are stored times a power of two per row
        return [value, gs.float() * scale if gs.numel() else gs, gt.float() * scale if gt.numel() else gt]

    return run


def _cpu_and_traced_npu(run, npu):
    """run("cpu"), run(npu) on the host, and the emulator's trace of the NPU call."""
    want = run("cpu")
    torch.npu.synchronize()
    emulator.trace_reset()
    got = [r.cpu() for r in run(npu)]
    torch.npu.synchronize()
    return want, got, emulator.trace()


def _assert_jsd_path(trace, gradients, dtype, beta, mask, what, transform=None):
    """The generalized JSD's row for this call, from the trace: on an aclnn row aclnnLogSoftmax, aclnnLogAddExp for
    the mixture, and with gradients aclnnLogSoftmaxBackward (aclnnKlDivTargetBackward for the teacher's at beta 0
    and the student's at beta 1); on a composite row none of the three and the composite's aclnnDivs. No call
    rejected or outside its API's documented chips and dtypes."""
    api = jsd_row_api(gradients, dtype, beta, transform)
    assert not [k for k in trace if "GetWorkspaceSize:" in k or k.startswith("aclop:")], trace
    ran = set(trace) & JSD_PATH_APIS
    if api is None:
        # torch_npu's own kernels, which on 310P and 310B include APIs their documents do not list there
        assert not ran and "aclnnDivs" in trace, f"{family()}: expected the composite, the trace is {trace}"
        return
    assert not [k for k in trace if k.endswith(":undocumented")], trace
    assert "aclnnLogSoftmax" in trace, trace
    expected = {"aclnnLogAddExp"} if beta not in (0.0, 1.0) else set()
    if gradients:
        expected.add("aclnnLogSoftmaxBackward")
        if (beta == 0.0 and mask[1]) or (beta == 1.0 and mask[0]):
            expected.add("aclnnKlDivTargetBackward")
    assert ran == expected, f"{what} on {family()}: ran {sorted(ran)}, expected {sorted(expected)}"


def _assert_close_to_cpu(got, want, dtype):
    """Each result within its dtype's tolerance of its largest element."""
    for g, w in zip(got, want):
        tol = TOLERANCE[dtype]
        torch.testing.assert_close(g, w, rtol=tol, atol=tol * float(w.abs().max()) if w.numel() else 0.0)


# ---- the sparse JSD: its aclnn path (910B, 910_93) or the chunked composite, per chip ----

# Calls its aclnn path makes and its composite never does (the composite's gradient is index_put_'s, not a
# scatter, and no log-softmax backward).
SPARSE_PATH_APIS = {"aclnnLogSoftmaxBackward", "aclnnScatter"}


def sparse_row_api(gradients, softcap):
    """The API the sparse JSD's row names for a call (docs/npu_paths.md), or None for the composite: Ascend
    910B/910_93 alone (ops-nn's aclnnGather document lists the A2 and A3 series only), aclnnGather for the
    forward, aclnnScatter with gradients, a softcapped call's aclnnInplaceTanh."""
    if family() != "910B":
        return None
    if softcap is not None:
        return "aclnnInplaceTanh" if have("aclnnInplaceTanh") else None
    return "aclnnScatter" if gradients else "aclnnGather"


SPARSE_CASES = [(op, dt, beta, red, softcap, mask) for op in ("forward", "backward", "with_grads") for dt in DTYPES
                for beta in (0.0, 0.5, 1.0) for red in ((2, 0) if op != "with_grads" else (2, 1))
                for softcap in (None, 3.0)
                for mask in ([(True, True)] if op == "forward" else [(True, True), (False, True), (True, False)])]


@pytest.mark.parametrize(
    "op,dtype,beta,reduction,softcap,mask", SPARSE_CASES,
    ids=[f"{op}-{str(dt)[6:]}-beta{beta:g}-r{red}-cap{c}-{int(m[0])}{int(m[1])}"
         for op, dt, beta, red, c, m in SPARSE_CASES])
def test_sparse_path_per_chip(npu, op, dtype, beta, reduction, softcap, mask):
    """What each call of the sparse JSD's three ops ran, from the trace: on an aclnn row (910B, 910_93)
    aclnnLogSoftmax and aclnnGather, and for the student's gradient aclnnScatter and aclnnLogSoftmaxBackward (a
    softcap's aclnnInplaceTanh first); on a composite row neither of those two and the composite's aclnnDivs (its
    logits over T). No call of the aclnn path outside its API's documented chips and dtypes, none rejected; the
    results within tolerance of the CPU kernel's."""
    want, got, trace = _cpu_and_traced_npu(_sparse_call(op, dtype, beta, reduction, softcap, mask), npu)
    gradients = op != "forward"
    assert not [k for k in trace if "GetWorkspaceSize:" in k or k.startswith("aclop:")], trace
    ran = set(trace) & SPARSE_PATH_APIS
    api = sparse_row_api(gradients, softcap)
    if api is None:
        assert not ran and "aclnnDivs" in trace, f"{family()}: expected the composite, the trace is {trace}"
        assert "aclnnInplaceTanh" not in trace, trace
    else:
        assert not [k for k in trace if k.endswith(":undocumented")], trace
        assert {"aclnnLogSoftmax", "aclnnGather"} <= set(trace), trace
        assert ran == (SPARSE_PATH_APIS if gradients and mask[0] else set()), f"{op} on {family()}: ran {ran}"
        assert ("aclnnInplaceTanh" in trace) == (softcap is not None), trace
    _assert_close_to_cpu(got, want, dtype)


def _sparse_call(op, dtype, beta, reduction, softcap, mask):
    """run(device) for one of the sparse JSD's three ops on 5 rows of 37 logits and a support of 6 (one repeat
    masked per row, the tail on), two rows dropped, T = 1.5, the student's scale 1.2 and `softcap`: its results,
    float16's stored gradients times their row scales. Reduction 0 ('none') gives the backward a (kept, 7)
    grad_output."""
    gen = torch.Generator().manual_seed(9)
    s = torch.randn(5, 37, generator=gen).mul(3).to(dtype)
    ids = torch.stack([torch.randperm(37, generator=gen)[:6] for _ in range(5)])
    support = torch.ones(5, 6, dtype=torch.bool)
    ids[:, -1], support[:, -1] = ids[:, 0], False
    t = torch.randn(5, 37, generator=gen).mul(2).log_softmax(-1).gather(-1, ids).to(dtype)
    labels = torch.tensor([1, -100, 2, 3, -100])
    grad_output = torch.linspace(0.5, 1.5, 21).view(3, 7).to(dtype) if reduction == 0 else torch.tensor(0.75).to(dtype)
    ops = torch.ops.npu_loss

    def run(dev):
        args = (s.to(dev), t.to(dev), ids.to(dev), support.to(dev), labels.to(dev), reduction, beta, 1.5, True, 1.2,
                softcap, -100)
        if op == "forward":
            return [ops.sparse_jsd_loss(*args)]
        if op == "backward":
            return list(ops.sparse_jsd_loss_backward(grad_output.to(dev), *args, list(mask)))
        value, gs, gt, row_scale = ops._sparse_jsd_loss_and_grads(*args, list(mask))
        scale = row_scale.unsqueeze(-1)  # float16's gradients are stored times a power of two per row
        return [value, gs.float() * scale if gs.numel() else gs, gt.float() * scale if gt.numel() else gt]

    return run


# The matmuls of the fused linear JSD's chunks (torch_npu's addmm and mm).
MATMUL_APIS = {"aclnnAddmm", "aclnnMm", "aclnnMatmul", "aclnnInplaceAddmm"}


# Which inputs require grad: none (an evaluation: the step follows the forward's rows), the student's (distillation's
# usual call), both (the step follows the backward's rows).
GRADS = {"none": (False, False), "student": (True, False), "both": (True, True)}


@pytest.mark.parametrize("transform", ["none", "both"])
@pytest.mark.parametrize("grads", list(GRADS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dt: str(dt)[6:])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_fused_linear_jsd_path_per_chip(npu, dtype, beta, grads, transform):
    """The fused linear JSD runs, per chunk, torch_npu's matmuls and then the generalized JSD's row (the same
    APIs test_jsd_path_per_chip expects): its forward's row without gradients, its backward's with them, as
    docs/npu_paths.md's "with gradients" and "without gradients" rows say; never a rejected call; its results
    within tolerance of the CPU kernels'. A transformed call's chunks are transformed before the row (by
    torch_npu's ops: the hard loss reads them too), which is then the untransformed call's."""
    gen = torch.Generator().manual_seed(5)
    xs, xt = torch.randn(6, 8, generator=gen), torch.randn(6, 12, generator=gen)
    ws, wt = torch.randn(37, 8, generator=gen) / 3, torch.randn(37, 12, generator=gen) / 3
    labels = torch.tensor([1, -100, 2, 3, 36, 0])
    mask = GRADS[grads]

    def run(dev):
        x = [t.detach().to(dtype).to(dev).requires_grad_(mask[i >= 2]) for i, t in enumerate((xs, ws, xt, wt))]
        keywords = dict(zip(("student_logit_scale", "teacher_logit_scale", "student_softcap", "teacher_softcap"),
                            TRANSFORMS[transform]))
        loss = npu_loss_ops.fused_linear_jsd_loss(*x, labels.to(dev), beta=beta, temperature=1.5,
                                                  weight_hard_loss=0.5, chunk_size=4, **keywords)
        if not any(mask):
            return [loss]
        loss.backward()
        return [loss.detach()] + [t.grad for t in x if t.grad is not None]

    want, got, trace = _cpu_and_traced_npu(run, npu)
    assert set(trace) & MATMUL_APIS, f"no matmul in the trace: {trace}"
    _assert_jsd_path(trace, any(mask), dtype, beta, mask, f"fused_linear_jsd_loss ({grads}, {transform})")
    assert bool({"aclnnTanh", "aclnnInplaceTanh"} & set(trace)) == softcapped(TRANSFORMS[transform]), trace
    # The driver softcaps in float32 and keeps the slope in float32, as the CPU's step does in its passes
    # (docs/semantics.md): the same tolerance with the transform as without.
    _assert_close_to_cpu(got, want, dtype)


FRACTAL_NZ = 29


@pytest.mark.parametrize("op", list(BACKWARD_OP.values()))
def test_private_format_tensors(npu, op):
    """NZ tensors (which aclnnKlDivTargetBackward rejects with 161002) are converted to ND for the call, and an
    NZ out= tensor keeps its format and gets the values."""
    import torch_npu

    if family() != "950":
        # torch_npu casts to NZ through aclnnNpuFormatCast only on Ascend 950 (with a CANN of this
        # emulator's version); elsewhere it takes an aclop kernel the emulator does not have.
        pytest.skip("the emulated CANN records private formats on Ascend 950")
    # torch_npu keeps tensors in ND unless internal formats are allowed (a write-only option, off by default).
    torch.npu.config.allow_internal_format = True
    try:
        _private_format_case(op, torch_npu)
    finally:
        torch.npu.config.allow_internal_format = False


def _private_format_case(op, torch_npu):
    gen = torch.Generator().manual_seed(1)
    x, g = torch.randn(16, 16, generator=gen), torch.randn(16, 16, generator=gen)
    t = torch.rand(16, 16, generator=gen) + 0.1
    nz = [torch_npu.npu_format_cast(v.npu(), FRACTAL_NZ) for v in (g, x, t)]
    assert [torch_npu.get_npu_format(v) for v in nz] == [FRACTAL_NZ] * 3
    extra = {"smooth_l1_loss_backward": (0, 0.5), "l1_loss_backward": (0,), "kl_div_target_backward": (0, False),
             "huber_loss_backward": (0, 0.5), "mse_loss_backward": (0,)}[op]
    fn, out_fn = getattr(torch.ops.npu_loss, op).default, getattr(torch.ops.npu_loss, op).overloads()
    want = fn(g, x, t, *extra)
    emulator.trace_reset()
    got = fn(*nz, *extra)
    out = torch_npu.npu_format_cast(torch.zeros(16, 16).npu(), FRACTAL_NZ)
    out_overload = getattr(getattr(torch.ops.npu_loss, op), [o for o in out_fn if o != "default"][0])
    out_overload(*nz, *extra, **{"grad_target" if op.startswith("kl") else "grad_input": out})
    trace = emulator.trace()
    assert not [k for k in trace if "GetWorkspaceSize:" in k], f"an aclnn call was rejected: {trace}"
    api = expected_api(op, torch.float32, 0.5)
    if api:
        assert trace.get(api) == 2, trace
    assert torch_npu.get_npu_format(out) == FRACTAL_NZ
    fp32 = TOLERANCE[torch.float32]
    torch.testing.assert_close(got.cpu(), want, rtol=fp32, atol=fp32)
    torch.testing.assert_close(out.cpu(), want, rtol=fp32, atol=fp32)
