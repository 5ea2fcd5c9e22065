"""Rejects each aclnn API the package calls on this emulated chip, in turn, in this one process, and prints one
JSON line per API (and a first line with what was found). Used by test_npu_rejection.py, which runs it once per
chip family and TASK_QUEUE_ENABLE (the emulator's environment: tests/npu_emulator/emulator.py's env(), with
NPU_EMU_TRACE_PACKAGE=1 so that the trace tells the package's own first phases from torch_npu's).

    python _rejection_worker.py

1. Every case below runs once on the NPU and on the CPU: the trace's "<api>:package" counts give the aclnn APIs
   the package calls on this chip, and which case calls each; nothing may be rejected here (a call outside the
   chip's documents would be, and would pass unnoticed as the composite's result).
2. For each of those APIs: the emulator rejects it (161002) for the package's calls, the first case that calls
   it runs, then five more (that case again and the other cases that call the API first, so that a forgotten
   rejection would call it again); each result is compared with the CPU kernels'. Recorded: the warnings
   naming the API, how often its first phase was called (rejected), the package's rejected APIs. A case that
   does not return within CASE_TIMEOUT seconds ends the process with a traceback (faulthandler): a hang.
"""
import faulthandler
import json
import os
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "npu_emulator"))

import emulator  # noqa: E402

emulator.import_torch_npu()  # before npu_loss_ops, which registers its NPU kernels only with torch_npu
import torch  # noqa: E402

import npu_loss_ops  # noqa: E402
from npu_loss_ops import _C_npu  # noqa: E402
from reference import TBE_BIAS_TOLERANCE  # noqa: E402

CASE_TIMEOUT = 120  # seconds for one API's rejected call and the five after it (a few seconds when nothing hangs)
ops = torch.ops.npu_loss


def _inputs(seed, *shapes, dtype=torch.float32, positive=False):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for shape in shapes:
        t = torch.randn(*shape, generator=gen).mul(2)
        out.append((t.abs() + 0.1 if positive else t).to(dtype))
    return out


def _elementwise(seed, forward, backward, *scalars, positive=False, log_target=None):
    """The forward op and its backward op (gradient of self, or of target for KL) of an elementwise loss."""
    x, y, g = _inputs(seed, (4, 9), (4, 9), (4, 9), positive=positive)
    if log_target is not None:
        x = x.log_softmax(-1)
        y = y.log_softmax(-1) if log_target else y.softmax(-1)

    def run(dev):
        a, b = x.to(dev), y.to(dev)
        extra = scalars if log_target is None else ()
        kwargs = {"log_target": log_target} if log_target is not None else {}
        value = getattr(ops, forward)(a, b, 1, *extra, **kwargs)
        grad = getattr(ops, backward)(g.to(dev), a, b, 0, *(extra if log_target is None else (log_target,)))
        total = getattr(ops, backward)(torch.tensor(0.5, device=dev), a, b, 2,
                                       *(extra if log_target is None else (log_target,)))
        return [value, grad, total]

    return run


def _jsd(seed, beta, op, reduction, mask=(True, True), dtype=torch.float32, temperature=1.5,
         transform=(1.0, 1.0, None, None)):
    """One of the generalized JSD's three ops, with labels that drop two of six rows; `transform`: the logit
    transform's (student_logit_scale, teacher_logit_scale, student_softcap, teacher_softcap)."""
    s, t = _inputs(seed, (6, 37), (6, 37), dtype=dtype)
    labels = torch.tensor([1, -100, 2, 3, -100, 0])

    def run(dev):
        args = (s.to(dev), t.to(dev), labels.to(dev), reduction, beta, temperature, *transform, -100)
        if op == "forward":
            return [ops.generalized_jsd_loss(*args)]
        if op == "backward":
            grad = (torch.rand(4, 37, generator=torch.Generator().manual_seed(seed)).to(dtype) if reduction == 0
                    else torch.tensor(0.75, dtype=dtype))
            return list(ops.generalized_jsd_loss_backward(grad.to(dev), *args, list(mask)))
        value, gs, gt, row_scale = ops._generalized_jsd_loss_and_grads(*args, list(mask))
        scale = row_scale.unsqueeze(-1)  # float16's gradients are stored times a power of two per row
        return [value] + [g.float() * scale for g in (gs, gt) if g.numel()]

    return run


def _fused_linear(seed, beta, teacher_grad):
    """The fused linear JSD as training calls it (the student's gradients; the teacher's too if asked)."""
    xs, xt, ws, wt = _inputs(seed, (6, 8), (6, 12), (37, 8), (37, 12))
    labels = torch.tensor([1, -100, 2, 3, 36, 0])

    def run(dev):
        leaf = [t.to(dev, copy=True) for t in (xs, ws.div(3), xt, wt.div(3))]
        x = [t.requires_grad_(i < 2 or teacher_grad) for i, t in enumerate(leaf)]
        loss = npu_loss_ops.fused_linear_jsd_loss(*x, labels.to(dev), beta=beta, temperature=1.5, chunk_size=4)
        loss.backward()
        return [loss.detach()] + [t.grad for t in x if t.grad is not None]

    return run


def _sparse(seed, beta, op, reduction, mask=(True, True), softcap=None):
    """One of the sparse JSD's three ops: a support of 5 with one repeat masked, the tail on, labels that drop two
    of six rows."""
    (s,) = _inputs(seed, (6, 37))
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(37, generator=gen)[:5] for _ in range(6)])
    on = torch.ones(6, 5, dtype=torch.bool)
    ids[:, -1], on[:, -1] = ids[:, 0], False
    t = torch.randn(6, 37, generator=gen).log_softmax(-1).gather(-1, ids)
    labels = torch.tensor([1, -100, 2, 3, -100, 0])
    grad = torch.rand(4, 6, generator=gen) if reduction == 0 else torch.tensor(0.75)  # 'none': (kept, K + 1)

    def run(dev):
        args = (s.to(dev), t.to(dev), ids.to(dev), on.to(dev), labels.to(dev), reduction, beta, 1.5, True, 1.0,
                softcap, -100)
        if op == "forward":
            return [ops.sparse_jsd_loss(*args)]
        if op == "backward":
            return list(ops.sparse_jsd_loss_backward(grad.to(dev), *args, list(mask)))
        value, gs, gt, _ = ops._sparse_jsd_loss_and_grads(*args, list(mask))
        return [value] + [g for g in (gs, gt) if g.numel()]

    return run


CASES = [
    ("smooth_l1_loss beta=1", _elementwise(1, "smooth_l1_loss", "smooth_l1_loss_backward", 1.0)),
    ("smooth_l1_loss beta=0", _elementwise(2, "smooth_l1_loss", "smooth_l1_loss_backward", 0.0)),
    ("huber_loss delta=0.5", _elementwise(3, "huber_loss", "huber_loss_backward", 0.5)),
    ("l1_loss", _elementwise(4, "l1_loss", "l1_loss_backward")),
    ("mse_loss", _elementwise(5, "mse_loss", "mse_loss_backward")),
    ("kl_div log_target", _elementwise(6, "kl_div", "kl_div_target_backward", log_target=True)),
    ("kl_div probabilities", _elementwise(7, "kl_div", "kl_div_target_backward", log_target=False)),
    ("generalized_jsd_loss beta=0.5 mean", _jsd(8, 0.5, "forward", 1)),
    ("generalized_jsd_loss beta=0 sum", _jsd(9, 0.0, "forward", 2)),
    ("_generalized_jsd_loss_and_grads beta=0", _jsd(10, 0.0, "with_grads", 2)),
    ("_generalized_jsd_loss_and_grads beta=1", _jsd(11, 1.0, "with_grads", 1)),
    ("generalized_jsd_loss_backward beta=0.3 none", _jsd(12, 0.3, "backward", 0)),
    ("generalized_jsd_loss_backward beta=1 sum", _jsd(13, 1.0, "backward", 2, mask=(True, False))),
    ("_generalized_jsd_loss_and_grads beta=0.5 float16", _jsd(14, 0.5, "with_grads", 2, dtype=torch.float16)),
    ("generalized_jsd_loss beta=1 scaled", _jsd(17, 1.0, "forward", 2, transform=(2.0, 0.5, None, None))),
    ("generalized_jsd_loss beta=0.5 softcap", _jsd(18, 0.5, "forward", 1, transform=(1.0, 1.0, 3.0, None))),
    ("_generalized_jsd_loss_and_grads beta=0 softcaps", _jsd(19, 0.0, "with_grads", 2,
                                                             transform=(0.5, 2.0, 4.0, 2.5))),
    ("generalized_jsd_loss_backward beta=0.3 softcap float16 none",
     _jsd(20, 0.3, "backward", 0, dtype=torch.float16, transform=(1.5, 1.0, None, 3.0))),
    ("fused_linear_jsd_loss beta=0 student", _fused_linear(15, 0.0, False)),
    ("fused_linear_jsd_loss beta=0.5 both", _fused_linear(16, 0.5, True)),
    ("sparse_jsd_loss beta=0 mean", _sparse(21, 0.0, "forward", 1)),
    ("_sparse_jsd_loss_and_grads beta=0.5", _sparse(22, 0.5, "with_grads", 2)),
    ("sparse_jsd_loss_backward beta=1 none", _sparse(23, 1.0, "backward", 0)),
    ("_sparse_jsd_loss_and_grads beta=0 softcap", _sparse(24, 0.0, "with_grads", 2, softcap=3.0)),
]


def _problems_of(name, run):
    """Runs a case on the NPU, compares it with the CPU: a list of what is wrong (empty when right)."""
    want = run("cpu")
    try:
        got = [r.cpu() for r in run("npu")]
        torch.npu.synchronize()
    except Exception as exc:  # noqa: BLE001  (reported, not raised: the next calls must still be tried)
        return [f"{name}: raised {type(exc).__name__}: {str(exc).splitlines()[0]}"]
    problems = []
    for i, (g, w) in enumerate(zip(got, want)):
        tol = TBE_BIAS_TOLERANCE[w.dtype] if w.dtype in TBE_BIAS_TOLERANCE else 1e-5
        scale = float(w.abs().max()) if w.numel() else 0.0
        ok = g.shape == w.shape and torch.allclose(g.float(), w.float(), rtol=tol, atol=tol * scale, equal_nan=True)
        if not ok:
            problems.append(f"{name}: result {i} differs from the CPU kernels' "
                            f"(max |diff| {float((g.float() - w.float()).abs().max()) if g.shape == w.shape else 'shape'})")
    if len(got) != len(want):
        problems.append(f"{name}: {len(got)} results, the CPU gave {len(want)}")
    return problems


def main():
    emulator.pin_jit_compile_off()
    torch.npu.set_compile_mode(jit_compile=False)
    family = _C_npu.chip_family()

    # 1. what the package calls here, case by case (nothing rejected: no rejection, no warning of the package's)
    calls = {}  # api -> the indices of the cases that call it
    found_problems = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, (name, run) in enumerate(CASES):
            emulator.trace_reset()
            found_problems += _problems_of(name, run)
            trace = emulator.trace()
            found_problems += [f"{name}: {k} {v}" for k, v in trace.items() if "GetWorkspaceSize:" in k]
            for key in trace:
                if key.endswith(":package"):
                    calls.setdefault(key[: -len(":package")], []).append(i)
    found_problems += [f"warning: {w.message}" for w in caught if "rejected" in str(w.message)]
    found_problems += [f"rejected: {api}" for api in _C_npu.rejected_apis()]
    print(json.dumps({"family": family, "soc": _C_npu.soc_name(), "apis": sorted(calls),
                      "problems": found_problems}), flush=True)

    # 2. each API rejected in turn
    for api in sorted(calls):
        first = calls[api][0]
        # The rejected call, then five more: the same case again, the other cases that call the API (each would
        # call it again if the rejection were forgotten), then the cases after it in the list.
        after = [first] + calls[api][1:]
        after += [(first + k) % len(CASES) for k in range(1, len(CASES)) if (first + k) % len(CASES) not in after]
        order = [first] + after[:5]
        emulator.trace_reset()
        emulator.reject(api)
        faulthandler.dump_traceback_later(CASE_TIMEOUT, exit=True)
        problems = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i in order:
                problems += _problems_of(CASES[i][0], CASES[i][1])
        faulthandler.cancel_dump_traceback_later()
        trace = emulator.trace()
        named = [str(w.message) for w in caught if api in str(w.message) and "rejected" in str(w.message)]
        print(json.dumps({
            "api": api, "case": CASES[first][0], "after": [CASES[i][0] for i in order[1:]],
            "problems": problems, "warnings": named,
            "rejected_calls": trace.get(f"{api}GetWorkspaceSize:161002", 0),
            "other_rejections": {k: v for k, v in trace.items()
                                 if "GetWorkspaceSize:" in k and not k.startswith(f"{api}GetWorkspaceSize")},
            "package_rejected": _C_npu.rejected_apis(),
        }), flush=True)
        emulator.reject()
        _C_npu._forget_rejected_apis()


if __name__ == "__main__":
    main()
