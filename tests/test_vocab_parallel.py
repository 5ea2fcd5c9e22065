"""generalized_jsd_loss on a vocabulary split across gloo processes (loopback) gives what one process gives on the
whole tensors: the loss, 'none''s values, the entropy and both gradients, compared with the CPU kernel's call on
the whole tensors (the same function, no split) run here in the pytest process.

The layouts: `vocab_parallel_group=dist.group.WORLD` with plain slices of uneven widths (0 on some rank included)
at worlds 2 and 4; DTensor logits placed Shard(-1) on a 1-D mesh at worlds 2 and 4; a 2x2 mesh placed
(Shard(0), Shard(-1)) (tokens over mesh dimension 0, the vocabulary over 1) at world 4. The cases go over beta 0,
0.5 and 1, every reduction, labels absent, some rows dropped, every row of one token rank dropped and every row
dropped, num_items_in_batch (a number, a 0-dim tensor), the logit transforms with temperature != 1, the entropy,
float64, float32, bfloat16 (and a mixed pair), a teacher with and without requires_grad. 'none''s backward runs
with a random grad_output, so that its all-reduce runs too.

Also here: the refusals (a teacher split unlike the student, a vocab_parallel_group that is not a ProcessGroup,
ranks with different rows, DTensor logits with a group, plain labels on a token-sharded mesh), each raised on
every rank with the group still usable after them, and the payload: the bytes that cross the group in one call
with its backward depend on the rows, not on V.

Some cases make the package's chunk of rows small (its _CHUNK_ELEMENTS, for the case's call), so that small
tensors take several chunks; a few take a real vocabulary (262,147).

One spawn per world runs every case (each rank saves its results); each case is then its own test here. The cases
where a rank's slice has width 0 run last in their spawn, so that an error there cannot leave peers waiting (_worker).
"""
from __future__ import annotations

import contextlib
import datetime
import math
import os
import socket
import tempfile
import traceback
import zlib
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist

import npu_loss_ops
from helpers import leave_gloo, run_ranks

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed with gloo"
)

# Seconds for one world's processes, all its cases; times NPU_LOSS_OPS_TIME_LIMIT_SCALE (qemu sets 3).
TIME_LIMIT = 180 * float(os.environ.get("NPU_LOSS_OPS_TIME_LIMIT_SCALE", "1"))
WORLDS = (2, 4)
V = 37  # odd: every split of it is uneven
BIG_V = 262147  # odd, over 2**18: several chunks of rows
DTYPES = {
    "f64": (torch.float64, torch.float64),
    "f32": (torch.float32, torch.float32),
    "bf16": (torch.bfloat16, torch.bfloat16),
    "mixed": (torch.bfloat16, torch.float32),  # the student's bfloat16, the teacher's float32
}
TRANSFORMS = {
    0: {},
    1: {"temperature": 2.0, "student_softcap": 3.0, "teacher_logit_scale": 1.5},
    2: {"temperature": 0.7, "teacher_softcap": 4.0, "student_logit_scale": 0.8, "teacher_logit_scale": 1.25},
}
# Contiguous partitions of V in rank order, by world: the vocab_parallel_group cases take them in turn.
WIDTHS = {
    2: ([19, 18], [5, 32], [30, 7], [36, 1]),
    4: ([10, 9, 9, 9], [1, 30, 1, 5], [2, 1, 33, 1], [12, 3, 20, 2]),
}


@dataclass(frozen=True)
class Case:
    id: str
    world: int
    layout: str  # "group" (vocab_parallel_group, plain slices), "dt1" (1-D mesh Shard(-1)), "dt2" (2x2 mesh)
    beta: float
    reduction: str
    labels: str  # "none", "some" (every third row dropped), "tok0" (dim 0's first half dropped), "all"
    num_items: object = None  # None, a number, or "tensor:<value>"
    transform: int = 0
    entropy: bool = False
    dtype: str = "f32"
    teacher_grad: bool = True
    lead: tuple[int, ...] = (2, 3)
    widths: tuple[int, ...] = ()  # "group": each rank's slice
    plain_labels: bool = False  # "dt1": labels a plain full tensor, not a DTensor
    shard_dim: int = -1  # "dt1"/"dt2": the vocabulary's Shard dim as written (-1 or ndim - 1)
    noncontiguous: bool = False  # "group": each rank's slices are views of the whole tensors
    ignore_index: int = -100
    vocab: int = V
    chunk_elements: int = 0  # the package's _CHUNK_ELEMENTS for this case (0: its own)


# One row per case of each world and layout: (beta, reduction, labels, num_items, transform, entropy, dtype,
# teacher requires grad). Each layout covers every item of the matrix at least once.
BASE = [
    (0.5, "batchmean", "none", None, 0, False, "f64", True),
    (0.0, "sum", "some", None, 0, False, "f64", False),
    (1.0, "mean", "some", None, 1, True, "f32", True),
    (0.5, "none", "none", None, 0, False, "f64", True),
    (0.5, "none", "some", None, 2, True, "f32", False),
    (0.0, "batchmean", "all", None, 0, True, "f32", True),
    (1.0, "mean", "all", None, 0, False, "f64", True),
    (0.5, "batchmean", "some", 7, 1, False, "f32", True),
    (0.5, "mean", "none", "tensor:6.5", 0, False, "f64", False),
    (0.5, "batchmean", "some", None, 0, False, "bf16", True),
    (0.0, "none", "all", None, 0, False, "bf16", False),
    (1.0, "none", "some", None, 1, True, "f64", True),
    (0.3, "sum", "none", "tensor:9", 2, True, "bf16", True),
]


def _cases() -> list[Case]:
    cases: list[Case] = []

    def add(world: int, layout: str, row: tuple, **extra) -> None:
        beta, reduction, labels, num_items, transform, entropy, dtype, teacher_grad = row
        index = sum(1 for c in cases if (c.world, c.layout) == (world, layout))
        if layout == "group" and "widths" not in extra:
            extra["widths"] = tuple(WIDTHS[world][index % len(WIDTHS[world])])
        if "lead" not in extra:
            extra["lead"] = (2, 3) if index % 2 == 0 else (6,)
        if layout != "group" and "shard_dim" not in extra:
            extra["shard_dim"] = -1 if index % 2 == 0 else len(extra["lead"])
        name = (f"{layout}{world}-{index:02d}-beta{beta}-{reduction}-labels_{labels}"
                + (f"-items_{str(num_items).replace(':', '')}" if num_items is not None else "")
                + (f"-transform{transform}" if transform else "") + ("-entropy" if entropy else "")
                + f"-{dtype}" + ("" if teacher_grad else "-teacher_nograd")
                + "".join(f"-{k}_{v}".replace(" ", "").replace("(", "").replace(")", "").replace(",", "x")
                          for k, v in sorted(extra.items())))
        cases.append(Case(name, world, layout, beta, reduction, labels, num_items, transform, entropy, dtype,
                          teacher_grad, **extra))

    for world in WORLDS:
        for layout in ("group", "dt1"):
            for row in BASE:
                add(world, layout, row)
        add(world, "group", (0.5, "batchmean", "some", None, 0, True, "f32", True), noncontiguous=True)
        add(world, "group", (0.5, "none", "none", 2.5, 0, False, "mixed", True))  # 'none' with num_items: a scalar
        add(world, "group", (0.5, "sum", "some", None, 1, False, "f64", True), ignore_index=3)
        add(world, "dt1", (0.5, "none", "some", None, 0, True, "f64", True), plain_labels=True)
        add(world, "dt1", (1.0, "batchmean", "some", None, 0, False, "f32", True), plain_labels=True)
    # The 2x2 mesh: tokens over mesh dimension 0, the vocabulary over 1.
    dt2 = [
        (0.5, "batchmean", "none", None, 0, False, "f64", True),
        (0.0, "sum", "some", None, 0, False, "f64", False),
        (1.0, "mean", "tok0", None, 1, True, "f32", True),
        (0.5, "none", "none", None, 0, True, "f64", True),
        (0.5, "none", "some", None, 2, True, "f32", False),
        (0.5, "none", "tok0", None, 0, False, "f64", True),
        (0.0, "batchmean", "tok0", None, 0, True, "f32", True),
        (1.0, "mean", "all", None, 0, False, "f64", True),
        (0.5, "batchmean", "some", 7, 1, False, "f32", True),
        (0.5, "mean", "none", "tensor:6.5", 0, False, "f64", False),
        (0.5, "batchmean", "tok0", None, 0, False, "bf16", True),
        (0.0, "none", "all", None, 0, False, "bf16", False),
        (1.0, "sum", "all", None, 1, True, "f64", True),
        (0.3, "none", "tok0", "tensor:9", 2, True, "bf16", True),
    ]
    for row in dt2:
        add(4, "dt2", row)
    add(4, "dt2", (0.5, "batchmean", "tok0", None, 0, True, "f64", True), lead=(5,))  # tokens 3 and 2
    add(4, "dt2", (0.5, "none", "none", None, 1, False, "f32", True), lead=(5,))
    add(4, "dt2", (0.5, "mean", "some", None, 0, False, "f64", True), lead=(5,))
    # Rows in several chunks: the package's chunk made 1 row (chunk_elements 1) or 2 rows (2 V / P + 1 elements
    # of the whole vocabulary, P the vocabulary's ranks), with rows dropped inside the chunks.
    for world, layout in ((2, "group"), (4, "group"), (2, "dt1"), (4, "dt1"), (4, "dt2")):
        two_rows = 2 * V // (2 if layout == "dt2" else world) + 1
        add(world, layout, (0.5, "none", "some", None, 1, True, "f32", True), chunk_elements=1)
        if layout == "dt2":  # tokens 3 and 2: chunks of 2 and 1 rows
            add(world, layout, (1.0, "batchmean", "none", None, 0, True, "f64", True), chunk_elements=two_rows,
                lead=(5,))
        else:
            add(world, layout, (1.0, "batchmean", "some", None, 0, True, "f64", True), chunk_elements=two_rows)
    # A real vocabulary (over 2**18 entries; several chunks of the package's own size at some worlds).
    for world in WORLDS:
        add(world, "group", (0.5, "none", "some", None, 1, True, "f32", True), vocab=BIG_V, lead=(7,),
            widths=(100000, BIG_V - 100000) if world == 2 else (70000, 1, 100000, BIG_V - 100001 - 70000))
        add(world, "dt1", (1.0, "mean", "some", None, 2, True, "f32", True), vocab=BIG_V, lead=(7,))
    add(4, "dt2", (0.5, "none", "tok0", None, 1, True, "f32", True), vocab=BIG_V, lead=(7,))
    # Slices of width 0 on some ranks (run last in each spawn: see _worker).
    add(2, "group", (0.5, "batchmean", "some", None, 0, True, "f32", True), widths=(37, 0))
    add(2, "group", (0.5, "none", "none", None, 2, False, "f64", True), widths=(0, 37))
    add(4, "group", (0.0, "none", "some", None, 0, True, "f64", True), widths=(1, 30, 0, 6))
    add(4, "group", (1.0, "mean", "none", None, 1, False, "bf16", False), widths=(0, 0, 37, 0))
    add(4, "dt1", (0.5, "none", "some", None, 0, True, "f32", True), vocab=3)  # DTensor's chunks: 1, 1, 1, 0
    return cases


CASES = _cases()


def _zero_width(case: Case) -> bool:
    """Whether some rank's slice has width 0 (DTensor's Shard: chunks of ceil(V / P) entries)."""
    if case.layout == "group":
        return 0 in case.widths
    ranks = case.world if case.layout == "dt1" else 2
    return math.ceil(case.vocab / ranks) * (ranks - 1) >= case.vocab


def _seed(name: str) -> int:
    return zlib.crc32(name.encode())


def _inputs(case: Case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """The whole student and teacher logits, the labels (or None) and a grad_output of 'none''s whole shape."""
    g = torch.Generator().manual_seed(_seed(case.id))
    shape = (*case.lead, case.vocab)
    student = torch.randn(shape, generator=g, dtype=torch.float64) * 3
    teacher = torch.randn(shape, generator=g, dtype=torch.float64) * 3
    labels = torch.randint(0, case.vocab, case.lead, generator=g)
    if case.ignore_index >= 0:
        labels[labels == case.ignore_index] = case.vocab - 1 - case.ignore_index
    flat = labels.view(-1)
    if case.labels == "some":
        flat[1::3] = case.ignore_index
        flat[0] = case.vocab + 5  # outside [0, V): only keeps its row
    elif case.labels == "tok0":
        labels[: math.ceil(case.lead[0] / 2)] = case.ignore_index
    elif case.labels == "all":
        labels.fill_(case.ignore_index)
    sdt, tdt = DTYPES[case.dtype]
    student, teacher = student.to(sdt), teacher.to(tdt)
    if case.labels == "none":
        out_shape, labels_out = shape, None
    else:
        out_shape, labels_out = (int((labels != case.ignore_index).sum()), case.vocab), labels
    weight = torch.randn(out_shape, generator=g, dtype=torch.float64).to(torch.promote_types(sdt, tdt))
    return student, teacher, labels_out, weight


def _num_items(case: Case):
    if isinstance(case.num_items, str):
        text = case.num_items.split(":")[1]
        return torch.tensor(float(text)) if "." in text else torch.tensor(int(text))
    return case.num_items


def _kwargs(case: Case) -> dict:
    return dict(beta=case.beta, reduction=case.reduction, num_items_in_batch=_num_items(case),
                ignore_index=case.ignore_index, return_entropy=case.entropy, **TRANSFORMS[case.transform])


def _call(case: Case, student, teacher, labels, weight, group=None):
    """The call and its backward: (loss, entropy or None); the gradients are on the leaves."""
    out = npu_loss_ops.generalized_jsd_loss(student, teacher, labels, vocab_parallel_group=group, **_kwargs(case))
    value, entropy = out if case.entropy else (out, None)
    if value.dim() == 0:
        value.backward()
    else:
        (value * weight).sum().backward()
    return value, entropy


def _offsets(widths) -> list[int]:
    return [sum(widths[:i]) for i in range(len(widths))]


def _clone(x):
    return None if x is None else x.detach().clone()


# ---- the worker -------------------------------------------------------------------------------------------------


def _run_group(case: Case, rank: int) -> dict:
    student, teacher, labels, weight = _inputs(case)
    start, width = _offsets(case.widths)[rank], case.widths[rank]
    if case.noncontiguous:  # views of the whole tensors: strided rows
        s = student[..., start:start + width].requires_grad_()
        t = teacher[..., start:start + width].requires_grad_(case.teacher_grad)
        assert width in (0, case.vocab) or not s.is_contiguous()
    else:
        s = student[..., start:start + width].clone().requires_grad_()
        t = teacher[..., start:start + width].clone().requires_grad_(case.teacher_grad)
    value, entropy = _call(case, s, t, labels, weight[..., start:start + width], dist.group.WORLD)
    return {"value": _clone(value), "entropy": _clone(entropy), "grad_student": _clone(s.grad),
            "grad_teacher": _clone(t.grad), "value_requires_grad": value.requires_grad}


def _run_dtensor(case: Case, meshes) -> dict:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    student, teacher, labels, weight = _inputs(case)
    mesh = meshes[case.layout]
    vocab = Shard(case.shard_dim)
    placements = [vocab] if case.layout == "dt1" else [Shard(0), vocab]
    sd = distribute_tensor(student, mesh, placements).requires_grad_()
    td = distribute_tensor(teacher, mesh, placements).requires_grad_(case.teacher_grad)
    if labels is not None and not case.plain_labels:
        labels = distribute_tensor(labels, mesh, [Replicate()] if case.layout == "dt1" else [Shard(0), Replicate()])
    out = npu_loss_ops.generalized_jsd_loss(sd, td, labels, **_kwargs(case))
    value, entropy = out if case.entropy else (out, None)
    if value.dim() == 0:
        value.backward()
    else:
        (value * distribute_tensor(weight, mesh, value.placements)).sum().backward()

    def full(x):
        return None if x is None else x.full_tensor().detach().clone()

    def where(x):
        return None if x is None else str(tuple(x.placements))

    return {"value": full(value), "entropy": full(entropy), "grad_student": full(sd.grad),
            "grad_teacher": full(td.grad), "local_value": _clone(value.to_local()),
            "local_entropy": None if entropy is None else _clone(entropy.to_local()),
            "placements": {"value": where(value), "entropy": where(entropy), "student": where(sd),
                           "grad_student": where(sd.grad), "grad_teacher": where(td.grad)},
            "value_requires_grad": value.requires_grad}


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _refusals(world: int, rank: int, meshes) -> dict[str, str]:
    """Each refused call on this rank: its exception, or "no error". Then a good call, which shows that no
    rank is left inside a collective."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    g = torch.Generator().manual_seed(5)
    student, teacher = torch.randn(6, V, generator=g), torch.randn(6, V, generator=g)
    mesh = meshes["dt1"]
    calls = {
        "teacher-replicate": lambda: npu_loss_ops.generalized_jsd_loss(
            distribute_tensor(student, mesh, [Shard(-1)]).requires_grad_(),
            distribute_tensor(teacher, mesh, [Replicate()])),
        "student-replicate": lambda: npu_loss_ops.generalized_jsd_loss(
            distribute_tensor(student, mesh, [Replicate()]).requires_grad_(),
            distribute_tensor(teacher, mesh, [Shard(1)])),
        "group-a-string": lambda: npu_loss_ops.generalized_jsd_loss(
            student, teacher, vocab_parallel_group="WORLD"),
        "group-a-list-of-ranks": lambda: npu_loss_ops.generalized_jsd_loss(
            student, teacher, vocab_parallel_group=list(range(world))),
        "rows-differ": lambda: npu_loss_ops.generalized_jsd_loss(
            student[: 6 - (rank == world - 1), rank::world].requires_grad_(),
            teacher[: 6 - (rank == world - 1), rank::world], vocab_parallel_group=dist.group.WORLD),
        "kept-differ": lambda: npu_loss_ops.generalized_jsd_loss(
            student[:, rank::world].requires_grad_(), teacher[:, rank::world],
            torch.tensor([-100 if i < rank else 1 for i in range(6)]), vocab_parallel_group=dist.group.WORLD),
        "dtensor-with-group": lambda: npu_loss_ops.generalized_jsd_loss(
            distribute_tensor(student, mesh, [Shard(-1)]).requires_grad_(),
            distribute_tensor(teacher, mesh, [Shard(-1)]), vocab_parallel_group=dist.group.WORLD),
    }
    if world == 4:
        mesh2 = meshes["dt2"]
        calls["teacher-replicated-tokens-2x2"] = lambda: npu_loss_ops.generalized_jsd_loss(
            distribute_tensor(student, mesh2, [Shard(0), Shard(1)]).requires_grad_(),
            distribute_tensor(teacher, mesh2, [Replicate(), Shard(1)]))
        calls["plain-labels-token-sharded-2x2"] = lambda: npu_loss_ops.generalized_jsd_loss(
            distribute_tensor(student, mesh2, [Shard(0), Shard(1)]).requires_grad_(),
            distribute_tensor(teacher, mesh2, [Shard(0), Shard(1)]), torch.arange(6))
    results = {}
    for name, call in calls.items():
        try:
            call()
            results[name] = "no error"
        except Exception as exc:  # the exception itself: `except ValueError` must catch it
            results[name] = _error(exc)
    # Afterwards the group still works: every rank takes part in a good call.
    width = [V // world + (r < V % world) for r in range(world)]
    start = _offsets(width)[rank]
    s = student[:, start:start + width[rank]].clone().requires_grad_()
    value = npu_loss_ops.generalized_jsd_loss(s, teacher[:, start:start + width[rank]],
                                              vocab_parallel_group=dist.group.WORLD)
    value.backward()
    results["after"] = value.detach()
    return results


# Collectives of torch.distributed the payload test watches; the package must use only the first two.
WATCHED = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
           "broadcast", "reduce", "gather", "scatter", "all_to_all", "all_to_all_single", "send", "recv", "isend",
           "irecv", "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
           "barrier")
PAYLOAD_VOCABS = (32768, 151936)
PAYLOAD_ROWS = 4
PAYLOAD_VARIANTS = ("group-batchmean", "group-none", "group-batchmean-entropy-labels", "dt1-batchmean")


def _sent_bytes(name: str, args: tuple, kwargs: dict) -> int:
    """The bytes one call sends: all_reduce's tensor, all_gather's input (-1 for any other collective)."""
    if name == "all_reduce":
        x = kwargs.get("tensor", args[0] if args else None)
    elif name == "all_gather":
        x = kwargs.get("tensor", args[1] if len(args) > 1 else None)
    else:
        return -1
    return x.numel() * x.element_size()


def _payload(rank: int, world: int, meshes) -> dict:
    """For each variant and V: the collectives (name, bytes) of one call with its backward, on this rank."""
    from torch.distributed.tensor import Shard, distribute_tensor

    results = {}
    for variant in PAYLOAD_VARIANTS:
        for vocab in PAYLOAD_VOCABS:
            g = torch.Generator().manual_seed(vocab)
            student = torch.randn(PAYLOAD_ROWS, vocab, generator=g)
            teacher = torch.randn(PAYLOAD_ROWS, vocab, generator=g)
            labels = torch.tensor([1, -100, 2, 3]) if "labels" in variant else None
            width = vocab // world
            start = rank * width
            if variant.startswith("dt1"):
                s = distribute_tensor(student, meshes["dt1"], [Shard(-1)]).requires_grad_()
                t = distribute_tensor(teacher, meshes["dt1"], [Shard(-1)]).requires_grad_()
                group = None
                weight = None
            else:
                s = student[:, start:start + width].clone().requires_grad_()
                t = teacher[:, start:start + width].clone().requires_grad_()
                group = dist.group.WORLD
                weight = torch.randn(PAYLOAD_ROWS, vocab, generator=g)[:, start:start + width]
            calls: list[tuple[str, int]] = []
            saved = {name: getattr(dist, name) for name in WATCHED if hasattr(dist, name)}

            def watch(name, fn):
                def watched(*args, **kwargs):
                    calls.append((name, _sent_bytes(name, args, kwargs)))
                    return fn(*args, **kwargs)
                return watched

            for name, fn in saved.items():
                setattr(dist, name, watch(name, fn))
            try:
                reduction = "none" if "none" in variant else "batchmean"
                out = npu_loss_ops.generalized_jsd_loss(s, t, labels, reduction=reduction,
                                                        vocab_parallel_group=group,
                                                        return_entropy="entropy" in variant)
                value = out[0] if isinstance(out, tuple) else out
                (value * weight).sum().backward() if reduction == "none" else value.backward()
            finally:
                for name, fn in saved.items():
                    setattr(dist, name, fn)
            assert s.grad is not None and t.grad is not None
            results[(variant, vocab)] = calls
    return results


@contextlib.contextmanager
def _chunk_elements(elements: int):
    """The package's chunk of rows made `elements` elements of the whole vocabulary (0: left as it is), so that
    small tensors take several chunks."""
    if not elements:
        yield
        return
    from npu_loss_ops import _vocab_parallel

    assert isinstance(getattr(_vocab_parallel, "_CHUNK_ELEMENTS", None), int), "the chunk's size has moved"
    saved = _vocab_parallel._CHUNK_ELEMENTS
    _vocab_parallel._CHUNK_ELEMENTS = elements
    try:
        yield
    finally:
        _vocab_parallel._CHUNK_ELEMENTS = saved


def _save(results: dict, result_dir: str, world: int, rank: int) -> None:
    path = os.path.join(result_dir, f"vocab_parallel-{world}-{rank}.pt")
    torch.save(results, path + ".tmp")
    os.replace(path + ".tmp", path)


def _worker(rank: int, world: int, result_dir: str) -> None:
    if "lo" in {name for _, name in socket.if_nameindex()}:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)  # up to 4 processes on 2 cores
    store = f"file://{os.path.join(result_dir, 'store')}"
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    finished = False
    try:
        from torch.distributed.device_mesh import init_device_mesh

        meshes = {"dt1": init_device_mesh("cpu", (world,))}
        if world == 4:
            meshes["dt2"] = init_device_mesh("cpu", (2, 2))
        results: dict[str, object] = {}
        for case in CASES:
            if case.world != world or _zero_width(case):
                continue
            try:
                with _chunk_elements(case.chunk_elements):
                    results[case.id] = (_run_group(case, rank) if case.layout == "group"
                                        else _run_dtensor(case, meshes))
            except Exception as exc:
                results[case.id] = {"error": _error(exc)}
        results["refusals"] = _refusals(world, rank, meshes)
        if world == 2:
            results["payload"] = _payload(rank, world, meshes)
        _save(results, result_dir, world, rank)
        # Last, the slices of width 0 on some rank. A rank whose call raises (before a collective its peers are
        # in) would leave them waiting for the group's timeout: instead each rank exits at its first error,
        # its results saved, which closes its connections, so that its peers' collectives fail at once and
        # they exit in turn (each case's test then sees the errors, or the missing results).
        for case in CASES:
            if case.world != world or not _zero_width(case):
                continue
            try:
                with _chunk_elements(case.chunk_elements):
                    results[case.id] = (_run_group(case, rank) if case.layout == "group"
                                        else _run_dtensor(case, meshes))
            except Exception as exc:
                results[case.id] = {"error": _error(exc)}
                _save(results, result_dir, world, rank)
                os._exit(0)
        _save(results, result_dir, world, rank)
        finished = True
    except BaseException:
        traceback.print_exc()  # leave_gloo exits before the exception would be printed
        raise
    finally:
        leave_gloo(finished)


def _spawn(world: int) -> list[dict]:
    """Each rank's results, rank order."""
    with tempfile.TemporaryDirectory() as result_dir:
        run_ranks(_worker, (world, result_dir), world, TIME_LIMIT, f"the {world} vocabulary-parallel processes")
        return [torch.load(os.path.join(result_dir, f"vocab_parallel-{world}-{rank}.pt"), weights_only=False)
                for rank in range(world)]


@pytest.fixture(scope="module")
def world2():
    return _spawn(2)


@pytest.fixture(scope="module")
def world4():
    return _spawn(4)


# ---- the comparisons --------------------------------------------------------------------------------------------


def _tolerance(dtypes: set[torch.dtype], reference: torch.Tensor) -> tuple[float, float]:
    finite = reference[torch.isfinite(reference)] if reference.numel() else reference
    peak = float(finite.abs().max()) if finite.numel() else 0.0
    if torch.bfloat16 in dtypes:
        return 2e-2, 2e-2 * peak + 1e-6
    if torch.float32 in dtypes:
        return 1e-5, 1e-5 * peak + 1e-7
    return 1e-10, 1e-10 * peak + 1e-14


def _close(got, expected, dtypes: set[torch.dtype], what: str) -> None:
    if expected is None:
        assert got is None, f"{what}: expected None, got {got}"
        return
    assert got is not None, f"{what}: missing"
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype}, expected {expected.dtype}"
    assert got.shape == expected.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    rtol, atol = _tolerance(dtypes, expected)
    torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, equal_nan=True,
                               msg=lambda m: f"{what}: {m}")


def _reference(case: Case) -> dict:
    student, teacher, labels, weight = _inputs(case)
    s = student.clone().requires_grad_()
    t = teacher.clone().requires_grad_(case.teacher_grad)
    value, entropy = _call(case, s, t, labels, weight)
    return {"value": value.detach(), "entropy": None if entropy is None else entropy.detach(),
            "grad_student": s.grad, "grad_teacher": t.grad}


def _assembled(case: Case, per_rank: list[dict], key: str):
    """A 'group' case's whole tensor of `key` from the ranks' slices (the scalars and the entropy: each rank's
    must be the same, rank 0's taken)."""
    parts = [r[key] for r in per_rank]
    if parts[0] is None:
        assert all(p is None for p in parts), f"{key}: None on some ranks only"
        return None
    sliced = key.startswith("grad_") or (key == "value" and parts[0].dim() > 0)
    if not sliced:
        for rank, p in enumerate(parts):
            assert torch.equal(p, parts[0]) or (p.isnan().all() and parts[0].isnan().all()), (
                f"{key}: rank {rank} has {p}, rank 0 {parts[0]}")
        return parts[0]
    for rank, p in enumerate(parts):
        assert p.shape[-1] == case.widths[rank], f"{key}: rank {rank}'s slice is {tuple(p.shape)}"
    return torch.cat(parts, -1)


def _expected_placements(case: Case, ref: dict) -> dict[str, str]:
    """The DTensor results' placements: the scalar Replicate; 'none' the vocabulary sharded as the logits' (the
    tokens too, without labels); the entropy sharded like the tokens; the gradients as their inputs."""
    ndim = len(case.lead) + 1
    inputs = f"(Shard(dim={ndim - 1}),)" if case.layout == "dt1" else f"(Shard(dim=0), Shard(dim={ndim - 1}))"
    if ref["value"].dim() == 0:
        value = "(Replicate(),)" if case.layout == "dt1" else "(Replicate(), Replicate())"
    else:
        last = ref["value"].dim() - 1
        if case.layout == "dt1":
            value = f"(Shard(dim={last}),)"
        else:
            value = f"({'Shard(dim=0)' if case.labels == 'none' else 'Replicate()'}, Shard(dim={last}))"
    expected = {"student": inputs, "grad_student": inputs, "grad_teacher": inputs if case.teacher_grad else None,
                "value": value, "entropy": None}
    if case.entropy:
        expected["entropy"] = "(Replicate(),)" if case.layout == "dt1" else "(Shard(dim=0), Replicate())"
    return expected


def _placements_match(got: dict, expected: dict, case: Case) -> bool:
    if case.layout == "dt2" and case.reduction == "none" and case.labels != "none" and case.num_items is None:
        # 'none' with labels on the token-sharded mesh gathers every row onto every rank (the kept rows differ
        # from rank to rank): its entropy comes back replicated over the token dimension, not sharded like the
        # tokens. Either is the same whole tensor (compared above).
        if got.get("entropy") == "(Replicate(), Replicate())":
            got = {**got, "entropy": expected["entropy"]}
    return got == expected


def _world_results(request, world: int) -> list[dict]:
    return request.getfixturevalue(f"world{world}")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_equals_one_process(case, request):
    every_rank = _world_results(request, case.world)
    per_rank = [r.get(case.id, {"error": "not run: this rank had exited"}) for r in every_rank]
    for rank, got in enumerate(per_rank):
        assert "error" not in got, f"rank {rank}: {got['error']}"
    ref = _reference(case)
    dtypes = set(DTYPES[case.dtype])
    if case.layout == "group":
        got = {key: _assembled(case, per_rank, key) for key in ref}
    else:
        got = {key: per_rank[0][key] for key in ref}
        # Every rank's full tensors agree; a Replicate scalar's local value is the whole call's on every rank.
        for rank, other in enumerate(per_rank[1:], 1):
            for key in ref:
                if got[key] is None:
                    assert other[key] is None, f"{key}: None on rank 0 only"
                else:
                    assert torch.equal(other[key].nan_to_num(), got[key].nan_to_num()), f"{key}: rank {rank}"
        if ref["value"].dim() == 0:
            for rank, other in enumerate(per_rank):
                _close(other["local_value"], ref["value"], dtypes, f"rank {rank}'s local scalar")
        if case.entropy and case.layout == "dt1":
            for rank, other in enumerate(per_rank):
                _close(other["local_entropy"], ref["entropy"], {torch.float32}, f"rank {rank}'s local entropy")
        expected = _expected_placements(case, ref)
        for rank, other in enumerate(per_rank):
            assert _placements_match(other["placements"], expected, case), (
                f"rank {rank}: placements {other['placements']}, expected {expected}")
    assert all(r["value_requires_grad"] for r in per_rank)
    _close(got["value"], ref["value"], dtypes, "value")
    _close(got["entropy"], ref["entropy"], {torch.float32}, "entropy")
    _close(got["grad_student"], ref["grad_student"], dtypes, "grad of student_logits")
    _close(got["grad_teacher"], ref["grad_teacher"], dtypes, "grad of teacher_logits")
    # The comparisons compare something: a gradient of a kept row is not all zeros.
    if case.labels != "all":
        assert ref["grad_student"].abs().max() > 0


def test_the_matrix_covers_each_item_at_each_world_and_layout():
    for world, layout in ((2, "group"), (4, "group"), (2, "dt1"), (4, "dt1"), (4, "dt2")):
        mine = [c for c in CASES if (c.world, c.layout) == (world, layout)]
        assert {c.beta for c in mine} >= {0.0, 0.5, 1.0}
        assert {c.reduction for c in mine} >= {"batchmean", "sum", "mean", "none"}
        assert {c.labels for c in mine} >= {"none", "some", "all"} | ({"tok0"} if layout == "dt2" else set())
        assert {type(_num_items(c)).__name__ for c in mine if c.num_items is not None} >= {"int", "Tensor"}
        assert {c.dtype for c in mine} >= {"f64", "f32", "bf16"}
        assert {c.teacher_grad for c in mine} == {True, False}
        assert any(c.entropy for c in mine) and any(c.transform for c in mine)
    # Widths that differ by more than 1, and 0 on a rank.
    widths = {c.widths for c in CASES if c.layout == "group"}
    assert (5, 32) in widths
    assert {(c.world, c.layout) for c in CASES if _zero_width(c)} == {(2, "group"), (4, "group"), (4, "dt1")}
    assert len({c.id for c in CASES}) == len(CASES)
    # Several chunks of rows, and a real vocabulary, at every world and layout.
    for world, layout in ((2, "group"), (4, "group"), (2, "dt1"), (4, "dt1"), (4, "dt2")):
        mine = [c for c in CASES if (c.world, c.layout) == (world, layout)]
        assert 0 in {c.chunk_elements for c in mine} and 1 in {c.chunk_elements for c in mine}
        assert any(c.chunk_elements > 1 for c in mine)
        assert any(c.vocab == BIG_V for c in mine)


REFUSALS = {
    # name: (worlds, the message's beginning on every rank)
    "teacher-replicate": (WORLDS, "ValueError: generalized_jsd_loss: teacher_logits must be split as student_logits "
                                  "is"),
    "student-replicate": (WORLDS, "ValueError: generalized_jsd_loss: teacher_logits must be split as student_logits "
                                  "is"),
    "group-a-string": (WORLDS, "TypeError: generalized_jsd_loss: vocab_parallel_group must be a torch.distributed "
                               "ProcessGroup"),
    "group-a-list-of-ranks": (WORLDS, "TypeError: generalized_jsd_loss: vocab_parallel_group must be a "
                                      "torch.distributed ProcessGroup"),
    "rows-differ": (WORLDS, "ValueError: generalized_jsd_loss: the ranks of vocab_parallel_group must pass the "
                            "same rows"),
    "kept-differ": (WORLDS, "ValueError: generalized_jsd_loss: the ranks of vocab_parallel_group must pass the "
                            "same rows"),
    "dtensor-with-group": (WORLDS, "ValueError: generalized_jsd_loss: vocab_parallel_group is for plain tensors"),
    "teacher-replicated-tokens-2x2": ((4,), "ValueError: generalized_jsd_loss: teacher_logits must be split as "
                                            "student_logits is"),
    "plain-labels-token-sharded-2x2": ((4,), "ValueError: generalized_jsd_loss: labels must be a DTensor"),
}


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("name", list(REFUSALS))
def test_refused_on_every_rank(name, world, request):
    worlds, message = REFUSALS[name]
    if world not in worlds:
        pytest.skip(f"{name}: a 2x2 mesh needs 4 ranks")
    per_rank = _world_results(request, world)
    for rank, results in enumerate(per_rank):
        assert results["refusals"][name].startswith(message), f"rank {rank}: {results['refusals'][name]}"


@pytest.mark.parametrize("world", WORLDS)
def test_the_group_works_after_the_refusals(world, request):
    """After every refusal each rank still takes part in a good call, which gives one process's value."""
    g = torch.Generator().manual_seed(5)
    student, teacher = torch.randn(6, V, generator=g), torch.randn(6, V, generator=g)
    expected = npu_loss_ops.generalized_jsd_loss(student, teacher)
    for rank, results in enumerate(_world_results(request, world)):
        _close(results["refusals"]["after"], expected, {torch.float32}, f"rank {rank}")


@pytest.mark.parametrize("variant", PAYLOAD_VARIANTS)
def test_payload_depends_on_the_rows_not_the_vocabulary(variant, world2):
    """One call with its backward sends the same bytes at V 32768 and 151936 (all_reduce and all_gather only),
    a small multiple of the rows."""
    for rank, results in enumerate(world2):
        calls = {vocab: results["payload"][(variant, vocab)] for vocab in PAYLOAD_VOCABS}
        for vocab, made in calls.items():
            names = {name for name, _ in made}
            assert names and names <= {"all_reduce", "all_gather"}, f"rank {rank}, V {vocab}: {made}"
            assert "all_reduce" in names
        sent = {vocab: sum(size for _, size in made) for vocab, made in calls.items()}
        assert len(set(sent.values())) == 1, f"rank {rank}: bytes by V {sent}: {calls}"
        total = sent[PAYLOAD_VOCABS[0]]
        assert 0 < total <= 64 * PAYLOAD_ROWS * 8, f"rank {rank}: {total} bytes"
