"""DTensor: every npu_loss op and out= overload, the row losses' included, with its arguments placed Shard(0), Shard(1), Replicate,
Partial or a mix, broadcast or not, on a 1-D and a 2-D mesh of two gloo processes (loopback), gives what one
process gives on the whole tensors: the
forward values (through the Python API, KL's 'batchmean' included), the gradients w.r.t. self and target
(autograd's C++ nodes calling the backward ops on DTensors), the backward ops called directly and their out=
overloads. One spawn of two processes runs every case; each case is then its own test here.

The shapes make both kinds of "mean" rule run: dim 0 (6) splits evenly over two ranks, so a mean over it is
the ranks' average (Partial("avg")), and dim 1 (5) does not (3 and 2), so a mean there replicates. Also
here: the rules are registered only once torch.distributed.tensor is imported (import npu_loss_ops does not
import it), and every op and overload under torch.ops.npu_loss has a rule.
"""
from __future__ import annotations

import datetime
import functools
import os
import socket
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist

import npu_loss_ops
from helpers import leave_gloo, package_parent, run_ranks

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed with gloo"
)

WORLD = 2
SHAPE = (6, 5)
# Seconds for the two processes, all cases; times NPU_LOSS_OPS_TIME_LIMIT_SCALE (scripts/aarch64.sh sets 3 under
# qemu).
TIME_LIMIT = 300 * float(os.environ.get("NPU_LOSS_OPS_TIME_LIMIT_SCALE", "1"))

ops = torch.ops.npu_loss
REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}
# Placements of (self, target) by name, one per mesh dimension: "S0" is Shard(0), "R" Replicate, "P"
# Partial("sum"), "S1/S0" is Shard(1) on the first dimension of a 2-D mesh (of size 1) and Shard(0) on the
# second.
PAIRS = [("S0", "S0"), ("S1", "S1"), ("R", "R"), ("S0", "R"), ("R", "S1"), ("P", "S0"), ("S1/S0", "R/S0")]
# Broadcasting: (self's shape, target's shape, self's placement, target's placement).
BROADCASTS = [
    (SHAPE, (5,), "S0", "R"),
    (SHAPE, (5,), "S1", "S0"),
    (SHAPE, (6, 1), "S0", "S0"),
    (SHAPE, (6, 1), "S1", "R"),
    ((5,), SHAPE, "R", "S0"),
    ((6, 1), SHAPE, "S0", "S1"),
]
LOSSES = {
    # name: (Python API function, its extra keyword arguments, the backward op's scalar arguments)
    "smooth_l1": (npu_loss_ops.smooth_l1_loss, {"beta": 0.5}, (0.5,)),
    "huber": (npu_loss_ops.huber_loss, {"delta": 0.5}, (0.5,)),
    "l1": (npu_loss_ops.l1_loss, {}, ()),
    "mse": (npu_loss_ops.mse_loss, {}, ()),
    "kl": (npu_loss_ops.kl_div, {"log_target": False}, (False,)),
    "kl_log_target": (npu_loss_ops.kl_div, {"log_target": True}, (True,)),
}
BACKWARD = {
    # name: (the backward op, its out= overload, the out tensor's argument name)
    "smooth_l1": (ops.smooth_l1_loss_backward, "grad_input", "grad_input"),
    "huber": (ops.huber_loss_backward, "out", "grad_input"),
    "l1": (ops.l1_loss_backward, "grad_input", "grad_input"),
    "mse": (ops.mse_loss_backward, "grad_input", "grad_input"),
    "kl": (ops.kl_div_target_backward, "grad_target", "grad_target"),
    "kl_log_target": (ops.kl_div_target_backward, "grad_target", "grad_target"),
}


@dataclass(frozen=True)
class Case:
    id: str
    kind: str  # "loss" (the Python API and autograd), "backward" (the op), "out" (its out= overload)
    loss: str
    reduction: str
    self_placement: str
    target_placement: str
    self_shape: tuple[int, ...] = SHAPE
    target_shape: tuple[int, ...] = SHAPE
    out_placement: str | None = None


def _cases() -> list[Case]:
    cases = []
    for loss in LOSSES:
        reductions = [*REDUCTIONS, "batchmean"] if loss.startswith("kl") else list(REDUCTIONS)
        layouts = [(SHAPE, SHAPE, s, t) for s, t in PAIRS] + BROADCASTS
        for reduction in reductions:
            for self_shape, target_shape, s, t in layouts:
                name = f"{loss}-{reduction}-self{s}-target{t}"
                for label, shape in (("self", self_shape), ("target", target_shape)):
                    name += "" if shape == SHAPE else f"-{label}{list(shape)}"
                shapes = (self_shape, target_shape)
                cases.append(Case(f"loss-{name}", "loss", loss, reduction, s, t, *shapes))
                if reduction == "batchmean":
                    continue
                cases.append(Case(f"backward-{name}", "backward", loss, reduction, s, t, *shapes))
                # out= tensors: Replicate always has an exact rule; a sharded one where the reduction
                # allows it (not "mean", whose local call divides by a shard's count), and is refused there.
                for out in ("R", "S0", "S1"):
                    if (shapes != (SHAPE, SHAPE) or "/" in s) and out != "R":
                        continue
                    cases.append(Case(f"out{out}-{name}", "out", loss, reduction, s, t, *shapes, out))
    return cases


# The row losses (generalized JSD): logits (4, 6, 11), the labels of (4, 6) placed as the student's leading
# dimensions are (some ignored, so that the ranks' counts of kept rows differ). Token dimensions 0 and 1 sharded,
# replicated, or one side sharded and the other not; every reduction, labels or not, num_items_in_batch;
# the backward op called directly; the vocabulary dimension sharded on both sides (computed on the split,
# tests/test_vocab_parallel.py has its matrix). Refused with a ValueError: 'none' with labels through the Python API (its row count is in the labels' values, and DTensor needs every result's
# shape before the call).
ROW_SHAPE = (4, 6, 11)
ROW_PAIRS = [("S0", "S0"), ("S1", "S1"), ("S0", "R"), ("R", "R"), ("S1/S0", "R/S0")]
JSD_REDUCTIONS = ("batchmean", "sum", "mean", "none")


def _row_cases() -> list[Case]:
    cases = []
    for reduction in JSD_REDUCTIONS:
        for s, t in ROW_PAIRS:
            for labels in ("", "-labels"):
                name = f"jsd{labels}-{reduction}-student{s}-teacher{t}"
                cases.append(Case(f"loss-{name}", "loss", f"jsd{labels}", reduction, s, t, ROW_SHAPE, ROW_SHAPE))
                if reduction != "batchmean":
                    cases.append(Case(f"backward-{name}", "backward", f"jsd{labels}", reduction, s, t, ROW_SHAPE,
                                      ROW_SHAPE))
    cases.append(Case("loss-jsd-labels-num_items-studentS0-teacherS0", "loss", "jsd-labels-num_items",
                      "batchmean", "S0", "S0", ROW_SHAPE, ROW_SHAPE))
    cases.append(Case("loss-jsd-vocabulary-studentS2-teacherS2", "loss", "jsd", "batchmean", "S2", "S2",
                      ROW_SHAPE, ROW_SHAPE))
    # The sparse JSD: the teacher's K = 3 log-probabilities, its ids and its mask placed alike (token dimensions).
    for reduction in JSD_REDUCTIONS:
        for s, t in (("S0", "S0"), ("S1", "S1"), ("R", "R"), ("S1/S0", "R/S0")):
            for labels in ("", "-labels"):
                if labels and reduction == "none":
                    continue
                name = f"sparse{labels}-{reduction}-student{s}-teacher{t}"
                cases.append(Case(f"loss-{name}", "loss", f"sparse{labels}", reduction, s, t, ROW_SHAPE,
                                  SPARSE_SHAPE))
    # Its linear form: hidden states and the support placed alike over the tokens, the lm_head weight replicated
    # (DTensor gathers the tokens for the op, as for the fused linear JSD).
    for s, t in (("S0", "S0"), ("R", "R"), ("S1", "S1")):
        for reduction in ("batchmean", "sum", "mean"):
            cases.append(Case(f"loss-fusedsparse-labels-{reduction}-student{s}-teacher{t}", "loss",
                              "fusedsparse-labels", reduction, s, t, (*ROW_SHAPE[:-1], 5), SPARSE_SHAPE))
    return cases


SPARSE_SHAPE = (*ROW_SHAPE[:-1], 3)


CASES = _cases() + _row_cases()


def _inputs(case: Case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """self, target and a weight or grad_output of the broadcast shape, from a seed of the case's own."""
    g = torch.Generator().manual_seed(CASES.index(case))
    x = torch.randn(case.self_shape, generator=g)
    t = torch.randn(case.target_shape, generator=g)
    w = torch.randn(SHAPE, generator=g)
    if case.loss == "kl":
        x = torch.log_softmax(x, -1)
        t = torch.softmax(t, -1)
        t.view(-1)[::4] = 0  # zero probabilities: their target gradient is exactly 0
    elif case.loss == "kl_log_target":
        x = torch.log_softmax(x, -1)
        t = torch.log_softmax(t, -1)
    return x, t, w


def _run_rows(case: Case, distribute) -> dict[str, object]:
    """A row-loss case: generalized JSD through the Python API and autograd, or its backward op directly."""
    g = torch.Generator().manual_seed(CASES.index(case))
    student = torch.randn(ROW_SHAPE, generator=g) * 2
    teacher = torch.randn(ROW_SHAPE, generator=g) * 2
    labels = torch.randint(0, ROW_SHAPE[-1], ROW_SHAPE[:-1], generator=g)
    labels[0, :4] = -100
    labels[3, 5] = -100
    # The labels are placed as the student's leading dimensions are.
    label_placement = case.self_placement if "S2" not in case.self_placement else "R"
    labels_d = distribute(labels, label_placement) if "labels" in case.loss else None
    num_items = 7 if "num_items" in case.loss else None
    sd, td = distribute(student, case.self_placement), distribute(teacher, case.target_placement)
    results: dict[str, object] = {}
    if case.kind == "loss":
        sd, td = sd.requires_grad_(), td.requires_grad_()
        value = npu_loss_ops.generalized_jsd_loss(sd, td, labels_d, 0.3, 2.0, case.reduction, num_items)
        # For "none", a gradient that differs from element to element.
        replicate = "/".join(["R"] * (case.self_placement.count("/") + 1))
        weight = distribute(torch.arange(1.0, ROW_SHAPE[-1] + 1), replicate)
        (value * weight if case.reduction == "none" else value).sum().backward()
        results.update(value=value, grad_self=sd.grad, grad_target=td.grad)
    else:
        grad_output = torch.tensor(1.5)
        if case.reduction == "none":  # the shape the forward gives, whole on every rank
            grad_output = torch.linspace(-1, 2, 4 * 6 * 11).reshape(ROW_SHAPE)
            if labels_d is not None:
                grad_output = grad_output.reshape(-1, 11)[: int((labels != -100).sum())]
        replicate = "/".join(["R"] * (case.self_placement.count("/") + 1))
        reduction = {"none": 0, "mean": 1, "sum": 2}[case.reduction]
        gs, gt = ops.generalized_jsd_loss_backward(
            distribute(grad_output, replicate), sd, td, labels_d, reduction, 0.3, 2.0, 1.0, 1.0, None, None, -100, [True, True])
        results.update(value=gs, grad_target=gt)
    return results


def _run_sparse(case: Case, distribute) -> dict[str, object]:
    """A sparse JSD case through the Python API and autograd: the student's and the teacher's gradients."""
    g = torch.Generator().manual_seed(CASES.index(case))
    student = torch.randn(ROW_SHAPE, generator=g) * 2
    ids = torch.stack([torch.randperm(ROW_SHAPE[-1], generator=g)[:3] for _ in range(24)]).view(SPARSE_SHAPE)
    teacher = torch.randn(ROW_SHAPE, generator=g).log_softmax(-1).gather(-1, ids)
    mask = torch.ones(SPARSE_SHAPE, dtype=torch.bool)
    mask[1, :, 2] = False
    labels = torch.randint(0, ROW_SHAPE[-1], ROW_SHAPE[:-1], generator=g)
    labels[0, :4] = -100
    labels_d = distribute(labels, case.self_placement) if "labels" in case.loss else None
    sd = distribute(student, case.self_placement).requires_grad_()
    td = distribute(teacher, case.target_placement).requires_grad_()
    ids_d, mask_d = distribute(ids, case.target_placement), distribute(mask, case.target_placement)
    value = npu_loss_ops.sparse_jsd_loss(sd, td, ids_d, labels_d, support_mask=mask_d, beta=0.3, temperature=2.0,
                                         reduction=case.reduction)
    replicate = "/".join(["R"] * (case.self_placement.count("/") + 1))
    weight = distribute(torch.arange(1.0, 5.0), replicate)  # K + 1 entries: a gradient varying by entry
    (value * weight if case.reduction == "none" else value).sum().backward()
    return {"value": value, "grad_self": sd.grad, "grad_target": td.grad}


def _run_fused_sparse(case: Case, distribute) -> dict[str, object]:
    """The sparse JSD from hidden states (H 5) and a replicated lm_head weight (V 11), with the hard loss: the
    input's, the weight's and the teacher's gradients."""
    g = torch.Generator().manual_seed(CASES.index(case))
    hidden = torch.randn(case.self_shape, generator=g)
    weight = torch.randn(ROW_SHAPE[-1], case.self_shape[-1], generator=g)
    ids = torch.stack([torch.randperm(ROW_SHAPE[-1], generator=g)[:3] for _ in range(24)]).view(SPARSE_SHAPE)
    teacher = torch.randn(ROW_SHAPE, generator=g).log_softmax(-1).gather(-1, ids)
    labels = torch.randint(0, ROW_SHAPE[-1], ROW_SHAPE[:-1], generator=g)
    labels[0, :4] = -100
    replicate = "/".join(["R"] * (case.self_placement.count("/") + 1))
    xd = distribute(hidden, case.self_placement).requires_grad_()
    wd = distribute(weight, replicate).requires_grad_()
    td = distribute(teacher, case.target_placement).requires_grad_()
    value = npu_loss_ops.fused_linear_sparse_jsd_loss(
        xd, wd, td, distribute(ids, case.target_placement), distribute(labels, case.self_placement), beta=0.3,
        reduction=case.reduction, weight_hard_loss=0.5, chunk_size=5)
    value.backward()
    return {"value": value, "grad_self": xd.grad, "grad_target": td.grad, "grad_weight": wd.grad}


def _placements(name: str) -> list:
    from torch.distributed.tensor import Partial, Replicate, Shard

    kinds = {"R": Replicate(), "P": Partial("sum")}
    return [kinds[p] if p in kinds else Shard(int(p[1:])) for p in name.split("/")]


def _run(case: Case, distribute) -> dict[str, object]:
    """Runs a case; `distribute(tensor, placement name)` makes its DTensor arguments (the identity with
    tensors for one process). Returns its results as plain tensors, and the result's placements."""
    if case.loss.startswith("jsd"):
        results = _run_rows(case, distribute)
    elif case.loss.startswith("sparse"):
        results = _run_sparse(case, distribute)
    elif case.loss.startswith("fusedsparse"):
        results = _run_fused_sparse(case, distribute)
    else:
        results = _run_elementwise(case, distribute)
    placements = getattr(results["value"], "placements", None)
    full = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in results.items()}
    full["placements"] = str(placements)
    return full


def _run_elementwise(case: Case, distribute) -> dict[str, object]:
    x, t, w = _inputs(case)
    fn, kwargs, scalars = LOSSES[case.loss]
    reduction = REDUCTIONS.get(case.reduction, 2)
    replicate = "/".join(["R"] * (case.self_placement.count("/") + 1))
    results: dict[str, object] = {}
    if case.kind == "loss":
        xd = distribute(x, case.self_placement).requires_grad_()
        td = distribute(t, case.target_placement).requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # sizes that differ; KL's 'mean'
            value = fn(xd, td, reduction=case.reduction, **kwargs)
        # For "none", a gradient that differs from element to element.
        (value * distribute(w, replicate) if case.reduction == "none" else value).sum().backward()
        results.update(value=value, grad_self=xd.grad, grad_target=td.grad)
    else:
        op, out_overload, out_name = BACKWARD[case.loss]
        grad_output = w if case.reduction == "none" else torch.tensor(1.5)
        g = distribute(grad_output, case.self_placement if grad_output.dim() else replicate)
        xd, td = distribute(x, case.self_placement), distribute(t, case.target_placement)
        args = (g, xd, td, reduction, *scalars)
        if case.kind == "backward":
            results["value"] = op(*args)
        else:
            like = t if out_name == "grad_target" else w
            out_placement = replicate if case.out_placement == "R" else case.out_placement
            out = distribute(torch.full_like(like, float("nan")), out_placement)
            results["value"] = getattr(op, out_overload)(*args, **{out_name: out})
            results["out"] = out
    return results


# The layouts the family refuses, each raising the documented ValueError itself (not as the __cause__ of DTensor's
# "Sharding propagation failed"): name -> (the call's two placements, given `distribute`, and the start of its
# message). A vocabulary split is computed (tests/test_vocab_parallel.py) where both sides are split alike; a teacher
# split otherwise is refused.
REFUSED_LAYOUTS = {
    "refused-jsd-student-vocabulary": (
        "S2", "R", "generalized_jsd_loss: teacher_logits must be split as student_logits is"),
    "refused-jsd-teacher-vocabulary": (
        "R", "S2", "generalized_jsd_loss: teacher_logits must be split as student_logits is"),
    "refused-fused-student_weight-S0": (
        "S0", "R", "fused_linear_jsd_loss: the weights must be split over the vocabulary alike"),
    "refused-fused-teacher_weight-S0": (
        "R", "S0", "fused_linear_jsd_loss: the weights must be split over the vocabulary alike"),
}


def _refusals(distribute) -> dict[str, object]:
    g = torch.Generator().manual_seed(11)
    logits = [torch.randn(ROW_SHAPE, generator=g, requires_grad=True) for _ in range(2)]
    hidden = [torch.randn(4, 3, generator=g, requires_grad=True) for _ in range(2)]
    weights = [torch.randn(ROW_SHAPE[-1] + 1, 3, generator=g, requires_grad=True) for _ in range(2)]
    calls = {}
    for name, (first, second, _) in REFUSED_LAYOUTS.items():
        if "-fusedsparse-" in name:
            ids = torch.arange(3).repeat(4, 1)
            calls[name] = functools.partial(
                lambda a: npu_loss_ops.fused_linear_sparse_jsd_loss(
                    distribute(hidden[0], "R"), a, distribute(torch.randn(4, 3, generator=g), "R"),
                    distribute(ids, "R")).backward(),
                distribute(weights[0], first))
        elif "-jsd-" in name:
            calls[name] = functools.partial(
                lambda a, b: npu_loss_ops.generalized_jsd_loss(a, b).backward(),
                distribute(logits[0], first), distribute(logits[1], second))
        else:
            calls[name] = functools.partial(
                lambda a, b: npu_loss_ops.fused_linear_jsd_loss(
                    distribute(hidden[0], "R"), a, distribute(hidden[1], "R"), b).backward(),
                distribute(weights[0], first), distribute(weights[1], second))
    return calls


def _worker(rank: int, result_dir: str) -> None:
    if "lo" in {name for _, name in socket.if_nameindex()}:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # gloo's connections on the loopback interface only
    # A file store, not a TCP one, as in test_ddp.py: the rank hosting a TCPStore can abort at exit.
    store = f"file://{os.path.join(result_dir, 'store')}"
    dist.init_process_group(
        "gloo", init_method=store, rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=120)
    )
    finished = False
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, distribute_tensor

        meshes = {1: init_device_mesh("cpu", (WORLD,)), 2: init_device_mesh("cpu", (1, WORLD))}

        def distribute(tensor, placement):
            placements = _placements(placement)
            mesh = meshes[len(placements)]
            if placement == "P":  # rank 0 holds the value, rank 1 zeros
                return DTensor.from_local(tensor if rank == 0 else torch.zeros_like(tensor), mesh, placements)
            return distribute_tensor(tensor, mesh, placements)

        results = {GLOO_AVG: _gloo_has_avg()}
        stale_divisor = _division_reuses_a_divisor(meshes[1], rank)
        for case in CASES:
            if stale_divisor:
                DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache.cache_clear()
            try:
                results[case.id] = _run(case, distribute)
            except Exception as exc:  # every rank raises alike: the rules are deterministic
                # The exception and its causes: torch 2.9's DTensor wraps a rule's own error in "Sharding
                # propagation failed", naming it only as the cause.
                chain = [exc]
                while chain[-1].__cause__ is not None:
                    chain.append(chain[-1].__cause__)
                results[case.id] = {"error": " <- ".join(f"{type(e).__name__}: {e}" for e in chain)}
        for name, call in _refusals(distribute).items():
            try:
                call()
                results[name] = "no error"
            except Exception as exc:  # the exception itself, not its causes: `except ValueError` must catch it
                results[name] = f"{type(exc).__name__}: {exc}"
        if rank == 0:
            torch.save(results, os.path.join(result_dir, "dtensor.pt"))
        finished = True
    finally:
        leave_gloo(finished)


# Whether this torch's gloo has ReduceOp.AVG (torch 2.7's has not): without it, reading a Partial(avg)
# DTensor's value fails, in torch's own DTensor mean as in these rules, and so do the cases that need it.
GLOO_AVG = "gloo has ReduceOp.AVG"
NO_AVG = "Cannot use ReduceOp.AVG with Gloo"


def _gloo_has_avg() -> bool:
    try:
        dist.all_reduce(torch.zeros(1), op=dist.ReduceOp.AVG)
    except RuntimeError as exc:
        if NO_AVG not in str(exc):
            raise
        return False
    return True


# Whether this torch's DTensor divides a Partial(sum) DTensor by the divisor of an earlier division of the
# same shapes (torch 2.7 does: its cached sharding decision keeps the first call's scalar, so p / 6 and then
# p / 5 gives p / 6 twice). 'batchmean' divides the 'sum' result by the batch size, so after a case of
# another batch size its value would be wrong, in torch's own F.kl_div as through this package: there the
# worker clears DTensor's sharding cache before each case, so that every case runs as it would alone.


def _division_reuses_a_divisor(mesh, rank: int) -> bool:
    from torch.distributed.tensor import DTensor, Partial

    p = DTensor.from_local(torch.tensor(30.0 if rank == 0 else 0.0), mesh, [Partial("sum")])
    first, second = (p / 6).full_tensor().item(), (p / 5).full_tensor().item()
    return (first, second) != (5.0, 6.0)


def _skip_without_avg(got: dict[str, object], dtensor_results) -> None:
    if not dtensor_results[GLOO_AVG] and NO_AVG in str(got.get("error", "")):
        pytest.skip("this torch's gloo has no ReduceOp.AVG: a Partial(avg) result cannot be read (torch's own "
                    "DTensor mean fails alike)")


@pytest.fixture(scope="module")
def dtensor_results():
    with tempfile.TemporaryDirectory() as result_dir:
        run_ranks(_worker, (result_dir,), WORLD, TIME_LIMIT, "the two DTensor processes")
        return torch.load(os.path.join(result_dir, "dtensor.pt"))


def _expected(case: Case) -> dict[str, object]:
    return _run(case, lambda tensor, placement: tensor)


def _close(got, expected, what):
    torch.testing.assert_close(got, expected, rtol=2e-6, atol=1e-6, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("name", list(REFUSED_LAYOUTS))
def test_refused_layouts_raise_the_documented_class_itself(name, dtensor_results):
    """A teacher split over the vocabulary otherwise than its student (its logits, or either lm_head weight) is
    refused with a ValueError naming it, raised as itself."""
    assert dtensor_results[name].startswith(f"ValueError: {REFUSED_LAYOUTS[name][2]}"), dtensor_results[name]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_equals_one_process(case, dtensor_results):
    got = dtensor_results[case.id]
    if case.id.startswith("loss-jsd-labels-none"):
        # DTensor makes the result's shape before the call; the count of kept rows is in the labels' values.
        assert "ValueError: generalized_jsd_loss: reduction='none' with labels is not supported for DTensor" in got.get(
            "error", ""), got
        return
    refused = case.kind == "out" and case.out_placement != "R" and case.reduction == "mean"
    if refused:
        # The local call's mean divides by a shard's count, and DTensor never redistributes an out= tensor.
        assert "a Replicate" in got.get("error", ""), got
        return
    _skip_without_avg(got, dtensor_results)
    assert "error" not in got, got["error"]
    expected = _expected(case)
    for key in ("value", "grad_self", "grad_target", "grad_weight"):
        if key in expected:
            _close(got[key], expected[key], key)
    if case.kind == "out":
        _close(got["out"], expected["value"], "the out= tensor")


# The result's placements for a few cases: the rules shard and reduce where exact, rather than replicate.
PLACEMENTS = {
    "loss-l1-none-selfS1-targetS1": "(Shard(dim=1),)",
    "loss-l1-sum-selfS0-targetR": "(Partial(sum),)",
    "loss-smooth_l1-mean-selfS0-targetS0": "(Partial(avg),)",  # 6 rows: 3 per rank, equal counts
    "loss-smooth_l1-mean-selfS1-targetS1": "(Replicate(),)",  # 5 columns: 3 and 2, unequal counts
    "backward-smooth_l1-sum-selfS0-targetS0": "(Shard(dim=0),)",
    "backward-smooth_l1-mean-selfS0-targetS0": "(Replicate(),)",  # divides by self.numel(): whole self
    "backward-smooth_l1-mean-selfR-targetS0-self[5]": "(Shard(dim=0),)",  # self is whole on every rank
    "loss-kl-batchmean-selfS0-targetS0": "(Partial(sum),)",
    "loss-l1-mean-selfS1/S0-targetR/S0": "(Partial(avg), Partial(avg))",
    "backward-kl-none-selfS0-targetR-target[5]": "(Partial(sum),)",  # summed over dim 0 to target's shape
    "backward-kl-mean-selfS0-targetR-target[5]": "(Partial(avg),)",
    "backward-kl-sum-selfS1-targetS0-target[5]": "(Shard(dim=0),)",
    "outS1-l1-none-selfS1-targetS1": "(Shard(dim=1),)",
    "loss-mse-sum-selfS0-targetS0": "(Partial(sum),)",
    "backward-mse-sum-selfS0-targetS0": "(Shard(dim=0),)",
    "backward-mse-mean-selfS0-targetS0": "(Replicate(),)",  # divides by self.numel(), as smooth L1's
    # The row losses: each rank's rows; the counts of kept rows are the Python API's own DTensor ops.
    "loss-jsd-sum-studentS0-teacherS0": "(Partial(sum),)",
    "loss-jsd-labels-sum-studentS1-teacherS1": "(Partial(sum),)",
    "loss-jsd-none-studentS1-teacherS1": "(Shard(dim=1),)",
    # grad_output's K kept rows: which belong to a rank only the labels' values tell
    "backward-jsd-labels-none-studentS0-teacherS0": "(Replicate(),)",
    "backward-jsd-labels-sum-studentS0-teacherS0": "(Shard(dim=0),)",
    "backward-jsd-mean-studentS0-teacherS0": "(Replicate(),)",  # a rank's call would divide by its own N * V
    "loss-sparse-sum-studentS0-teacherS0": "(Partial(sum),)",
    "loss-sparse-none-studentS1-teacherS1": "(Shard(dim=1),)",
}


# torch 2.10 and before replicate a Partial(sum) DTensor divided by a number (the 'batchmean' division after
# the 'sum' op; seen on 2.7 to 2.10); 2.11 and later keep it Partial(sum). The value is the same either way
# (test_equals_one_process).
if tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) < (2, 11):
    PLACEMENTS["loss-kl-batchmean-selfS0-targetS0"] = "(Replicate(),)"


@pytest.mark.parametrize("case_id", PLACEMENTS)
def test_result_placements(case_id, dtensor_results):
    _skip_without_avg(dtensor_results[case_id], dtensor_results)
    assert dtensor_results[case_id]["placements"] == PLACEMENTS[case_id]


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-W", "error", "-c", code], cwd=package_parent(), capture_output=True, text=True,
        timeout=300,
    )


ALL_REGISTERED = """
from torch.distributed.tensor import DTensor
funcs = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs
overloads = [getattr(getattr(torch.ops.npu_loss, p), o) for p in torch.ops.npu_loss
             for o in getattr(torch.ops.npu_loss, p).overloads()]
assert len(overloads) >= 9, overloads
missing = [str(o) for o in overloads if o not in funcs]
assert not missing, missing
"""


def test_rules_registered_when_torch_distributed_tensor_is_imported_later():
    code = (
        "import sys, torch, npu_loss_ops\n"
        "assert 'torch.distributed.tensor' not in sys.modules\n"
        "import torch.distributed.tensor\n"
        "import importlib.machinery\n"
        "assert isinstance(torch.distributed.tensor.__loader__, importlib.machinery.SourceFileLoader)\n"
        "assert not [f for f in sys.meta_path if type(f).__module__ == 'npu_loss_ops._dtensor']\n"
        + ALL_REGISTERED + "print('ok')\n"
    )
    result = _python(code)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout.strip() == "ok"


def test_rules_registered_when_torch_distributed_tensor_was_imported_first():
    code = "import torch, torch.distributed.tensor, npu_loss_ops\n" + ALL_REGISTERED + "print('ok')\n"
    result = _python(code)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout.strip() == "ok"
