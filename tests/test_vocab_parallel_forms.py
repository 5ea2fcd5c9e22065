"""The rest of the family on a vocabulary split across gloo processes (loopback), against one process on the whole
tensors (the same function, no split, run here in the pytest process): sparse_jsd_loss (the student's logits
split, the served teacher's ids global), fused_linear_jsd_loss and fused_linear_sparse_jsd_loss (the lm_head
weights' rows split), through `vocab_parallel_group=` with uneven slices and through DTensor (weights Shard(0)
beside replicated hidden states on a 1-D mesh; on a 2x2 mesh the tokens split over the other dimension), and TRL's
switch (npu_loss_ops.trl.chunked_divergence_loss) with tensor-parallel heads (computed on the split) and FSDP's
(gathered). Every value, the entropy, the parts, and every gradient: the hidden states' (each rank's partial sum
with a group, summed here; whole with DTensor), the weights' and biases' rows, the teacher's log-probabilities.
The hard loss's labels fall in every rank's slice. One spawn per world runs every case.
"""
from __future__ import annotations

import datetime
import os
import socket
import tempfile
import traceback
from dataclasses import dataclass, field

import pytest
import torch
import torch.distributed as dist

import npu_loss_ops
from helpers import leave_gloo, run_ranks

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed with gloo"
)

TIME_LIMIT = 240 * float(os.environ.get("NPU_LOSS_OPS_TIME_LIMIT_SCALE", "1"))
V, H, K = 37, 6, 4
WIDTHS = {2: (20, 17), 4: (3, 23, 0, 11)}  # uneven contiguous slices in rank order, one empty
DTYPES = {"f64": torch.float64, "f32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Case:
    id: str
    world: int
    form: str  # "sparse", "fused", "fsparse", "trl"
    layout: str  # "group", "dt1", "dt2" (2x2 mesh: tokens over dimension 0), "fsdp1" (every tensor Shard(0) on a
    # 1-D mesh: FSDP's heads, gathered), "tp"/"fsdp" (the TRL switch)
    kwargs: dict = field(default_factory=dict, hash=False)
    labels: str = "some"  # "none", "some" (a few dropped, the rest in every rank's slice), "tok0" (rank 0's rows)
    dtype: str = "f64"
    bias: bool = False
    teacher_grad: bool = False


def _cases() -> list[Case]:
    cases = []
    for world in (2, 4):
        layouts = ["group", "dt1"] + (["dt2"] if world == 4 else [])
        for layout in layouts:
            tag = f"w{world}-{layout}"
            for i, (beta, red, tail, labels) in enumerate([
                    (0.0, "batchmean", True, "some"), (0.5, "sum", False, "none"), (1.0, "mean", True, "tok0"),
                    (0.5, "none", True, "none")]):
                if red == "none" and layout == "dt2":
                    continue
                kw = dict(beta=beta, reduction=red, add_tail=tail, temperature=1.5 if i % 2 else 1.0,
                          student_softcap=3.0 if i == 2 else None)
                cases.append(Case(f"sparse-{tag}-{i}", world, "sparse", layout, kw, labels, "f64",
                                  teacher_grad=i != 1))
            cases.append(Case(f"sparse-{tag}-bf16", world, "sparse", layout, dict(beta=0.5), "some", "bf16",
                              teacher_grad=True))
            cases.append(Case(f"sparse-{tag}-num_items", world, "sparse", layout, dict(num_items_in_batch=5.0),
                              "some", "f32"))
            for i, (beta, red, hard, temp) in enumerate([(0.5, "batchmean", 0.0, 1.0), (0.0, "sum", 0.4, 1.0),
                                                        (1.0, "mean", 0.3, 1.7), (0.5, "batchmean", 0.5, 2.0)]):
                kw = dict(beta=beta, reduction=red, weight_hard_loss=hard, temperature=temp, weight_soft_loss=0.8,
                          return_soft_hard_loss=True, return_entropy=i % 2 == 0,
                          student_softcap=4.0 if i == 2 else None, teacher_logit_scale=1.3 if i == 3 else 1.0)
                labels = "none" if hard == 0.0 and i == 0 else ("tok0" if i == 3 else "some")
                cases.append(Case(f"fused-{tag}-{i}", world, "fused", layout, kw, labels, "f64", bias=i % 2 == 1,
                                  teacher_grad=i == 1))
                fkw = {k: v for k, v in kw.items() if k != "teacher_logit_scale"}
                fkw.update(add_tail=i % 2 == 0, chunk_size=3 if i == 1 else None)
                cases.append(Case(f"fsparse-{tag}-{i}", world, "fsparse", layout, fkw, labels, "f64",
                                  bias=i % 2 == 1, teacher_grad=i != 0))
            cases.append(Case(f"fused-{tag}-bf16", world, "fused", layout, dict(weight_hard_loss=0.5), "some",
                              "bf16"))
            cases.append(Case(f"fsparse-{tag}-bf16", world, "fsparse", layout, dict(weight_hard_loss=0.5), "some",
                              "bf16"))
            cases.append(Case(f"fsparse-{tag}-num_items", world, "fsparse", layout,
                              dict(num_items_in_batch=6.0, weight_hard_loss=0.2), "some", "f32"))
        # FSDP's Shard(0) of the heads' rows with the hidden states sharded over the same dimension: gathered once.
        cases.append(Case(f"fused-w{world}-fsdp1", world, "fused", "fsdp1", dict(weight_hard_loss=0.3), "some",
                          "f64", bias=True))
        cases.append(Case(f"fsparse-w{world}-fsdp1", world, "fsparse", "fsdp1", dict(beta=0.5), "some", "f64"))
        for layout in ("tp", "fsdp"):
            cases.append(Case(f"trl-w{world}-{layout}", world, "trl", layout,
                              dict(beta=0.5, temperature=1.3, student_final_logit_softcapping=4.0), "none"))
    return cases


CASES = _cases()


def _inputs(case: Case, rank: int = 0):
    """The whole tensors of a case, from its id (each rank makes them alike, then keeps its part)."""
    g = torch.Generator().manual_seed(sum(map(ord, case.id)))
    dtype = DTYPES[case.dtype]
    rows = 8
    t: dict[str, torch.Tensor] = {}
    if case.form in ("sparse", "fsparse"):
        t["ids"] = torch.stack([torch.randperm(V, generator=g)[:K] for _ in range(rows)])
        t["logprobs"] = torch.log_softmax(torch.randn(rows, V, generator=g, dtype=torch.float64), -1).gather(
            1, t["ids"]).to(dtype)
        t["mask"] = torch.rand(rows, K, generator=g) > 0.25
    if case.form == "sparse":
        t["xs"] = (torch.randn(rows, V, generator=g, dtype=torch.float64) * 2).to(dtype)
    else:
        t["hs"] = torch.randn(rows, H, generator=g, dtype=torch.float64).to(dtype)
        t["ws"] = torch.randn(V, H, generator=g, dtype=torch.float64).to(dtype)
        t["bs"] = torch.randn(V, generator=g, dtype=torch.float64).to(dtype)
        t["ht"] = torch.randn(rows, H + 2, generator=g, dtype=torch.float64).to(dtype)
        t["wt"] = torch.randn(V, H + 2, generator=g, dtype=torch.float64).to(dtype)
        t["bt"] = torch.randn(V, generator=g, dtype=torch.float64).to(dtype)
    # Labels across the vocabulary, so that every rank's slice holds some; a few rows dropped.
    labels = torch.tensor([0, 36, 5, 21, 12, 30, 8, 17])
    if case.labels == "some":
        labels[[1, 6]] = -100
    elif case.labels == "tok0":
        labels[:4] = -100  # on a 2x2 mesh, every row of token rank 0
    t["labels"] = labels
    if case.form == "trl":
        t["hs_all"] = torch.randn(4, 2, 4, H, generator=g, dtype=torch.float64)
        t["ht_all"] = torch.randn(4, 2, 4, H + 2, generator=g, dtype=torch.float64)
        t["completion"] = torch.ones(2, 4)
        t["completion"][0, 2:] = 0
    return t


def _call(case: Case, t: dict, slices: dict | None, group, mesh):
    """The case's call on the whole tensors (slices None: the reference) or on the split; returns the results and
    the tensors whose gradients count, by name."""
    kw = dict(case.kwargs)
    labels = None if case.labels == "none" else t["labels"]
    leaves: dict[str, torch.Tensor] = {}

    def leaf(name, tensor, grad=True):
        tensor = tensor.detach().clone().requires_grad_(grad)
        leaves[name] = tensor
        return tensor

    if case.form == "trl":
        from npu_loss_ops import trl as package_trl

        rank = 0 if slices is None else dist.get_rank()
        which = 0 if case.layout == "tp" else rank
        hs = leaf("hs", t["hs_all"][which])
        ht = t["ht_all"][which]
        if slices is None:
            ws, wt = leaf("ws", t["ws"]), t["wt"]
        else:
            from torch.distributed.tensor import Shard, distribute_tensor

            ws = distribute_tensor(t["ws"], mesh, [Shard(0)]).requires_grad_()
            leaves["ws"] = ws
            wt = distribute_tensor(t["wt"], mesh, [Shard(0)])
        out = package_trl.chunked_divergence_loss(hs, ht, ws, wt, t["completion"], **kw)
        return out, leaves
    split = slices is not None
    if case.form == "sparse":
        xs = leaf("xs", t["xs"] if not split else slices["xs"])
        lp = leaf("logprobs", t["logprobs"], case.teacher_grad)
        args = (xs, lp, t["ids"], labels)
        extra = dict(support_mask=t["mask"])
        fn = npu_loss_ops.sparse_jsd_loss
    elif case.form == "fused":
        hs, ht = leaf("hs", t["hs"]), leaf("ht", t["ht"], case.teacher_grad)
        ws = leaf("ws", t["ws"] if not split else slices["ws"])
        wt = leaf("wt", t["wt"] if not split else slices["wt"], case.teacher_grad)
        if case.bias:
            kw["student_bias"] = leaf("bs", t["bs"] if not split else slices["bs"])
            kw["teacher_bias"] = leaf("bt", t["bt"] if not split else slices["bt"], case.teacher_grad)
        args = (hs, ws, ht, wt, labels)
        extra = {}
        fn = npu_loss_ops.fused_linear_jsd_loss
    else:
        hs = leaf("hs", t["hs"])
        ws = leaf("ws", t["ws"] if not split else slices["ws"])
        lp = leaf("logprobs", t["logprobs"], case.teacher_grad)
        if case.bias:
            kw["student_bias"] = leaf("bs", t["bs"] if not split else slices["bs"])
        args = (hs, ws, lp, t["ids"], labels)
        extra = dict(support_mask=t["mask"])
        fn = npu_loss_ops.fused_linear_sparse_jsd_loss
    if split and case.layout == "group":
        kw["vocab_parallel_group"] = group
    if split and case.layout != "group":
        args, extra, kw = _distributed(case, args, extra, kw, mesh, leaves)
    return fn(*args, **extra, **kw), leaves


def _distributed(case: Case, args, extra, kw, mesh, leaves):
    """The call's tensors as DTensors on `mesh`: what is split over the vocabulary Shard(-1) (logits) or Shard(0)
    (weights, biases) on the vocabulary's mesh dimension (the last), the rest replicated there; on a 2x2 mesh the
    rows sharded over dimension 0."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    token = [Shard(0)] if mesh.ndim == 2 else []
    placed: dict[int, object] = {}

    def put(tensor, vocab_placement, name=None):
        if tensor is None:
            return None
        rows_placement = [Replicate()] if name in ("ws", "wt", "bs", "bt") and mesh.ndim == 2 else token
        placements = rows_placement + [vocab_placement]
        if case.layout == "fsdp1":  # every tensor's first dimension over the one mesh dimension
            placements = [Shard(0)]
        d = distribute_tensor(tensor.detach(), mesh, placements).requires_grad_(tensor.requires_grad)
        if name is not None:
            leaves[name] = d
        return d

    names = {id(v): k for k, v in leaves.items()}
    new_args = []
    for a in args:
        name = names.get(id(a))
        if a is None:
            new_args.append(None)
        elif name in ("ws", "wt"):
            new_args.append(put(a, Shard(0), name))
        elif name == "xs":
            new_args.append(put(a, Shard(1), name))
        else:
            new_args.append(put(a, Replicate(), name))
    new_extra = {k: put(v, Replicate()) for k, v in extra.items()}
    new_kw = dict(kw)
    for k in ("student_bias", "teacher_bias"):
        if k in kw:
            new_kw[k] = put(kw[k], Shard(0), names[id(kw[k])])
    return new_args, new_extra, new_kw


def _outputs(out) -> list[torch.Tensor]:
    outs = list(out) if isinstance(out, tuple) else [out]
    return [o.full_tensor() if hasattr(o, "full_tensor") else o for o in outs]


def _backward(case: Case, loss: torch.Tensor) -> None:
    """The loss's backward; 'none''s with a fixed random grad_output (its values are the same on every rank)."""
    if case.kwargs.get("reduction") == "none":
        weights = torch.randn(loss.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        (loss.double() * weights).sum().backward()
    else:
        loss.backward()


def _run(case: Case, rank: int, group, meshes) -> dict:
    t = _inputs(case)
    world = dist.get_world_size()
    widths = WIDTHS[world]
    lo = sum(widths[:rank]) if case.layout == "group" else 0
    hi = lo + widths[rank] if case.layout == "group" else V
    slices = {"xs": t.get("xs", torch.zeros(1, V))[:, lo:hi], "ws": t.get("ws", torch.zeros(V))[lo:hi],
              "wt": t.get("wt", torch.zeros(V))[lo:hi], "bs": t.get("bs", torch.zeros(V))[lo:hi],
              "bt": t.get("bt", torch.zeros(V))[lo:hi]}
    mesh = meshes["dt2"] if case.layout == "dt2" else meshes["dt1"]
    from npu_loss_ops import _vocab_parallel

    split_calls = []
    names = ("fused_linear_jsd_loss", "fused_linear_sparse_jsd_loss")
    real = {name: getattr(_vocab_parallel, name) for name in names}
    for name in names:
        setattr(_vocab_parallel, name, lambda *a, _f=real[name], **k: (split_calls.append(1), _f(*a, **k))[1])
    try:
        out, leaves = _call(case, t, slices, group, mesh)
    finally:
        for name in names:
            setattr(_vocab_parallel, name, real[name])
    outs = _outputs(out)  # full_tensor() of a DTensor result: differentiable
    _backward(case, outs[0])
    grads = {}
    for name, tensor in leaves.items():
        if not tensor.requires_grad:
            continue
        g = tensor.grad
        if g is None:
            grads[name] = None
            continue
        if case.layout == "fsdp" and name == "ws":
            g = g.to_local()  # rank 0's rows of the gradient of its own tokens' loss (FSDP reduces the ranks' later)
        elif hasattr(g, "full_tensor"):
            g = g.full_tensor()
        elif case.layout == "group" and name in ("hs", "ht"):
            g = g.clone()
            dist.all_reduce(g)  # each rank's partial sum (Megatron's ColumnParallelLinear sums it)
        elif case.layout == "group" and name in ("xs", "ws", "wt", "bs", "bt"):
            every = [None] * world
            dist.all_gather_object(every, g)
            g = torch.cat(every, dim=1 if name == "xs" else 0)
        grads[name] = g
    return {"outs": [o.detach() for o in outs], "grads": grads, "split": bool(split_calls)}


def _worker(rank: int, world: int, result_dir: str) -> None:
    if "lo" in {name for _, name in socket.if_nameindex()}:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    store = f"file://{os.path.join(result_dir, 'store')}"
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    finished = False
    try:
        from torch.distributed.device_mesh import init_device_mesh

        meshes = {"dt1": init_device_mesh("cpu", (world,))}
        if world == 4:
            meshes["dt2"] = init_device_mesh("cpu", (2, 2))
        results = {}
        for case in CASES:
            if case.world != world:
                continue
            try:
                results[case.id] = _run(case, rank, dist.group.WORLD, meshes)
            except Exception:
                results[case.id] = {"error": traceback.format_exc()}
        if world == 2:
            results["payload"] = _payload(meshes)
            results["refused"] = _refused_on_one_rank(rank)
        if rank == 0:
            torch.save(results, os.path.join(result_dir, "results.pt"))
        finished = True
    finally:
        leave_gloo(finished)


# Rank 0's arguments wrong, rank 1's right: each function's own check raises on rank 0, and rank 1, told by the
# split's first collective, raises too instead of waiting in the next one; then the group is used again.
REFUSED_CALLS = {
    "generalized": lambda r, w: npu_loss_ops.generalized_jsd_loss(
        torch.randn(4, 5), torch.randn(4, 5 if r else 6), vocab_parallel_group=w),
    "sparse": lambda r, w: npu_loss_ops.sparse_jsd_loss(
        torch.randn(4, 5), torch.randn(4, 2), torch.zeros(4 if r else 3, 2, dtype=torch.long), vocab_parallel_group=w),
    "fused": lambda r, w: npu_loss_ops.fused_linear_jsd_loss(
        torch.randn(4, 3), torch.randn(5, 3), torch.randn(4, 3), torch.randn(5, 3 if r else 2), vocab_parallel_group=w),
    "fsparse": lambda r, w: npu_loss_ops.fused_linear_sparse_jsd_loss(
        torch.randn(4, 3), torch.randn(5, 3 if r else 2), torch.randn(4, 2), torch.zeros(4, 2, dtype=torch.long),
        vocab_parallel_group=w),
}
REFUSED_MESSAGES = {"generalized": "student_logits and teacher_logits must have the same shape",
                    "sparse": "teacher_token_ids must be (..., K)", "fused": "teacher_weight must be (V_r, H)",
                    "fsparse": "student_weight must be (V_r, H)"}


def _refused_on_one_rank(rank: int) -> list[dict]:
    mine = {}
    for name, call in REFUSED_CALLS.items():
        try:
            call(rank, dist.group.WORLD)
            mine[name] = "no error"
        except Exception as exc:  # noqa: BLE001 - the class and message are what the test reads
            mine[name] = f"{type(exc).__name__}: {exc}"
    after = npu_loss_ops.generalized_jsd_loss(torch.ones(2, 3), torch.zeros(2, 3),
                                              vocab_parallel_group=dist.group.WORLD)
    mine["after"] = float(after)
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every


@pytest.mark.parametrize("name", list(REFUSED_CALLS))
def test_one_rank_refused_stops_every_rank(name: str):
    """A rank whose own arguments are refused raises its error; its peer raises a RuntimeError naming that rank,
    instead of waiting in a collective; and the group works afterwards."""
    got = _results(2)["refused"]
    assert got[0][name].startswith("RuntimeError: ") and REFUSED_MESSAGES[name] in got[0][name], got[0][name]
    assert got[1][name].startswith(f"RuntimeError: {'generalized_jsd_loss' if name == 'generalized' else ''}")
    assert "rank 0 of the group refused its arguments" in got[1][name], got[1][name]
    expected = float(npu_loss_ops.generalized_jsd_loss(torch.ones(2, 3), torch.zeros(2, 3)))
    assert got[0]["after"] == pytest.approx(expected) and got[1]["after"] == pytest.approx(expected)


PAYLOAD_VOCABS = (32768, 151936)
PAYLOAD_FORMS = ("sparse", "fused-group", "fused-dt1", "fsparse-group", "fsparse-dt1")


def _payload(meshes) -> dict:
    """The bytes each collective of one call with its backward sends from this rank, by form and V (N 4, H 8)."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    for form in PAYLOAD_FORMS:
        for vocab in PAYLOAD_VOCABS:
            g = torch.Generator().manual_seed(vocab)
            lo, hi = vocab * rank // world, vocab * (rank + 1) // world
            labels = torch.tensor([1, -100, 2, vocab - 1])
            ids = torch.tensor([[0, 5], [1, 2], [vocab - 1, 3], [4, 7]])
            logprobs = torch.log(torch.tensor([[0.5, 0.25]] * 4))
            hs, ht = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
            ws, wt = torch.randn(vocab, 8, generator=g), torch.randn(vocab, 8, generator=g)
            calls: list[int] = []
            saved = {name: getattr(dist, name) for name in ("all_reduce", "all_gather")}

            def counted(*args, _fn=None, _gather=False, **kwargs):
                sent = args[1] if _gather else args[0]
                calls.append(sent.numel() * sent.element_size())
                return _fn(*args, **kwargs)

            dist.all_reduce = lambda *a, **k: counted(*a, _fn=saved["all_reduce"], **k)
            dist.all_gather = lambda *a, **k: counted(*a, _fn=saved["all_gather"], _gather=True, **k)
            try:
                if form == "sparse":
                    x = (torch.randn(4, vocab, generator=g)[:, lo:hi]).requires_grad_()
                    out = npu_loss_ops.sparse_jsd_loss(x, logprobs, ids, labels, vocab_parallel_group=dist.group.WORLD)
                elif form.endswith("-dt1"):
                    mesh = meshes["dt1"]
                    rep = lambda t: distribute_tensor(t, mesh, [Replicate()])  # noqa: E731
                    w = distribute_tensor(ws, mesh, [Shard(0)]).requires_grad_()
                    h = rep(hs).requires_grad_()
                    if form.startswith("fused"):
                        out = npu_loss_ops.fused_linear_jsd_loss(h, w, rep(ht), distribute_tensor(wt, mesh, [Shard(0)]),
                                                                 rep(labels), weight_hard_loss=0.5)
                    else:
                        out = npu_loss_ops.fused_linear_sparse_jsd_loss(h, w, rep(logprobs), rep(ids), rep(labels),
                                                                        weight_hard_loss=0.5)
                    out = out.full_tensor()
                else:
                    h = hs.clone().requires_grad_()
                    w = ws[lo:hi].clone().requires_grad_()
                    if form.startswith("fused"):
                        out = npu_loss_ops.fused_linear_jsd_loss(h, w, ht, wt[lo:hi], labels, weight_hard_loss=0.5,
                                                                 vocab_parallel_group=dist.group.WORLD)
                    else:
                        out = npu_loss_ops.fused_linear_sparse_jsd_loss(h, w, logprobs, ids, labels,
                                                                        weight_hard_loss=0.5,
                                                                        vocab_parallel_group=dist.group.WORLD)
                out.backward()
            finally:
                dist.all_reduce, dist.all_gather = saved["all_reduce"], saved["all_gather"]
            results[(form, vocab)] = calls
    return results


@pytest.mark.parametrize("form", PAYLOAD_FORMS)
def test_payload_does_not_grow_with_the_vocabulary(form: str):
    """The bytes one call with its backward sends through torch.distributed are the same at V 32,768 and 151,936
    (the same N and H), and a few floats per row: never the logits or a head's rows."""
    got = _results(2)["payload"]
    small, large = (got[(form, v)] for v in PAYLOAD_VOCABS)
    assert small and small == large, (small, large)
    assert sum(large) <= 4 * 8 * 4 + 64 * 4 * 8, large  # one N x H float32 gradient and per-row floats


_RESULTS: dict[int, dict] = {}


def _results(world: int) -> dict:
    if world not in _RESULTS:
        with tempfile.TemporaryDirectory() as result_dir:
            run_ranks(_worker, (world, result_dir), world, TIME_LIMIT, f"the {world} processes")
            _RESULTS[world] = torch.load(os.path.join(result_dir, "results.pt"))
    return _RESULTS[world]


def _reference(case: Case) -> dict:
    t = _inputs(case)
    out, leaves = _call(case, t, None, None, None)
    outs = _outputs(out)
    _backward(case, outs[0])
    return {"outs": [o.detach() for o in outs], "grads": {k: v.grad for k, v in leaves.items() if v.requires_grad}}


def _close(got: torch.Tensor, want: torch.Tensor, dtype: str, what: str) -> None:
    scale = want.detach().double().abs().max().item() if want.numel() else 0.0
    rtol, atol = {"f64": (1e-9, 1e-12), "f32": (1e-5, 1e-6), "bf16": (2e-2, 2e-2)}[dtype]
    torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=atol * max(scale, 1.0),
                               msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_equals_one_process(case: Case):
    got = _results(case.world)[case.id]
    assert "error" not in got, got.get("error")
    want = _reference(case)
    if case.form != "sparse":  # a vocabulary split is computed on the split; FSDP's rows are gathered, as TRL does
        assert got["split"] == (case.layout not in ("fsdp", "fsdp1"))
    assert len(got["outs"]) == len(want["outs"])
    for i, (a, b) in enumerate(zip(got["outs"], want["outs"])):
        _close(a, b, case.dtype, f"result {i}")
    assert set(got["grads"]) == set(want["grads"])
    for name, g in got["grads"].items():
        assert g is not None, name
        expected = want["grads"][name]
        if case.layout == "fsdp" and name == "ws":
            expected = expected[:-(-V // case.world)]  # rank 0's rows: Shard(0) places ceil(V / P) there
        _close(g, expected, case.dtype, f"grad {name}")


# ---- the split's local parts on the test device (the emulated NPU in its suite): torch's ops on the device's
# tensors, the collectives through gloo on host copies, against one process on the CPU ----


def _device_worker(rank: int, device: str, result_dir: str) -> None:
    if device == "npu":
        import sys

        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "npu_emulator"))
        import emulator

        emulator.import_torch_npu()
        emulator.pin_jit_compile_off()  # 910 and 310P: ops on aclnn in the autograd worker too (its README, Traps)
    store = f"file://{os.path.join(result_dir, 'store')}"
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    finished = False
    try:
        results = {}
        for name in DEVICE_CALLS:
            try:
                results[name] = _device_call(name, rank, 2, device)
            except Exception:
                results[name] = {"error": traceback.format_exc()}
        every: list = [None] * 2
        dist.all_gather_object(every, results)
        if rank == 0:
            torch.save(every, os.path.join(result_dir, "device.pt"))
        finished = True
    finally:
        leave_gloo(finished)


DEVICE_CALLS = ("generalized", "generalized_none", "sparse", "fused", "fsparse")


def _device_call(name: str, rank: int, world: int, device: str) -> dict:
    """One call of `name` on this rank's part (rank None: the whole tensors, on the CPU), float32, with its
    backward: the loss and the gradients of this rank's part, on the CPU."""
    g = torch.Generator().manual_seed(7)
    n, v, h, k = 6, 37, 5, 3
    lo, hi = (0, v) if rank is None else (v * rank // world, v * (rank + 1) // world)
    xs, xt = torch.randn(n, v, generator=g) * 2, torch.randn(n, v, generator=g) * 2
    hs, ws = torch.randn(n, h, generator=g), torch.randn(v, h, generator=g)
    ht, wt = torch.randn(n, h, generator=g), torch.randn(v, h, generator=g)
    ids = torch.stack([torch.randperm(v, generator=g)[:k] for _ in range(n)])
    logprobs = torch.log_softmax(torch.randn(n, v, generator=g), -1).gather(1, ids)
    labels = torch.tensor([1, -100, 30, 4, -100, 20])
    dev = torch.device(device)
    kw = {} if rank is None else {"vocab_parallel_group": dist.group.WORLD}
    leaves = {}

    def leaf(key, tensor):
        leaves[key] = tensor.to(dev).requires_grad_()
        return leaves[key]

    if name == "generalized":
        loss = npu_loss_ops.generalized_jsd_loss(leaf("xs", xs[:, lo:hi]), xt[:, lo:hi].to(dev), labels.to(dev),
                                                 beta=0.5, temperature=1.5, student_softcap=4.0, **kw)
    elif name == "generalized_none":  # 'none' without labels: (n, V_r) values, the backward recomputes the terms
        values = npu_loss_ops.generalized_jsd_loss(leaf("xs", xs[:, lo:hi]), xt[:, lo:hi].to(dev), beta=0.3,
                                                   reduction="none", **kw)
        weights = torch.randn(n, v, generator=g)[:, lo:hi].to(dev)
        (values * weights).sum().backward()
        return {"loss": values.detach().cpu(), "device": str(values.device), "lo": lo, "hi": hi,
                "xs": leaves["xs"].grad.cpu()}
    elif name == "sparse":
        loss = npu_loss_ops.sparse_jsd_loss(leaf("xs", xs[:, lo:hi]), leaf("logprobs", logprobs), ids.to(dev),
                                            labels.to(dev), beta=0.5, **kw)
    elif name == "fused":
        loss = npu_loss_ops.fused_linear_jsd_loss(leaf("hs", hs), leaf("ws", ws[lo:hi]), ht.to(dev),
                                                  wt[lo:hi].to(dev), labels.to(dev), weight_hard_loss=0.3,
                                                  temperature=1.5, **kw)
    else:
        loss = npu_loss_ops.fused_linear_sparse_jsd_loss(leaf("hs", hs), leaf("ws", ws[lo:hi]),
                                                         leaf("logprobs", logprobs), ids.to(dev), labels.to(dev),
                                                         weight_hard_loss=0.3, **kw)
    loss.backward()
    return {"loss": loss.detach().cpu(), "device": str(loss.device), "lo": lo, "hi": hi,
            **{key: t.grad.cpu() for key, t in leaves.items()}}


_DEVICE_RESULTS: dict[str, list] = {}


def _device_results(device: str) -> list:
    if device in _DEVICE_RESULTS:
        return _DEVICE_RESULTS[device]
    with tempfile.TemporaryDirectory() as result_dir:
        run_ranks(_device_worker, (device, result_dir), 2, TIME_LIMIT, f"the two processes on {device}")
        _DEVICE_RESULTS[device] = torch.load(os.path.join(result_dir, "device.pt"))
    return _DEVICE_RESULTS[device]


@pytest.mark.parametrize("name", DEVICE_CALLS)
def test_local_parts_on_the_device(name, device):
    """Each function's split on the test device's tensors, its collectives through gloo on host copies, gives one CPU
    process's loss and gradients (on the emulated NPU: torch_npu's ops over the emulated CANN)."""
    device_results = _device_results(device)
    want = _device_call(name, None, 2, "cpu")
    for rank, every in enumerate(device_results):
        got = every[name]
        assert "error" not in got, got.get("error")
        assert got["device"].startswith(device), got["device"]
        lo, hi = got["lo"], got["hi"]
        loss = want["loss"][:, lo:hi] if want["loss"].dim() else want["loss"]  # 'none': this rank's columns
        torch.testing.assert_close(got["loss"], loss, rtol=1e-4, atol=1e-5)
        for key in ("xs", "ws"):
            if key in got:
                part = want[key][:, lo:hi] if key == "xs" else want[key][lo:hi]
                torch.testing.assert_close(got[key], part, rtol=1e-4, atol=1e-5, msg=lambda m: f"{key}: {m}")
        if "logprobs" in got:
            torch.testing.assert_close(got["logprobs"], want["logprobs"], rtol=1e-4, atol=1e-5)
    if "hs" in want:  # each rank's partial sum (Megatron's ColumnParallelLinear sums it)
        torch.testing.assert_close(device_results[0][name]["hs"] + device_results[1][name]["hs"], want["hs"],
                                   rtol=1e-4, atol=1e-5)
