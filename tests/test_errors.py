"""docs/validation.md's table, for every op and overload, on every path: the C++ CPU kernels, fake tensors and
meta tensors (the C++ Meta kernels: the same checks on SymInt sizes), and the C++ composite fallback on CPU
and on meta tensors. Same exception class and the very same message everywhere (only the device name in a
message differs between CPU and meta tensors).

On the NPU (the `device` runs, conftest.py) the same matrix runs on NPU tensors — the NPU kernels and fake
NPU tensors — with the CPU's exception class and message (the device named, and the NPU's dtype list
without float64), plus what only the NPU rejects: float64 (TypeError) and tensors mixed between the CPU
and the NPU (RuntimeError). After each call a small NPU op checks that the device still works (a call
aclnn rejected would leave torch_npu's task queue dead)."""
from __future__ import annotations

import dataclasses
import logging
import math
import warnings
from typing import Callable

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import npu_loss_ops  # noqa: F401  (registers the ops)

COMPOSITE = torch._C.DispatchKey.CompositeExplicitAutograd
ops = torch.ops.npu_loss


@pytest.fixture(autouse=True)
def _quiet_fake_tensor_log():
    # FakeTensorMode logs every exception a fake kernel raises; here they are the point of the test.
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


# ---------------------------------------------------------------------------------------------------
# The nine overloads, called with valid arguments that a case then spoils


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
    }
    return table[overload]


OVERLOADS = [
    "smooth_l1_loss", "smooth_l1_loss_backward", "smooth_l1_loss_backward.grad_input",
    "l1_loss", "l1_loss_backward", "l1_loss_backward.grad_input",
    "kl_div", "kl_div_target_backward", "kl_div_target_backward.grad_target",
]


def _op_name(overload: str) -> str:
    return overload.split(".")[0]


def _tensor_args(call: Call) -> list[str]:
    return [n for n in call.names if n in ("grad_output", "self", "target")]


def _out_name(call: Call):
    return next(iter(call.kwargs), None) if call.op._overloadname in ("grad_input", "grad_target") else None


# ---------------------------------------------------------------------------------------------------
# The cases: (id, exception class, words the message must contain, the spoiled call)


@dataclasses.dataclass
class Case:
    id: str
    exc: type
    words: list
    call: Call
    meta_ok: bool = True  # False: the case mixes devices on purpose


def _cases(overload: str) -> list[Case]:
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
                          base.replaced(**{name: arg.reshape(4, 5, 1, 1, 1, 1, 1, 1, 1)})))
        cases.append(Case(f"{name}-None", RuntimeError, [op, name, "None"], base.replaced(**{name: None})))
        cases.append(Case(f"{name}-on-meta", RuntimeError, [op, name, "device"],
                          base.replaced(**{name: arg.to("meta")}), meta_ok=False))
    for reduction in (3, -1, 100):
        cases.append(Case(f"reduction{reduction}", ValueError, [op, "reduction", str(reduction)],
                          base.replaced(reduction=reduction)))
    if "beta" in base.names:
        for beta in (-1.0, -1e-300, math.nan, -math.inf):
            cases.append(Case(f"beta{beta}", ValueError, [op, "beta"], base.replaced(beta=beta)))
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


ALL_CASES = [pytest.param(ov, c, id=f"{ov}-{c.id}") for ov in OVERLOADS for c in _cases(ov)]


# ---------------------------------------------------------------------------------------------------
# Paths


def _map(call: Call, fn: Callable) -> Call:
    conv = lambda v: fn(v) if isinstance(v, torch.Tensor) else v  # noqa: E731
    return Call(call.op, call.names, [conv(a) for a in call.args], {k: conv(v) for k, v in call.kwargs.items()})


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
        key = t.untyped_storage().data_ptr()
        if key not in storages:
            storages[key] = torch.empty(t.untyped_storage().nbytes() // t.element_size(), dtype=t.dtype,
                                        device="meta")
        return storages[key].as_strided(t.shape, t.stride(), t.storage_offset())

    return _map(call, convert)


def run_meta(call):
    m = _to_meta(call)
    return _raise(lambda: m.op(*m.args, **m.kwargs))


def run_composite_meta(call):
    return run_composite(_to_meta(call))


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


def _device_message(cpu_msg: str, device: str) -> str:
    """The CPU message as the same check words it on `device`: the device named, and on the NPU the dtype
    list without float64."""
    msg = cpu_msg.replace(" is on cpu", f" is on {device}")
    if device == "npu":
        msg = msg.replace("float32, float64, float16 or bfloat16 on cpu", "float32, float16 or bfloat16 on npu")
    return msg.replace(" on cpu,", f" on {device},")


def _assert_device_alive(device):
    """A small op still gives the right answer (a rejected aclnn call leaves torch_npu's queue dead)."""
    if device == "cpu":
        return
    probe = (torch.arange(4, dtype=torch.float32, device=device) * 2 + 1).cpu()
    assert torch.equal(probe, torch.tensor([1.0, 3.0, 5.0, 7.0])), f"{device} no longer computes: {probe}"


def _run_on_device(dcall, device):
    """run_cpu of a call already on `device`, then a check that the device still computes."""
    try:
        return run_cpu(dcall)
    finally:
        _assert_device_alive(device)


def _check_on_device(call, device, expected):
    """The call on `device` and on fake `device` tensors raises `expected` = (class, message)."""
    dcall = _to_device(call, device)
    got = _run_on_device(dcall, device)
    assert got == expected, f"{device} tensors: {got}, expected {expected}"
    assert run_fake(dcall) == expected, f"fake {device} tensors"


def _assert_same_on_every_path(call, meta=True):
    """The call (on CPU tensors) gives the same outcome, (class, message) or (None, None) when accepted, on
    the C++ CPU kernel, on fake tensors (the Meta kernel), on the composite fallback, and, with `meta`, on
    meta tensors through the fake kernel and through the composite fallback (there the message names meta
    where it names cpu). Returns the C++ CPU kernel's outcome."""
    expected = run_cpu(call)
    assert run_fake(call) == expected, "fake tensors"
    assert run_composite(call) == expected, "composite fallback on CPU"
    if meta:
        cls, msg = expected
        on_meta = (cls, msg if msg is None else msg.replace(" on cpu", " on meta"))
        assert run_meta(call) == on_meta, "meta tensors (the Meta kernel)"
        assert run_composite_meta(call) == on_meta, "composite fallback on meta"
    return expected


@pytest.mark.parametrize("overload,case", ALL_CASES)
def test_rejection_identical_on_every_path(overload, case, device):
    cls, msg = _assert_same_on_every_path(case.call, meta=case.meta_ok)
    assert cls is case.exc, f"CPU raised {cls} ({msg}), docs/validation.md says {case.exc.__name__}"
    for word in case.words:
        assert word in msg, f"message {msg!r} lacks {word!r}"
    assert "\n" not in msg.strip(), f"message carries more than one line: {msg!r}"
    if device != "cpu":
        _check_on_device(case.call, device, (cls, _device_message(msg, device)))


# What only a device rejects: float64 on the NPU, and tensors mixed between the CPU and the device (on the
# CPU run: float64 accepted, and a meta tensor among CPU ones rejected the same way).
def _device_cases(overload: str, device: str):
    base = base_call(overload)
    op = _op_name(overload)
    out = _out_name(base)
    other = device if device != "cpu" else "meta"
    for name in _tensor_args(base) + ([out] if out else []):
        arg = base.get(name)
        float64 = base.replaced(**{name: arg.double()})
        if name == "grad_target" or (out == "grad_target" and name == "target" and device == "cpu"):
            # grad_target must have target's dtype, on every device
            yield f"{name}-float64", float64, (TypeError, [op, "grad_target", "dtype"])
        elif device == "npu":
            yield f"{name}-float64", float64, (TypeError, [op, name, "dtype", "float64", "npu"])
        else:
            yield f"{name}-float64", float64, None
        # `name` stays on the CPU while the others move to the device (meta for the CPU run)
        yield f"{name}-on-cpu-others-on-{other}", _map_except(base, name, other), (
            RuntimeError, [op, name, "device", "cpu"])


def _map_except(call: Call, keep: str, device: str) -> Call:
    kept = call.get(keep)
    moved = _map(call, lambda t: t.to(device))
    return moved.replaced(**{keep: kept})


@pytest.mark.parametrize("overload", OVERLOADS)
def test_device_specific_rejections(overload, device):
    for case_id, call, rule in _device_cases(overload, device):
        if device == "cpu":
            got = run_cpu(call)
        else:
            # the float64 cases start on the CPU: move them; the mixed ones are already placed
            dcall = call if "-on-cpu-" in case_id else _to_device(call, device)
            got = _run_on_device(dcall, device)
            assert run_fake(dcall) == got, f"{case_id}: fake {device} tensors"
        if rule is None:
            assert got == (None, None), f"{case_id}: rejected {got}"
            continue
        cls, words = rule
        assert got[0] is cls, f"{case_id}: raised {got}, docs/validation.md says {cls.__name__}"
        for word in words:
            assert word in got[1], f"{case_id}: message {got[1]!r} lacks {word!r}"


def test_every_overload_has_every_rule():
    """The matrix really covers docs/validation.md's table for each of the nine overloads."""
    for ov in OVERLOADS:
        ids = {c.id.split("-")[0] if c.id.startswith("reduction") else c.id for c in _cases(ov)}
        joined = " ".join(ids)
        for rule in ["torch.int32", "torch.bool", "torch.complex64", "9dim", "None", "on-meta",
                     "reduction", "not-broadcastable"]:
            assert rule in joined, (ov, rule)
        if "." in ov:
            for rule in ["shape", "expanded", "partially-overlaps", "torch.int32"]:
                assert rule in joined, (ov, rule)


# ---------------------------------------------------------------------------------------------------
# What must NOT be rejected (the same paths accept it)


def _accepted_calls():
    yield "float64-on-cpu", _map(base_call("smooth_l1_loss_backward"), lambda t: t.double())
    for ov in OVERLOADS:
        yield f"{ov}-mixed-float-dtypes", base_call(ov).replaced(self=torch.randn(4, 5, dtype=torch.float16))
    for ov in ("smooth_l1_loss_backward.grad_input", "l1_loss_backward.grad_input"):
        base = base_call(ov)
        x = base.get("self").clone()
        yield f"{ov}-exact-alias-of-self", base.replaced(self=x, grad_input=x)
        yield f"{ov}-out-float64", base.replaced(grad_input=torch.empty(4, 5, dtype=torch.float64))
        yield f"{ov}-out-bfloat16", base.replaced(grad_input=torch.empty(4, 5, dtype=torch.bfloat16))
    base = base_call("kl_div_target_backward.grad_target")
    t = base.get("target").clone()
    yield "kl-exact-alias-of-target", base.replaced(target=t, grad_target=t)
    yield "smooth-beta-0", base_call("smooth_l1_loss").replaced(beta=0.0)
    yield "smooth-beta-inf", base_call("smooth_l1_loss").replaced(beta=math.inf)
    yield "8-dims", base_call("l1_loss").replaced(self=torch.randn(1, 1, 1, 1, 1, 1, 4, 5))
    yield "kl-grad-not-enlarging", base_call("kl_div_target_backward").replaced(grad_output=torch.randn(5))


@pytest.mark.parametrize("name,call", [pytest.param(n, c, id=n) for n, c in _accepted_calls()])
def test_accepted_on_every_path(name, call, device):
    if device == "cpu":
        assert _assert_same_on_every_path(call) == (None, None), f"rejected {name}"
        return
    if device == "npu" and "float64" in name:
        pytest.skip("float64 is rejected on the NPU (test_device_specific_rejections)")
    dcall = _to_device(call, device)
    got = _run_on_device(dcall, device)
    assert got == (None, None), f"{device} rejected {name}: {got}"
    assert run_fake(dcall) == (None, None), f"fake {device} tensors rejected {name}"


# ---------------------------------------------------------------------------------------------------
# The dimension limit and every dtype, on every path

MAX_DIMS = 8  # docs/validation.md, rule 6


def _with_dims(call: Call, ndim: int, names) -> Call:
    """The call with each tensor argument in `names` given `ndim` dims (leading 1s before its 4 x 5)."""
    return call.replaced(**{n: call.get(n).reshape((1,) * (ndim - 2) + (4, 5)) for n in names})


@pytest.mark.parametrize("overload", OVERLOADS)
def test_dimension_limit_on_every_path(overload):
    """MAX_DIMS dims are accepted and MAX_DIMS + 1 rejected with the same RuntimeError and message by the
    kernels (CPU, composite) and the Meta kernels (fake and meta tensors), for every argument."""
    base = base_call(overload)
    out = _out_name(base)
    every = _tensor_args(base) + ([out] if out else [])
    at_limit = _with_dims(base, MAX_DIMS, every)
    assert _assert_same_on_every_path(at_limit) == (None, None), f"{MAX_DIMS} dims rejected"
    for name in _tensor_args(base):
        over = _with_dims(at_limit, MAX_DIMS + 1, [name])
        expected = (RuntimeError, f"{_op_name(overload)}: {name} has {MAX_DIMS + 1} dimensions, but at most "
                                  f"{MAX_DIMS} are supported")
        assert _assert_same_on_every_path(over) == expected, name


ALL_DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)
ACCEPTED_ON_CPU = {torch.float32, torch.float64, torch.float16, torch.bfloat16}  # docs/validation.md, rule 3


def _empty(shape, dtype, device="cpu"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # complex32 is "experimental", the quantized dtypes are deprecated
        return torch.empty(shape, dtype=dtype, device=device)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=[str(d).removeprefix("torch.") for d in ALL_DTYPES])
def test_every_dtype_accepted_or_rejected_alike_on_every_path(dtype):
    """Every dtype torch has, in every tensor argument and out= tensor of every overload: accepted exactly
    where docs/validation.md says (float32, float64, float16, bfloat16 on the CPU; grad_target only in
    target's dtype), and otherwise the same TypeError and message from the kernels (CPU, composite) as
    from the Meta kernels on meta tensors and on fake tensors (which cannot hold quantized tensors:
    those are compared on meta tensors only)."""
    for overload in OVERLOADS:
        base = base_call(overload)
        on_meta = _map(base, lambda t: t.to("meta"))
        out = _out_name(base)
        for name in _tensor_args(base) + ([out] if out else []):
            # grad_target follows target's dtype (rule 10 is not the rule under test)
            names = [name, out] if (name, out) == ("target", "grad_target") else [name]
            shape = base.get(name).shape
            call = base.replaced(**{n: _empty(shape, dtype) for n in names})
            meta_call = on_meta.replaced(**{n: _empty(shape, dtype, "meta") for n in names})
            where = f"{overload}, {name} of {dtype}"
            got = run_cpu(call)
            if name == "grad_target":
                accepted = dtype == base.get("target").dtype
            else:
                accepted = dtype in ACCEPTED_ON_CPU
            assert (got == (None, None)) is accepted, f"{where}: {got}"
            if not accepted:
                assert got[0] is TypeError and f"got {str(dtype).removeprefix('torch.')}" in got[1], f"{where}: {got}"
            assert run_composite(call) == got, f"{where}: composite fallback"
            msg_on_meta = got[1] if got[1] is None else got[1].replace(" on cpu", " on meta")
            assert run_cpu(meta_call) == (got[0], msg_on_meta), f"{where}: meta tensors (the Meta kernel)"
            assert run_composite(meta_call) == (got[0], msg_on_meta), f"{where}: composite fallback on meta"
            if not call.get(name).is_quantized:
                assert run_fake(call) == got, f"{where}: fake tensors"
