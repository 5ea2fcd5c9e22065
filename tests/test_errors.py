"""The error matrix: docs/validation.md's table, for every op and overload, on every path, run once, in
subprocesses (tests/_matrix_worker.py), so that a crash (segfault, abort) is counted instead of taking the
test run down with it.

Every case runs on the C++ CPU kernels, the composite fallback, fake tensors, meta tensors (the Meta
kernels, which run csrc/core/checks.cpp's rules on SymInt sizes) and the composite fallback on meta tensors,
and must raise the class docs/validation.md names, with the very same message on every path (only the
device a message names follows the tensors: meta for meta tensors). Inputs that must be accepted are cases
too, accepted on every path.

On the NPU (the `device` runs, conftest.py) every case also runs on NPU tensors — the NPU kernels and fake
NPU tensors — with the CPU's class and message (the device named, and the NPU's dtype list without
float64), plus what only the NPU rejects: float64 (TypeError) and tensors mixed between the CPU and the
NPU (RuntimeError). After each NPU call a small NPU op checks that the device still works (a call aclnn
rejected would leave torch_npu's task queue dead), and on the emulated CANN its trace must show no call
aclnn rejected and no aclop fallback."""
from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import warnings
from typing import Callable

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import npu_loss_ops

COMPOSITE = torch._C.DispatchKey.CompositeExplicitAutograd
ops = torch.ops.npu_loss


# ---------------------------------------------------------------------------------------------------
# The twelve overloads, called with valid arguments that a case then spoils


@dataclasses.dataclass
class Call:
    op: torch._ops.OpOverload
    names: list  # positional argument names
    args: list
    kwargs: dict

    def replaced(this, /, **changes) -> "Call":  # noqa: N805  ("self" is an argument name here)
        args, kwargs = list(this.args), dict(this.kwargs)
        for name, value in changes.items():
            if name in this.names:
                args[this.names.index(name)] = value
            else:
                kwargs[name] = value
        return Call(this.op, this.names, args, kwargs)

    def get(self, name):
        return self.args[self.names.index(name)] if name in self.names else self.kwargs[name]


def _inputs(shape=(4, 5)):
    x = torch.randn(shape)
    t = torch.rand(shape) + 0.1
    g = torch.randn(shape)
    return x, t, g


def base_call(overload: str) -> Call:
    x, t, g = _inputs()
    out = torch.empty(4, 5)
    table = {
        "smooth_l1_loss": Call(ops.smooth_l1_loss.default, ["self", "target", "reduction", "beta"],
                               [x, t, 0, 1.0], {}),
        "smooth_l1_loss_backward": Call(ops.smooth_l1_loss_backward.default,
                                        ["grad_output", "self", "target", "reduction", "beta"], [g, x, t, 0, 1.0], {}),
        "smooth_l1_loss_backward.grad_input": Call(ops.smooth_l1_loss_backward.grad_input,
                                                   ["grad_output", "self", "target", "reduction", "beta"],
                                                   [g, x, t, 0, 1.0], {"grad_input": out}),
        "l1_loss": Call(ops.l1_loss.default, ["self", "target", "reduction"], [x, t, 0], {}),
        "l1_loss_backward": Call(ops.l1_loss_backward.default, ["grad_output", "self", "target", "reduction"],
                                 [g, x, t, 0], {}),
        "l1_loss_backward.grad_input": Call(ops.l1_loss_backward.grad_input,
                                            ["grad_output", "self", "target", "reduction"], [g, x, t, 0],
                                            {"grad_input": out}),
        "kl_div": Call(ops.kl_div.default, ["self", "target", "reduction"], [x, t, 0], {"log_target": False}),
        "kl_div_target_backward": Call(ops.kl_div_target_backward.default,
                                       ["grad_output", "self", "target", "reduction", "log_target"],
                                       [g, x, t, 0, False], {}),
        "kl_div_target_backward.grad_target": Call(ops.kl_div_target_backward.grad_target,
                                                   ["grad_output", "self", "target", "reduction", "log_target"],
                                                   [g, x, t, 0, False], {"grad_target": out}),
        "huber_loss": Call(ops.huber_loss.default, ["self", "target", "reduction", "delta"], [x, t, 0, 1.0], {}),
        "huber_loss_backward": Call(ops.huber_loss_backward.default,
                                    ["grad_output", "self", "target", "reduction", "delta"], [g, x, t, 0, 1.0], {}),
        # ATen names this overload "out"; its out tensor is grad_input.
        "huber_loss_backward.out": Call(ops.huber_loss_backward.out,
                                        ["grad_output", "self", "target", "reduction", "delta"],
                                        [g, x, t, 0, 1.0], {"grad_input": out}),
        "mse_loss": Call(ops.mse_loss.default, ["self", "target", "reduction"], [x, t, 0], {}),
        "mse_loss_backward": Call(ops.mse_loss_backward.default, ["grad_output", "self", "target", "reduction"],
                                  [g, x, t, 0], {}),
        "mse_loss_backward.grad_input": Call(ops.mse_loss_backward.grad_input,
                                             ["grad_output", "self", "target", "reduction"], [g, x, t, 0],
                                             {"grad_input": out}),
    }
    return table[overload]


OVERLOADS = [
    "smooth_l1_loss", "smooth_l1_loss_backward", "smooth_l1_loss_backward.grad_input",
    "l1_loss", "l1_loss_backward", "l1_loss_backward.grad_input",
    "kl_div", "kl_div_target_backward", "kl_div_target_backward.grad_target",
    "huber_loss", "huber_loss_backward", "huber_loss_backward.out",
    "mse_loss", "mse_loss_backward", "mse_loss_backward.grad_input",
]

MAX_DIMS = 8  # docs/validation.md, rule 6


def _op_name(overload: str) -> str:
    return overload.split(".")[0]


def _tensor_args(call: Call) -> list[str]:
    return [n for n in call.names if n in ("grad_output", "self", "target")]


def _out_name(call: Call):
    return next(iter(call.kwargs), None) if call.op._overloadname in ("grad_input", "grad_target", "out") else None


def _map(call: Call, fn: Callable) -> Call:
    conv = lambda v: fn(v) if isinstance(v, torch.Tensor) else v  # noqa: E731
    return Call(call.op, call.names, [conv(a) for a in call.args], {k: conv(v) for k, v in call.kwargs.items()})


def _to_device(call, device):
    """The call on `device`: views of one storage stay views of one copy (overlap cases stay overlaps), the
    same strides (an expanded out= stays expanded); meta tensors stay on meta."""
    storages = {}

    def convert(t):
        if t.device.type != "cpu":
            return t
        key = t.untyped_storage().data_ptr()
        if key not in storages:
            extent = t.untyped_storage().nbytes() // t.element_size()
            storages[key] = t.as_strided((extent,), (1,), 0).to(device)
        return storages[key].as_strided(t.shape, t.stride(), t.storage_offset())

    return _map(call, convert)


def _keep_on_cpu(name: str) -> Callable:
    """A case's placement on `device`: every tensor moves there except `name`, which stays on the CPU."""
    def place(call: Call, device: str) -> Call:
        kept = call.get(name)
        return _map(call, lambda t: t.to(device)).replaced(**{name: kept})
    return place


# ---------------------------------------------------------------------------------------------------
# The cases


@dataclasses.dataclass
class Case:
    id: str
    exc: type | None  # the class docs/validation.md names; None: the call must be accepted
    words: list  # what the message must contain
    call: Call
    meta_ok: bool = True  # False: the case mixes devices on purpose (it has no all-meta version)
    device_ok: bool = True  # False: its outcome is the CPU's only (float64; a CPU tensor among meta ones)
    message: str | None = None  # the exact message, where the table fixes it
    fake_ok: bool = True  # False: FakeTensorMode cannot hold the case's tensors (quantized dtypes)
    # An NPU-only case: it runs on the device paths only, placed there by this function of (call, device).
    device_only: Callable | None = None


def _cases(overload: str) -> list[Case]:
    """What each overload must reject (docs/validation.md's rules, in its order)."""
    base = base_call(overload)
    op = _op_name(overload)
    out = _out_name(base)
    cases = []
    for name in _tensor_args(base):
        arg = base.get(name)
        for dtype in (torch.int32, torch.int64, torch.bool, torch.uint8, torch.complex64):
            cases.append(Case(f"{name}-{dtype}", TypeError, [op, name, "dtype"],
                              base.replaced(**{name: arg.to(dtype)})))
        cases.append(Case(f"{name}-9dim", RuntimeError, [op, name, "9", "8"],
                          base.replaced(**{name: arg.reshape(4, 5, 1, 1, 1, 1, 1, 1, 1)}),
                          message=f"{op}: {name} has {MAX_DIMS + 1} dimensions, but at most {MAX_DIMS} are supported"))
        cases.append(Case(f"{name}-None", RuntimeError, [op, name, "None"], base.replaced(**{name: None})))
        cases.append(Case(f"{name}-on-meta", RuntimeError, [op, name, "device"],
                          base.replaced(**{name: arg.to("meta")}), meta_ok=False))
    for reduction in (3, -1, 100):
        cases.append(Case(f"reduction{reduction}", ValueError, [op, "reduction", str(reduction)],
                          base.replaced(reduction=reduction)))
    if "beta" in base.names:
        for beta in (-1.0, -1e-300, math.nan, -math.inf):
            cases.append(Case(f"beta{beta}", ValueError, [op, "beta"], base.replaced(beta=beta)))
    if "delta" in base.names:
        # delta > 0 and not NaN (F raises RuntimeError: docs/semantics.md's differences)
        for delta in (0.0, -0.0, -1.0, -1e-300, math.nan, -math.inf):
            cases.append(Case(f"delta{delta}", ValueError, [op, "delta", "> 0"], base.replaced(delta=delta),
                              message=f"{op}: delta must be > 0, got 0" if delta == 0 and math.copysign(1, delta) > 0
                              else None))
    # shapes that do not broadcast
    cases.append(Case("target-not-broadcastable", RuntimeError, [op, "broadcast"],
                      base.replaced(target=torch.rand(4, 3) + 0.1)))
    cases.append(Case("self-not-broadcastable", RuntimeError, [op, "broadcast"],
                      base.replaced(self=torch.randn(3, 5))))
    if "grad_output" in base.names:
        cases.append(Case("grad_output-not-broadcastable", RuntimeError, [op, "grad_output"],
                          base.replaced(grad_output=torch.randn(4, 2))))
    if op == "kl_div_target_backward":
        for shape in [(2, 4, 5), (3, 1, 1)]:
            cases.append(Case(f"grad_output-enlarging-{shape}", RuntimeError, [op, "grad_output"],
                              base.replaced(grad_output=torch.randn(shape))))
    if out:
        o = base.kwargs[out]
        for shape in [(4, 4), (20,), (), (1, 4, 5)]:
            cases.append(Case(f"{out}-shape{shape}", RuntimeError, [op, out, "shape"],
                              base.replaced(**{out: torch.empty(shape)})))
        for dtype in (torch.int32, torch.int64, torch.bool, torch.complex64):
            cases.append(Case(f"{out}-{dtype}", TypeError, [op, out, "dtype"],
                              base.replaced(**{out: o.to(dtype)})))
        if out == "grad_target":
            for dtype in (torch.float64, torch.float16, torch.bfloat16):
                cases.append(Case(f"{out}-{dtype}-not-target-dtype", TypeError, [op, out, "dtype"],
                                  base.replaced(**{out: o.to(dtype)})))
        cases.append(Case(f"{out}-expanded", RuntimeError, [op, out, "overlap"],
                          base.replaced(**{out: torch.empty(1, 5).expand(4, 5)})))
        cases.append(Case(f"{out}-on-meta", RuntimeError, [op, out, "device"],
                          base.replaced(**{out: o.to("meta")}), meta_ok=False))
        cases.append(Case(f"{out}-None", RuntimeError, [op, out, "None"], base.replaced(**{out: None})))
        for name in _tensor_args(base):
            buf = torch.randn(40) + 2
            partial_in = buf[:20].view(4, 5)
            partial_out = buf[1:21].view(4, 5)
            cases.append(Case(f"{out}-partially-overlaps-{name}", RuntimeError, [op, out, "overlaps", name],
                              base.replaced(**{name: partial_in, out: partial_out})))
            # same memory, different strides: not an exact alias either
            sq = torch.rand(5, 5) + 0.1
            cases.append(Case(f"{out}-transposed-alias-of-{name}", RuntimeError, [op, out, "overlaps", name],
                              base.replaced(**{name: sq[:4], out: sq.t()[:4]})))
        if out == "grad_target":
            # KL's result has target's shape, not the broadcast shape: no alias of target allowed
            t = torch.rand(1, 5) + 0.1
            cases.append(Case(f"{out}-alias-of-broadcast-target", RuntimeError, [op, out, "overlaps", "target"],
                              base.replaced(target=t, **{out: t})))
    return cases


def _with_dims(call: Call, ndim: int, names) -> Call:
    """The call with each tensor argument in `names` given `ndim` dims (leading 1s before its 4 x 5)."""
    return call.replaced(**{n: call.get(n).reshape((1,) * (ndim - 2) + (4, 5)) for n in names})


def _accepted_cases() -> list[Case]:
    """What must NOT be rejected, on any path."""
    def ok(case_id, call, **kw):
        return Case(case_id, None, [], call, **kw)

    cases = [ok("float64-on-cpu", _map(base_call("smooth_l1_loss_backward"), lambda t: t.double()),
                device_ok=False)]
    for ov in OVERLOADS:
        base = base_call(ov)
        cases.append(ok(f"{ov}-mixed-float-dtypes", base.replaced(self=torch.randn(4, 5, dtype=torch.float16))))
        # MAX_DIMS dims in every tensor argument and out= tensor at once
        out = _out_name(base)
        cases.append(ok(f"{ov}-{MAX_DIMS}-dims", _with_dims(base, MAX_DIMS, _tensor_args(base) + ([out] if out else []))))
    for ov in ("smooth_l1_loss_backward.grad_input", "l1_loss_backward.grad_input", "huber_loss_backward.out",
               "mse_loss_backward.grad_input"):
        base = base_call(ov)
        x = base.get("self").clone()
        cases.append(ok(f"{ov}-exact-alias-of-self", base.replaced(self=x, grad_input=x)))
        cases.append(ok(f"{ov}-out-float64", base.replaced(grad_input=torch.empty(4, 5, dtype=torch.float64)),
                        device_ok=False))
        cases.append(ok(f"{ov}-out-bfloat16", base.replaced(grad_input=torch.empty(4, 5, dtype=torch.bfloat16))))
    base = base_call("kl_div_target_backward.grad_target")
    t = base.get("target").clone()
    cases.append(ok("kl-exact-alias-of-target", base.replaced(target=t, grad_target=t)))
    cases.append(ok("smooth-beta-0", base_call("smooth_l1_loss").replaced(beta=0.0)))
    cases.append(ok("smooth-beta-inf", base_call("smooth_l1_loss").replaced(beta=math.inf)))
    for ov in ("huber_loss", "huber_loss_backward", "huber_loss_backward.out"):
        for delta in (math.inf, 5e-324, 1e-3, 1e30, 1e300):
            cases.append(ok(f"{ov}-delta{delta:g}", base_call(ov).replaced(delta=delta)))
    cases.append(ok("kl-grad-not-enlarging", base_call("kl_div_target_backward").replaced(grad_output=torch.randn(5))))
    return cases


def _device_cases(overload: str, device: str) -> list[Case]:
    """What depends on the device. On the CPU run: float64 accepted, and a CPU tensor among meta ones
    rejected like any device mix. On a device: float64 rejected on the NPU, and tensors mixed between the
    CPU and the device rejected (NPU-only cases)."""
    base = base_call(overload)
    op = _op_name(overload)
    out = _out_name(base)
    cases = []
    for name in _tensor_args(base) + ([out] if out else []):
        float64 = base.replaced(**{name: base.get(name).double()})
        if name == "grad_target":
            pass  # grad_target must have target's dtype on every device: `grad_target-torch.float64-...`
        elif device == "cpu":
            if out == "grad_target" and name == "target":
                cases.append(Case(f"{name}-float64", TypeError, [op, "grad_target", "dtype"], float64,
                                  device_ok=False))
            else:
                cases.append(Case(f"{name}-float64", None, [], float64, device_ok=False))
        elif device == "npu":
            cases.append(Case(f"{name}-float64-on-{device}", TypeError, [op, name, "dtype", "float64", "npu"],
                              float64, device_only=_to_device))
        if device == "cpu":
            cases.append(Case(f"{name}-on-cpu-others-on-meta", RuntimeError, [op, name, "device", "cpu"],
                              _keep_on_cpu(name)(base, "meta"), meta_ok=False, device_ok=False))
        else:
            cases.append(Case(f"{name}-on-cpu-others-on-{device}", RuntimeError, [op, name, "device", "cpu"],
                              base, device_only=_keep_on_cpu(name)))
    return cases


ALL_DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)
ACCEPTED_ON_CPU = {torch.float32, torch.float64, torch.float16, torch.bfloat16}  # docs/validation.md, rule 3


def _empty(shape, dtype):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # complex32 is "experimental", the quantized dtypes are deprecated
        return torch.empty(shape, dtype=dtype)


def _dtype_cases(overload: str) -> list[Case]:
    """Every dtype torch has, in every tensor argument and out= tensor: accepted exactly where
    docs/validation.md says (float32, float64, float16, bfloat16 on the CPU; grad_target only in target's
    dtype), rejected with a TypeError naming the dtype everywhere else. On the CPU paths only (a device
    need not hold every dtype): the device runs cover the dtypes of `_cases`."""
    base = base_call(overload)
    op = _op_name(overload)
    out = _out_name(base)
    cases = []
    for name in _tensor_args(base) + ([out] if out else []):
        # grad_target follows target's dtype (rule 10 is not the rule under test)
        names = [name, out] if (name, out) == ("target", "grad_target") else [name]
        for dtype in ALL_DTYPES:
            call = base.replaced(**{n: _empty(base.get(n).shape, dtype) for n in names})
            accepted = dtype == base.get("target").dtype if name == "grad_target" else dtype in ACCEPTED_ON_CPU
            dtype_name = str(dtype).removeprefix("torch.")
            cases.append(Case(f"{name}-every-dtype-{dtype_name}", None if accepted else TypeError,
                              [op, name, "dtype", f"got {dtype_name}"], call, device_ok=False,
                              fake_ok=not call.get(name).is_quantized))
    return cases


def all_cases(device: str) -> list[tuple[str, Case]]:
    """The whole matrix for a run on `device`, as (overload or "accepted", case); the same list, in the same
    order, in the test and in every worker."""
    cases = [(ov, c) for ov in OVERLOADS for c in _cases(ov)]
    cases += [("accepted", c) for c in _accepted_cases()]
    cases += [(ov, c) for ov in OVERLOADS for c in _device_cases(ov, device)]
    if device == "cpu":  # CPU paths only: the CPU suite runs them
        cases += [(ov, c) for ov in OVERLOADS for c in _dtype_cases(ov)]
    return cases


# ---------------------------------------------------------------------------------------------------
# Paths: how a case is run, and what each must give


def _raise(f):
    try:
        f()
    except Exception as e:  # noqa: BLE001  (what is raised is the point)
        return type(e), str(e)
    return None, None


def run_cpu(call):
    return _raise(lambda: call.op(*call.args, **call.kwargs))


def run_composite(call):
    return _raise(lambda: call.op._op_dk(COMPOSITE, *call.args, **call.kwargs))


def run_fake(call):
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    fake = _map(call, mode.from_tensor)
    with mode:
        return _raise(lambda: fake.op(*fake.args, **fake.kwargs))


def _to_meta(call):
    """The call on meta tensors, views kept as views of one meta storage (overlap cases stay overlaps)."""
    storages = {}

    def convert(t):
        if t.device.type == "meta":
            return t
        if t.is_quantized:  # a quantized meta tensor has no views (and no overlap case has one)
            return torch.empty(t.shape, dtype=t.dtype, device="meta")
        key = t.untyped_storage().data_ptr()
        if key not in storages:
            storages[key] = torch.empty(t.untyped_storage().nbytes() // t.element_size(), dtype=t.dtype,
                                        device="meta")
        return storages[key].as_strided(t.shape, t.stride(), t.storage_offset())

    return _map(call, convert)


def run_meta(call):
    return run_cpu(_to_meta(call))


def run_composite_meta(call):
    return run_composite(_to_meta(call))


def _assert_device_alive(device):
    """A small op still gives the right answer (a rejected aclnn call leaves torch_npu's queue dead)."""
    probe = (torch.arange(4, dtype=torch.float32, device=device) * 2 + 1).cpu()
    assert torch.equal(probe, torch.tensor([1.0, 3.0, 5.0, 7.0])), f"{device} no longer computes: {probe}"


def run_on_device(call, device):
    """The call (already on `device`) on the device's kernels, then a check that the device still computes;
    a dead device is an outcome of its own."""
    got = run_cpu(call)
    try:
        _assert_device_alive(device)
    except Exception as e:  # noqa: BLE001
        return type(e), f"the device died after the call, which gave {got}: {e}"
    return got


CPU_PATHS = {
    "cpu": run_cpu,  # the C++ CPU kernels (the Meta kernels where a case puts a meta tensor among them)
    "composite": run_composite,
    "fake": run_fake,  # FakeTensorMode: the Meta kernels on fake tensors
    "meta": run_meta,  # the Meta kernels on meta tensors
    "composite_meta": run_composite_meta,
}
DEVICE_PATHS = {"device": run_on_device, "fake_device": lambda call, device: run_fake(call)}


def paths(case: Case, device: str) -> list[str]:
    if case.device_only:
        return list(DEVICE_PATHS)
    names = ["cpu", "composite"] + (["fake"] if case.fake_ok else [])
    names += ["meta", "composite_meta"] if case.meta_ok else []
    if device != "cpu" and case.device_ok:
        names += list(DEVICE_PATHS)
    return names


def run_path(case: Case, path: str, device: str):
    """(class, message) of the case on one path, or (None, None) when accepted."""
    if path in CPU_PATHS:
        return CPU_PATHS[path](case.call)
    placed = (case.device_only or _to_device)(case.call, device)
    return DEVICE_PATHS[path](placed, device)


def _device_message(cpu_msg: str, device: str) -> str:
    """The CPU message as the same check words it on `device`: the device named, and on the NPU the dtype
    list without float64."""
    msg = cpu_msg.replace(" is on cpu", f" is on {device}")
    if device == "npu":
        msg = msg.replace("float32, float64, float16 or bfloat16 on cpu", "float32, float16 or bfloat16 on npu")
    return msg.replace(" on cpu,", f" on {device},")


def expected_on(path: str, reference: tuple, device: str) -> tuple:
    """What `path` must give, from the reference path's outcome: the same class and message, naming meta
    for meta tensors and the device for the device's tensors where the reference names the CPU."""
    cls, msg = reference
    if msg is None or path in ("cpu", "composite", "fake"):
        return reference
    if path in ("meta", "composite_meta"):
        return cls, msg.replace(" on cpu", " on meta")
    return cls, _device_message(msg, device)


def problems(case: Case, outcomes: dict, device: str) -> list[str]:
    """What is wrong with one case's outcomes ({path: (class name, message)}): its reference path (the CPU
    kernels; the device for an NPU-only case) must raise what docs/validation.md says, or accept, and every
    other path must give the same class and message."""
    reference_path = "device" if case.device_only else "cpu"
    reference = outcomes[reference_path]
    cls, msg = reference
    found = []
    if case.exc is None:
        if reference != (None, None):
            found.append(f"{reference_path} rejected it: {reference}")
    elif cls != case.exc.__name__:
        found.append(f"{reference_path} gave {reference}, docs/validation.md says {case.exc.__name__}")
    else:
        found += [f"message {msg!r} lacks {word!r}" for word in case.words if word not in msg]
        if "\n" in msg.strip():
            found.append(f"message carries more than one line: {msg!r}")
        if case.message is not None and msg != case.message:
            found.append(f"message {msg!r}, expected {case.message!r}")
    for path, got in outcomes.items():
        want = reference if case.device_only else expected_on(path, reference, device)
        if got != want:
            found.append(f"{path}: {got}, expected {want}")
    return found


# ---------------------------------------------------------------------------------------------------
# The tests


def test_every_overload_has_every_rule():
    """The matrix really covers docs/validation.md's table for each of the fifteen overloads."""
    for ov in OVERLOADS:
        ids = {c.id.split("-")[0] if c.id.startswith("reduction") else c.id for c in _cases(ov)}
        joined = " ".join(ids)
        for rule in ["torch.int32", "torch.bool", "torch.complex64", "9dim", "None", "on-meta",
                     "reduction", "not-broadcastable"]:
            assert rule in joined, (ov, rule)
        if "." in ov:
            for rule in ["shape", "expanded", "partially-overlaps", "torch.int32"]:
                assert rule in joined, (ov, rule)
        if ov.startswith("huber_loss"):
            for rule in ["delta0.0", "delta-1.0", "deltanan", "delta-inf"]:
                assert rule in joined, (ov, rule)
        accepted = {c.id for c in _accepted_cases()}
        assert {f"{ov}-mixed-float-dtypes", f"{ov}-{MAX_DIMS}-dims"} <= accepted, ov
        for device in ("cpu", "npu"):
            joined = " ".join(c.id for c in _device_cases(ov, device))
            assert "float64" in joined and f"on-cpu-others-on-{'meta' if device == 'cpu' else device}" in joined


def test_the_matrix_covers_every_declared_op():
    """The matrix's overloads are every declared elementwise loss's three ops (`_C._losses()`, csrc/losses.h);
    the declared ops are every registered op and overload."""
    registered = {name.removeprefix("npu_loss::") for name in torch._C._dispatch_get_all_op_names()
                  if name.startswith("npu_loss::")}
    declared = {schema.split("(")[0] for row in npu_loss_ops._C._losses() for schema in row["schemas"]}
    elementwise = {schema.split("(")[0] for row in npu_loss_ops._C._losses() for schema in row["schemas"]
                   if row["kind"] == "elementwise"}
    assert sorted(declared) == sorted(registered)
    # The row losses' errors are test_distillation.py's.
    assert sorted(elementwise) == sorted(OVERLOADS)


WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_matrix_worker.py")
# Cases per worker process. A worker's start (torch, and torch_npu on the NPU) costs about 6 s and its 200
# cases under 0.5 s, so few large batches; a crash still costs only the cases after it in that batch, which a
# new process runs.
BATCH = 1000
TRACE_VARIABLE = "NPU_EMU_TRACE_FILE"  # set on the emulated CANN (scripts/run_npu_emulated.sh)


def _run_worker(device, first, last, trace_file):
    # The worker imports the same npu_loss_ops this process uses (installed or from a source checkout).
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(npu_loss_ops.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in [root, env.get("PYTHONPATH")] if p)
    if trace_file:
        env[TRACE_VARIABLE] = trace_file
    proc = subprocess.run([sys.executable, WORKER, device, str(first), str(last)], capture_output=True,
                          text=True, timeout=900, env=env)
    # A negative code is a signal (segfault, abort): a crash. A positive one is a Python error in the worker.
    assert proc.returncode <= 0, f"worker failed:\n{proc.stderr[-3000:]}"
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc.returncode, rows, proc.stderr


def _trace(trace_file):
    """The emulator's counts from a worker's run (tests/npu_emulator/README.md, "The trace")."""
    if not trace_file or not os.path.exists(trace_file):
        return {}
    with open(trace_file) as f:
        return json.load(f)


def test_error_matrix(device):
    """Every case on every path, in batches of subprocesses. The worker runs the cases in order, so when its
    process dies the first case without all its outcomes is the one that crashed: it is counted, and a new
    process goes on after it. No crash, and every case as docs/validation.md says with the same class and
    message on every path."""
    cases = all_cases(device)
    outcomes = [dict() for _ in cases]
    crashes, trace = {}, collections.Counter()
    with tempfile.TemporaryDirectory() as tmp:
        traced = device != "cpu" and TRACE_VARIABLE in os.environ
        for first in range(0, len(cases), BATCH):
            last = min(first + BATCH, len(cases))
            while first < last:
                trace_file = os.path.join(tmp, f"trace-{first}.json") if traced else None
                code, rows, err = _run_worker(device, first, last, trace_file)
                trace.update(_trace(trace_file))
                for row in rows:
                    assert row["id"] == cases[row["case"]][1].id, "the worker built another matrix"
                    outcomes[row["case"]][row["path"]] = (row["cls"], row["msg"])
                if code == 0:
                    break
                crashed = next((i for i in range(first, last) if len(outcomes[i]) < len(paths(cases[i][1], device))),
                               last - 1)
                crashes[crashed] = (cases[crashed][0], cases[crashed][1].id, code, err[-500:])
                first = crashed + 1
    wrong = []
    runs = 0
    for i, ((overload, case), got) in enumerate(zip(cases, outcomes)):
        expected_paths = paths(case, device)
        runs += len(got)
        if sorted(got) != sorted(expected_paths):
            if i not in crashes:
                wrong.append((overload, case.id, f"ran on {sorted(got)}, expected {sorted(expected_paths)}"))
            continue
        for problem in problems(case, got, device):
            wrong.append((overload, case.id, problem))
    bad_calls = {k: v for k, v in trace.items() if "GetWorkspaceSize:" in k or k.startswith("aclop:")}
    print(f"\nerror matrix on {device}: {len(cases)} cases on {runs} (case, path) runs, {len(crashes)} crashes, "
          f"{len(wrong)} wrong outcomes" + (f"; {sum(trace.values())} emulated aclnn calls" if traced else ""))
    assert not crashes, list(crashes.values())
    assert not wrong, "\n".join(map(str, wrong[:20]))
    assert not bad_calls, f"calls the emulated aclnn rejected, or aclop fallbacks: {bad_calls}"
