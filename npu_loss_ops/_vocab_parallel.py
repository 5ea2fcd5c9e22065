"""The distillation family over a vocabulary split across ranks (docs/usage.md, "Distributed distillation").

Each rank of a process group holds a contiguous slice of every row's vocabulary: Megatron-LM's and MindSpeed's
``ColumnParallelLinear`` logits (the ``vocab_parallel_group=`` keyword), or DTensor logits placed ``Shard(-1)``.
A row's log-softmax needs two statistics of the whole row, its max and its sum of exponentials; every term of a
divergence is then local to the slice holding its entry, and the loss is the sum of the ranks' sums. So, per chunk
of rows, only per-row floats cross the group:

  1. the max of each side's transformed, tempered logits (all-reduce MAX, 2 floats per row);
  2. each side's sum of exponentials below that max (all-reduce SUM, 2 floats per row);
  3. where a gradient is made, each side's sum over the row of the loss's derivative w.r.t. its log-probabilities
     (the log-softmax's backward needs it), and the entropy's ``sum(p * z)`` (all-reduce SUM, up to 3 per row);

and once per call the loss's sum (one float) and, on a token-sharded mesh, the count of kept rows. Nothing of
size V ever crosses: the payload of a call depends on the rows alone.

The gradients are made in the forward, chunk by chunk, as the family's kernels make them, when autograd will need
them; the backward of a reduced loss scales them by its grad_output, locally. The backward of ``'none'`` (an
elementwise grad_output) recomputes each chunk's terms from the logits and the saved row statistics, with step 3's
all-reduce: every rank of the group must call it, as every rank calls the forward.

The arithmetic is torch's, in float32 (float64 for float64 logits), one chunk of rows at a time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor

# Rows per chunk of the logits forms: about 2**19 elements of a rank's slice (V / P of them per row). A chunk's
# half-dozen buffers (Workspace) are then near 12 MB, about 2 % of one rank's N x V / P gradient at N 2,048 and
# V 151,936, whatever P (every rank of a group takes the same chunks: the count depends on the global V and P).
_CHUNK_ELEMENTS = 1 << 19


def _dist() -> Any:
    import torch.distributed as dist

    return dist


@dataclass(frozen=True)
class Split:
    """Where the calling rank's slice lies, and who shares its rows."""

    group: Any  # the ranks over which the vocabulary is split, in order of their slices
    rows_group: Any  # the ranks over which the rows are split (a 2-D mesh's token dimension), or None
    vocab: int  # the whole vocabulary
    offset: int  # this rank's first entry
    local: int  # its slice's width


def _refusal(check: Any) -> BaseException | None:
    """What a rank's own checks of its arguments raise (None if nothing): raised after split_of's all-gather has
    told every rank of the group, so that no peer is left waiting in a collective for a rank that stopped."""
    try:
        check()
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        return exc
    return None


def split_of(op: str, group: Any, local: int, rows: int, kept: int, rows_group: Any = None,
             refused: BaseException | None = None) -> Split:
    """The split of `group`, from one all-gather of four integers per rank: its rows, its slice's width, its kept
    rows, which must agree for every rank, and whether its own checks refused its arguments (`refused`, raised here
    on that rank; its peers raise a RuntimeError naming it), all before any chunk is taken."""
    dist = _dist()
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{op}: vocab_parallel_group needs torch.distributed initialized (init_process_group)")
    size = dist.get_world_size(group)
    mine = torch.tensor([rows, local, kept, refused is not None], dtype=torch.int64, device=_collective_device(group))
    every = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(every, mine, group=group)
    table = torch.stack(every).cpu().tolist()
    rank = dist.get_rank(group)
    if refused is not None:
        raise refused
    for i, (_, _, _, stopped) in enumerate(table):
        if stopped:
            raise RuntimeError(f"{op}: rank {i} of the group refused its arguments (its own error says why); every "
                               "rank stops before the first chunk")
    for i, (r, _, k, _) in enumerate(table):
        if r != rows or k != kept:
            raise ValueError(
                f"{op}: the ranks of vocab_parallel_group must pass the same rows (each its slice of the vocabulary): "
                f"rank {rank} has {rows} rows with {kept} kept, rank {i} has {r} with {k} kept")
    widths = [w for _, w, _, _ in table]
    vocab = sum(widths)
    if vocab == 0:
        raise ValueError(f"{op}: the vocabulary split over vocab_parallel_group is empty on every rank")
    return Split(group, rows_group, vocab, sum(widths[:rank]), local)


def _collective_device(group: Any) -> torch.device:
    """Where a collective's tensors must live for `group`'s backend: the host for gloo, the device otherwise."""
    dist = _dist()
    backend = dist.get_backend(group)
    if backend == "gloo":
        return torch.device("cpu")
    if backend == "hccl":
        return torch.device("npu", torch.npu.current_device())  # type: ignore[attr-defined]
    return torch.device("cuda", torch.cuda.current_device())


def _all_reduce(x: Tensor, group: Any, op: str = "sum") -> Tensor:
    """`x` reduced over `group` (a copy on the group's device when `x` lives elsewhere, then back)."""
    dist = _dist()
    device = _collective_device(group)
    y = x if x.device == device else x.to(device)
    dist.all_reduce(y, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=group)
    return y if y.device == x.device else y.to(x.device)


def wide(acc: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype of a call's sums over chunks and of a served teacher's support terms: float64 on the CPU; on an
    accelerator the call's own `acc` (float32 but for float64 inputs), as the package's NPU kernels compute these
    terms (docs/npu_paths.md): float64 there is not every chip's, and costs what float32 does not."""
    return torch.float64 if device.type == "cpu" else acc


def chunk_rows(split: Split) -> int:
    ranks = _dist().get_world_size(split.group)
    return max(1, _CHUNK_ELEMENTS * int(ranks) // max(split.vocab, 1))


@dataclass(frozen=True)
class Transform:
    """One side's logit transform: times `scale`, then softcap * tanh(. / softcap), then / temperature."""

    scale: float
    softcap: float | None
    temperature: float

    def __call__(self, x: Tensor, acc: torch.dtype) -> tuple[Tensor, Tensor | float]:
        """The transformed logits in `acc` and dz/dx (a tensor where the softcap makes it elementwise)."""
        y = x.to(acc) * self.scale
        if self.softcap is None:
            return y / self.temperature, self.scale / self.temperature
        h = torch.tanh(y / self.softcap)
        return h * (self.softcap / self.temperature), (1.0 - h * h) * (self.scale / self.temperature)


def _row_max(z: Tensor) -> Tensor:
    if z.size(-1) == 0:
        return z.new_full(z.shape[:-1], -math.inf)
    return z.amax(-1)


def log_normalizers(zs: list[Tensor], group: Any) -> list[Tensor]:
    """Each (C, V_local) side's log-sum-exp over the whole row: its max (all-reduce MAX), then its sum of
    exponentials below it (all-reduce SUM), 2 floats per row and side."""
    peak = _all_reduce(torch.stack([_row_max(z) for z in zs]), group, "max")
    # A row whose every logit is -inf has peak -inf: shift by 0 instead, giving log(0) = -inf, as log_softmax does.
    shift = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
    sums = _all_reduce(torch.stack([(z - shift[i, :, None]).exp().sum(-1) for i, z in enumerate(zs)]), group)
    return [shift[i] + sums[i].log() for i in range(len(zs))]


def jsd_terms(s: Tensor, t: Tensor, beta: float, need: bool) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The generalized JSD's elementwise values of log-probabilities s (student) and t (teacher), TRL's formulas,
    and with `need` their derivatives w.r.t. s and t (the mixture's log-mixture m drops out of both)."""
    if beta == 0.0:
        q = t.exp()
        value = q * (t - s)
        return value, (-q if need else None), (value + q if need else None)
    if beta == 1.0:
        p = s.exp()
        value = p * (s - t)
        return value, (value + p if need else None), (-p if need else None)
    # m = log((1 - beta) p + beta q) through the softplus of d = s - t + log(1 - beta) - log(beta), never formed
    # (exact where p and q underflow; no logaddexp, which Ascend 310B's CANN lacks): the composite's formulas.
    d = s - t + (math.log1p(-beta) - math.log(beta))
    soft = torch.log1p(torch.exp(-d.abs())) + d.clamp(min=0)  # softplus(d)
    ds = (1.0 - beta) * s.exp() * (d - soft - math.log1p(-beta))  # s - m = d - softplus(d) - log(1 - beta)
    dt = beta * t.exp() * (-soft - math.log(beta))  # t - m = -softplus(d) - log(beta)
    return ds + dt, (ds if need else None), (dt if need else None)


@dataclass(frozen=True)
class JsdCall:
    """One generalized JSD call on a split: its scalars, and which gradients autograd will need."""

    split: Split
    beta: float
    student: Transform
    teacher: Transform
    keep: Tensor | None  # (R,) bool of the rows kept, or None (every row)
    none: bool  # reduction 'none': the elementwise values of the kept rows
    entropy: bool


def _chunks(keep: Tensor | None, rows: int, step: int) -> Any:
    """The chunks of rows, `step` kept rows each (the last fewer): slices without labels, else index tensors of the
    kept rows. Every chunk but the last has the same shape, so that the C library's allocator reuses each chunk's
    temporaries for the next (chunks of varying sizes let the heap grow over a call, 60 MB at N 2,048)."""
    if keep is None:
        for start in range(0, rows, step):
            yield slice(start, min(rows, start + step))
        return
    kept = keep.nonzero().squeeze(-1)
    for start in range(0, kept.numel(), step):
        yield kept[start:start + step]


def _take(x: Tensor, rows: Any) -> Tensor:
    return x[rows] if isinstance(rows, slice) else x.index_select(0, rows)


def _put(out: Tensor, rows: Any, values: Tensor) -> None:
    if isinstance(rows, slice):
        out[rows] = values
    else:
        out.index_put_((rows,), values.to(out.dtype))  # as the composite path: index_copy_ fails on the emulated 950


class Workspace:
    """A call's chunk buffers, (C, V_local) each in the dtype the call computes in, made once per call and used in
    place by every chunk: the C library's allocator then sees no chunk-sized allocation after the first chunk
    (temporaries made and freed per chunk let its heap keep 60 MB more than they use, at N 2,048)."""

    def __init__(self, rows: int, width: int, dtype: torch.dtype, device: torch.device) -> None:
        self.shape = (rows, width)
        self.dtype = dtype
        self.device = device
        self.buffers: dict[str, Tensor] = {}

    def __call__(self, name: str, n: int) -> Tensor:
        buffer = self.buffers.get(name)
        if buffer is None:
            buffer = self.buffers[name] = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        return buffer[:n]


def transform_into(side: Transform, x: Tensor, out: Tensor, slope: Tensor | None) -> Tensor | float:
    """`out` := the transformed, tempered `x`; returns dz/dx: a number, or (with a softcap) `slope` filled (None
    where no gradient is wanted)."""
    if out.data_ptr() != x.data_ptr() or out.dtype != x.dtype:
        out.copy_(x)
    if side.scale != 1.0:
        out.mul_(side.scale)
    if side.softcap is None:
        if side.temperature != 1.0:
            out.div_(side.temperature)
        return side.scale / side.temperature
    out.div_(side.softcap).tanh_()
    if slope is not None:
        torch.mul(out, out, out=slope).neg_().add_(1.0).mul_(side.scale / side.temperature)
    out.mul_(side.softcap / side.temperature)
    return slope if slope is not None else 0.0


def normalizers_into(zs: list[Tensor], group: Any, scratch: Tensor) -> list[Tensor]:
    """log_normalizers with `scratch` (the chunk's shape) for the exponentials."""
    peak = _all_reduce(torch.stack([_row_max(z) for z in zs]), group, "max")
    shift = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
    sums = []
    for i, z in enumerate(zs):
        torch.sub(z, shift[i, :, None], out=scratch).exp_()
        sums.append(scratch.sum(-1))
    total = _all_reduce(torch.stack(sums), group)
    return [shift[i] + total[i].log() for i in range(len(zs))]


def jsd_chunk_terms(beta: float, a: Tensor, b: Tensor, lse_s: Tensor, lse_t: Tensor, work: list[Tensor],
                    entropy: bool, values: Tensor | None) -> tuple[Tensor, Tensor, Tensor, list[Tensor]]:
    """One chunk's generalized JSD in place: `a`, `b` (the transformed logits) become s, t; returns the chunk's sum,
    the buffers holding dL/ds and dL/dt, and the row sums the group adds (those two, then the entropy's sum(p z)).
    `work`: three buffers of the chunk's shape; `values`: 'none''s rows, written."""
    c, d, e = work
    a.sub_(lse_s[:, None])
    b.sub_(lse_t[:, None])
    sums = []
    entropy_sum = None
    if entropy:  # sum(p z) = sum(p s) + lse * sum(p) over the slice
        torch.exp(a, out=e)
        mass = e.sum(-1)
        entropy_sum = e.mul_(a).sum(-1) + lse_s * mass
    if beta == 0.0:  # q (t - s); dL/ds = -q, dL/dt = q (t - s) + q
        torch.exp(b, out=c)
        torch.sub(b, a, out=d).mul_(c)
        total = d.sum()
        if values is not None:
            values.copy_(d)
        a_s, a_t = c.neg_(), d.sub_(c)
    elif beta == 1.0:  # p (s - t); dL/ds = p (s - t) + p, dL/dt = -p
        torch.exp(a, out=c)
        torch.sub(a, b, out=d).mul_(c)
        total = d.sum()
        if values is not None:
            values.copy_(d)
        a_t, a_s = c.neg_(), d.sub_(c)
    else:  # dL/ds = (1 - beta) p (s - m), dL/dt = beta q (t - m), m as in jsd_terms (softplus, no logaddexp)
        log_1mb, log_b = math.log1p(-beta), math.log(beta)
        torch.sub(a, b, out=c).add_(log_1mb - log_b)  # d
        torch.clamp(c, min=0, out=e)
        torch.abs(c, out=d).neg_().exp_().log1p_().add_(e)  # softplus(d)
        c.sub_(d).sub_(log_1mb).mul_(torch.exp(a, out=e).mul_(1.0 - beta))  # (1 - beta) p (s - m)
        d.neg_().sub_(log_b).mul_(torch.exp(b, out=e).mul_(beta))  # beta q (t - m)
        a_s, a_t = c, d
        total = a_s.sum() + a_t.sum()
        if values is not None:
            torch.add(a_s, a_t, out=values) if values.dtype == a_s.dtype else values.copy_(a_s + a_t)
    sums += [a_s.sum(-1), a_t.sum(-1)]
    if entropy_sum is not None:
        sums.append(entropy_sum)
    return total, a_s, a_t, sums


def log_softmax_backward_into(grad: Tensor, logp: Tensor, row_sum: Tensor, slope: Tensor | float,
                              scratch: Tensor) -> Tensor:
    """`grad` := (grad - exp(logp) * row_sum) * slope in place: the log-softmax's backward, then the transform's."""
    grad.sub_(torch.exp(logp, out=scratch).mul_(row_sum[:, None]))
    if isinstance(slope, Tensor):
        grad.mul_(slope)
    elif slope != 1.0:
        grad.mul_(slope)
    return grad


def jsd_forward(call: JsdCall, xs: Tensor, xt: Tensor, grads: tuple[bool, bool]
                ) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None, Tensor]:
    """The loss over (R, V_local) logits: the global sum (0-dim), or 'none''s (kept, V_local) values; the gradients
    of the sum w.r.t. each side where `grads` asks (R, V_local, the rows dropped 0); the entropy per row (R,) when
    asked; and each kept row's two log-normalizers (kept, 2), which 'none''s backward reads."""
    acc = torch.float64 if torch.float64 in (xs.dtype, xt.dtype) else torch.float32
    result = torch.promote_types(xs.dtype, xt.dtype)
    rows, width = xs.shape
    kept = rows if call.keep is None else int(call.keep.sum())
    step = min(chunk_rows(call.split), max(kept, 1))
    work = Workspace(step, width, acc, xs.device)
    total = torch.zeros((), dtype=acc, device=xs.device)
    values = xs.new_empty((kept, width), dtype=result) if call.none else None
    gs = torch.zeros_like(xs) if grads[0] else None
    gt = torch.zeros_like(xt) if grads[1] else None
    entropy = torch.zeros(rows, dtype=torch.float32, device=xs.device) if call.entropy else None
    stats = xs.new_empty((kept, 2), dtype=acc)
    done = 0
    for chunk in _chunks(call.keep, rows, step):
        x_s, x_t = _take(xs, chunk), _take(xt, chunk)
        n = x_s.size(0)
        a, b = work("s", n), work("t", n)
        slope_s = transform_into(call.student, x_s, a, work("slope_s", n) if grads[0] else None)
        slope_t = transform_into(call.teacher, x_t, b, work("slope_t", n) if grads[1] else None)
        scratch = [work("c", n), work("d", n), work("e", n)]
        lse_s, lse_t = normalizers_into([a, b], call.split.group, scratch[0])
        stats[done:done + n, 0] = lse_s
        stats[done:done + n, 1] = lse_t
        part, a_s, a_t, sums = jsd_chunk_terms(call.beta, a, b, lse_s, lse_t, scratch, call.entropy,
                                               None if values is None else values[done:done + n])
        total += part
        done += n
        if not (grads[0] or grads[1] or call.entropy):
            continue
        row_s, row_t, *rest = _all_reduce(torch.stack(sums), call.split.group).unbind(0)
        if grads[0]:
            _put(gs, chunk, log_softmax_backward_into(a_s, a, row_s, slope_s, scratch[2]))  # type: ignore[arg-type]
        if grads[1]:
            _put(gt, chunk, log_softmax_backward_into(a_t, b, row_t, slope_t, scratch[2]))  # type: ignore[arg-type]
        if entropy is not None:
            _put(entropy, chunk, (lse_s - rest[0]).float())
    if values is None:
        total = _all_reduce(total, call.split.group)
        if call.split.rows_group is not None:
            total = _all_reduce(total, call.split.rows_group)
        return total.to(result), gs, gt, entropy, stats
    return values, gs, gt, entropy, stats


def jsd_backward_none(call: JsdCall, xs: Tensor, xt: Tensor, stats: Tensor, grad: Tensor,
                      grads: tuple[bool, bool]) -> tuple[Tensor | None, Tensor | None]:
    """'none''s vector-Jacobian product: each kept row's terms again from the logits and its saved normalizers,
    weighted by `grad` (kept, V_local), with one all-reduce of the weighted derivatives' row sums per chunk."""
    acc = stats.dtype
    rows = xs.size(0)
    step = chunk_rows(call.split)
    gs = torch.zeros_like(xs) if grads[0] else None
    gt = torch.zeros_like(xt) if grads[1] else None
    done = 0
    for chunk in _chunks(call.keep, rows, step):
        zs, dzs = call.student(_take(xs, chunk), acc)
        zt, dzt = call.teacher(_take(xt, chunk), acc)
        n = zs.size(0)
        s = zs - stats[done:done + n, 0:1]
        t = zt - stats[done:done + n, 1:2]
        g = grad[done:done + n].to(acc)
        done += n
        _, d_s, d_t = jsd_terms(s, t, call.beta, True)
        a = [g * cast(Tensor, d) for d, wanted in zip((d_s, d_t), grads) if wanted]
        reduced = list(_all_reduce(torch.stack([x.sum(-1) for x in a]), call.split.group).unbind(0))
        if grads[0]:
            _put(gs, chunk, (a.pop(0) - s.exp() * reduced.pop(0)[:, None]) * dzs)  # type: ignore[arg-type]
        if grads[1]:
            _put(gt, chunk, (a.pop(0) - t.exp() * reduced.pop(0)[:, None]) * dzt)  # type: ignore[arg-type]
    return gs, gt


def _graded(*tensors: Tensor | None) -> tuple[Tensor | None, ...]:
    """The tensors as a Function takes them: detached where autograd is off (under no_grad a Function still sees
    its inputs' requires_grad, and would make the gradients, their memory and their collectives, for nothing)."""
    if torch.is_grad_enabled():
        return tensors
    return tuple(None if t is None else t.detach() for t in tensors)


def scaled_in_place(ctx: Any, name: str, grad: Tensor) -> list[Tensor | None]:
    """The gradients a forward made (kept on `ctx` under `name`), scaled by the backward's grad_output in place and
    handed over, so that no second copy of them exists: a second backward of the same call is a RuntimeError."""
    made = getattr(ctx, name)
    if made is None:
        raise RuntimeError("a loss on a vocabulary split makes its gradients in the forward and hands them to its "
                           "first backward: a second backward of the same call is not supported")
    setattr(ctx, name, None)
    return [None if g is None else g.mul_(grad.to(g.dtype)) for g in made]


class _Jsd(torch.autograd.Function):
    """The generalized JSD on a split, over (R, V_local) logits: the global sum, or 'none''s values."""

    @staticmethod
    def forward(ctx: Any, xs: Tensor, xt: Tensor, call: JsdCall) -> tuple[Tensor, Tensor]:
        grads = (ctx.needs_input_grad[0], ctx.needs_input_grad[1])  # False under no_grad (_graded)
        # The reduced loss's gradients are made here; 'none''s in the backward, which knows its grad_output.
        made = (False, False) if call.none else grads
        value, gs, gt, entropy, stats = jsd_forward(call, xs.detach(), xt.detach(), made)
        ctx.call = call
        ctx.grads = grads
        if call.none:
            ctx.save_for_backward(xs, xt, stats)
        else:
            ctx.grads_made = [gs, gt]
        ctx.mark_non_differentiable(entropy if entropy is not None else stats)
        return value, (entropy if entropy is not None else stats)

    @staticmethod
    def backward(ctx: Any, grad: Tensor,
                 _unused: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        call: JsdCall = ctx.call
        if call.none:
            xs, xt, stats = ctx.saved_tensors
            gs, gt = jsd_backward_none(call, xs, xt, stats, grad, ctx.grads)
            return gs, gt, None
        gs, gt = scaled_in_place(ctx, "grads_made", grad)
        return gs, gt, None


def generalized_jsd(student: Tensor, teacher: Tensor, labels: Tensor | None, split: Split, *, beta: float,
                    temperature: float, reduction: str, ignore_index: int, student_logit_scale: float,
                    teacher_logit_scale: float, student_softcap: float | None, teacher_softcap: float | None,
                    return_entropy: bool) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The op on one rank's (..., V_local) slices: the sum over the whole split (0-dim, every rank the same) or
    'none''s local (kept, V_local) values (the logits' shape without labels); the entropy per row (the leading
    shape) when asked; the count of kept rows over the split (None without labels)."""
    lead = student.shape[:-1]
    xs = student.reshape(math.prod(lead), student.size(-1))
    xt = teacher.reshape(math.prod(lead), teacher.size(-1))
    keep = None if labels is None else (labels.reshape(-1) != ignore_index)
    call = JsdCall(split, beta, Transform(student_logit_scale, student_softcap, temperature),
                   Transform(teacher_logit_scale, teacher_softcap, temperature), keep, reduction == "none",
                   return_entropy)
    value, extra = _Jsd.apply(*_graded(xs, xt), call)  # type: ignore[no-untyped-call]
    entropy = extra.view(lead) if return_entropy else None
    if reduction == "none" and labels is None:
        value = value.view(student.shape)
    count = None
    if keep is not None:
        count = keep.sum()
        if split.rows_group is not None:
            count = _all_reduce(count, split.rows_group)
    return value, entropy, count


# ---- the entry points: a ProcessGroup (Megatron's slices) or DTensor logits placed Shard(-1) ----------------------


def check_group(op: str, group: Any) -> None:
    dist = _dist()
    if not dist.is_available() or not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"{op}: vocab_parallel_group must be a torch.distributed ProcessGroup or None, got "
                        f"{type(group).__name__}")


def vocab_mesh_dim(tensor: Any) -> int | None:
    """The mesh dimension over which a DTensor's last (vocabulary) dimension is sharded, or None."""
    for i, placement in enumerate(tensor.placements):
        if placement.is_shard() and placement.dim % tensor.dim() == tensor.dim() - 1:
            return i
    return None


@dataclass(frozen=True)
class _Layout:
    """A DTensor call's mesh: the vocabulary's mesh dimension, the token one (or None), their groups, and the
    global shape of the student's logits."""

    mesh: Any
    vocab_dim: int
    token: tuple[int, int] | None  # (mesh dimension, tensor dimension) of a token split
    shape: tuple[int, ...]


def _layout(op: str, student: Any, teacher: Any, names: tuple[str, str]) -> _Layout:
    from torch.distributed.tensor import DTensor

    if not isinstance(student, DTensor) or not isinstance(teacher, DTensor):
        raise ValueError(f"{op}: {names[0]} and {names[1]} must both be DTensors when one is split over the "
                         "vocabulary")
    if teacher.device_mesh != student.device_mesh or tuple(teacher.placements) != tuple(student.placements):
        raise ValueError(f"{op}: {names[1]} must be split as {names[0]} is, on the same mesh: got "
                         f"{tuple(teacher.placements)} against {tuple(student.placements)}")
    vocab = vocab_mesh_dim(student)
    assert vocab is not None
    token = None
    placements: Any = student.placements
    for i, placement in enumerate(placements):
        if i == vocab or placement.is_replicate():
            continue
        if not placement.is_shard():
            raise ValueError(f"{op}: {names[0]} placed {placement} on mesh dimension {i}; with the vocabulary split "
                             "only Replicate or one Shard of a token dimension is taken")
        if token is not None:
            raise ValueError(f"{op}: {names[0]} shards tokens over two mesh dimensions; shard one token dimension "
                             "alongside the vocabulary")
        token = (i, placement.dim % student.dim())
    return _Layout(student.device_mesh, vocab, token, tuple(student.shape))


def _local_rows(op: str, name: str, tensor: Any, layout: _Layout) -> Any:
    """The calling rank's rows of a tensor of the logits' leading shape (labels, a served teacher's (..., K)): a
    DTensor redistributed to the logits' token placement (replicated over the vocabulary), differentiably, or a
    plain tensor of the whole leading shape where the tokens are not split."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    if tensor is None:
        return None
    if isinstance(tensor, DTensor):
        want: list[Any] = [Replicate()] * layout.mesh.ndim
        if layout.token is not None:
            want[layout.token[0]] = Shard(layout.token[1])
        return tensor.redistribute(layout.mesh, want).to_local()
    if layout.token is not None:
        raise ValueError(f"{op}: {name} must be a DTensor sharded as the logits' tokens are when the logits are "
                         "split over tokens and the vocabulary")
    return tensor


def _dtensor_result(value: Tensor, layout: _Layout, placements: list[Any], shape: tuple[int, ...]) -> Any:
    from torch.distributed.tensor import DTensor

    stride = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
    return DTensor.from_local(value, layout.mesh, placements, run_check=False, shape=torch.Size(shape), stride=stride)


def generalized_jsd_loss(student: Any, teacher: Any, labels: Any, *, group: Any, beta: float, temperature: float,
                         reduction: str, num_items_in_batch: Any, ignore_index: int, student_logit_scale: float,
                         teacher_logit_scale: float, student_softcap: float | None, teacher_softcap: float | None,
                         return_entropy: bool) -> Any:
    """functional.generalized_jsd_loss on a split: `group` given (plain tensors, each rank its slice), or DTensor
    logits whose placements shard the vocabulary (group None)."""
    op = "generalized_jsd_loss"
    how = "sum" if num_items_in_batch is not None else reduction
    layout = None
    if group is None:
        from torch.distributed.tensor import Replicate, Shard

        layout = _layout(op, student, teacher, ("student_logits", "teacher_logits"))
        gather_tokens = how == "none" and labels is not None and layout.token is not None
        if gather_tokens:  # 'none''s kept rows differ from rank to rank: every rank takes every row
            want = list(student.placements)
            want[layout.token[0]] = Replicate()  # type: ignore[index]
            student, teacher = student.redistribute(layout.mesh, want), teacher.redistribute(layout.mesh, want)
            layout = _Layout(layout.mesh, layout.vocab_dim, None, layout.shape)
        labels = _local_rows(op, "labels", labels, layout)
        group = layout.mesh.get_group(layout.vocab_dim)
        rows_group = None if layout.token is None else layout.mesh.get_group(layout.token[0])
        shape = layout.shape
        student, teacher = student.to_local(), teacher.to_local()
    else:
        rows_group = None
        shape = tuple(student.shape[:-1]) + (-1,)
    def check() -> None:
        if student.shape != teacher.shape:
            raise RuntimeError(f"{op}: student_logits and teacher_logits must have the same shape on each rank, got "
                               f"{tuple(student.shape)} and {tuple(teacher.shape)}")
        if labels is not None and tuple(labels.shape) != tuple(student.shape[:-1]):
            raise RuntimeError(f"{op}: labels must have the logits' leading shape {tuple(student.shape[:-1])}, got "
                               f"{tuple(labels.shape)}")

    refused = _refusal(check)
    rows = math.prod(student.shape[:-1])
    kept = rows if labels is None else int((labels != ignore_index).sum())
    split = split_of(op, group, student.size(-1), rows, kept, rows_group, refused)
    if layout is None:
        shape = shape[:-1] + (split.vocab,)
    value, entropy, count = generalized_jsd(
        student, teacher, labels, split, beta=beta, temperature=temperature, reduction=how,
        ignore_index=ignore_index, student_logit_scale=student_logit_scale, teacher_logit_scale=teacher_logit_scale,
        student_softcap=student_softcap, teacher_softcap=teacher_softcap, return_entropy=return_entropy)
    value = _divided(value, how, num_items_in_batch, count, shape, split.vocab)
    if layout is not None:
        from torch.distributed.tensor import Replicate, Shard

        replicated: list[Any] = [Replicate()] * layout.mesh.ndim
        if how == "none":
            placements: list[Any] = list(replicated)
            placements[layout.vocab_dim] = Shard(value.dim() - 1)
            if layout.token is not None:
                placements[layout.token[0]] = Shard(layout.token[1])
            full = layout.shape if labels is None else (value.size(0), split.vocab)
            value = _dtensor_result(value, layout, placements, full)
        else:
            value = _dtensor_result(value, layout, replicated, ())
        if entropy is not None:
            placements = list(replicated)
            if layout.token is not None:
                placements[layout.token[0]] = Shard(layout.token[1])
            entropy = _dtensor_result(entropy, layout, placements, layout.shape[:-1])
    return value if entropy is None else (value, entropy)


def _divided(total: Tensor, how: str, num_items_in_batch: Any, count: Tensor | None, shape: tuple[int, ...],
             vocab: int) -> Tensor:
    """The family's reductions of the split's sum (functional._reduced's, with the whole shape's counts)."""
    if num_items_in_batch is not None:
        if isinstance(num_items_in_batch, Tensor):
            num_items_in_batch = num_items_in_batch.to(total.device)
        return cast(Tensor, total / num_items_in_batch)
    if how in ("sum", "none"):
        return total
    if how == "batchmean":
        if count is None:
            return total / max(shape[0] if shape else 1, 1)
        return total / count.clamp(min=1)
    if count is None:
        return total / (math.prod(shape[:-1]) * vocab)
    entries = count * vocab
    return torch.where(entries > 0, total / entries.clamp(min=1), torch.full_like(total, float("nan")))


# ---- a served teacher's sparse support (sparse_jsd_loss) -----------------------------------------------------------
#
# The teacher's ids are global; each rank reads the student's logits at the ids in its slice and 0 elsewhere, and
# one all-reduce SUM of those (C, K) floats gives every rank the whole support's log-probabilities. The support's
# terms are then the same on every rank, and so is the derivative of the loss w.r.t. each of them (G): the
# log-softmax's backward, -p * sum(G) everywhere plus G at the ids, is local without another collective. The
# backward recomputes the chunk's exponentials from the logits and the saved normalizers.


def support_terms(s: Tensor, t: Tensor, mask: Tensor, beta: float, add_tail: bool, tiny: float) -> Tensor:
    """TRL 1.16's served-teacher divergence per entry from the support's log-probabilities s, t (n, K), masked
    entries excluded (tests/reference.py's sparse_jsd_reference, the same formulas): (n, K + 1) with the tail.
    The mixture is clamped at `tiny`, the smallest normal of the dtype the call computes in, as the kernels do."""
    neg_inf = torch.full((), -math.inf, dtype=s.dtype, device=s.device)
    s = torch.where(mask, s, neg_inf)
    t = torch.where(mask, t, neg_inf)
    if add_tail:
        def with_tail(x: Tensor) -> Tensor:
            log_sum = torch.logsumexp(x, dim=-1, keepdim=True).clamp(max=-1e-7)
            return torch.cat([x, torch.log(-torch.expm1(log_sum))], dim=-1)

        s, t = with_tail(s), with_tail(t)
        mask = torch.cat([mask, torch.ones_like(mask[..., :1])], dim=-1)
    else:
        s = s - torch.logsumexp(s, dim=-1, keepdim=True)
        t = t - torch.logsumexp(t, dim=-1, keepdim=True)
    zero = torch.zeros((), dtype=s.dtype, device=s.device)
    s0, t0 = torch.where(mask, s, zero), torch.where(mask, t, zero)
    p, q = torch.where(mask, s.exp(), zero), torch.where(mask, t.exp(), zero)
    if beta == 0.0:
        return nan_to_zero(q * (t0 - s0))
    if beta == 1.0:
        return nan_to_zero(p * (s0 - t0))
    m = torch.where(mask, torch.log(((1 - beta) * p + beta * q).clamp_min(tiny)), zero)
    return beta * nan_to_zero(q * (t0 - m)) + (1 - beta) * nan_to_zero(p * (s0 - m))


def nan_to_zero(x: Tensor) -> Tensor:
    """torch.nan_to_num(x, nan=0.0), its infinities clamped to the dtype's largest value, and its gradient passed
    only where x is finite, as nan_to_num's, built from where and clamp: torch_npu runs nan_to_num through an aclop
    kernel where these are aclnn calls (the composite's nan_to_zero, csrc/composite/sparse_jsd.cpp)."""
    largest = torch.finfo(x.dtype).max
    return torch.where(x != x, torch.zeros((), dtype=x.dtype, device=x.device), x).clamp(-largest, largest)


def _rows_of(rel: Tensor) -> Tensor:
    return torch.arange(rel.size(0), device=rel.device)[:, None].expand_as(rel)


def take_at(dense: Tensor, rel: Tensor) -> Tensor:
    """dense[i, rel[i, j]]: advanced indexing (aclnnIndex on the NPU; ops-nn's aclnnGather document lists no Ascend
    950, docs/npu_paths.md)."""
    return dense[_rows_of(rel), rel]


def add_at(dense: Tensor, rel: Tensor, values: Tensor) -> None:
    """dense[i, rel[i, j]] += values[i, j], in place: index_put_ with accumulation (aclnnIndexPutImpl on the NPU,
    where torch_npu runs scatter_add_ through an aclop kernel; the composite's choice too)."""
    dense.index_put_((_rows_of(rel), rel), values, accumulate=True)


def check_support_ids(op: str, ids: Tensor, mask: Tensor, vocab: int, keep: Tensor | None) -> None:
    """The family's checks of a support's ids on the kept rows, against the whole vocabulary: an IndexError for an
    id outside [0, V) where the mask is true, a ValueError for an id twice in a row (naming the row and entries)."""
    on = mask if keep is None else mask & keep[:, None]
    bad = on & ((ids < 0) | (ids >= vocab))
    if bool(bad.any()):
        row, entry = (int(i) for i in bad.nonzero()[0])
        raise IndexError(f"{op}: teacher_token_ids[{row}, {entry}] = {int(ids[row, entry])} is outside the "
                         f"vocabulary [0, {vocab})")
    k = ids.size(-1)
    if k < 2:
        return
    # Entries off the mask take distinct negative stand-ins, so that only true repeats sort next to each other.
    stand_in = -1 - torch.arange(k, device=ids.device).expand_as(ids)
    ordered, where = torch.where(on, ids.long(), stand_in).sort(-1)
    repeat = ordered[:, 1:] == ordered[:, :-1]
    if bool(repeat.any()):
        row, j = (int(i) for i in repeat.nonzero()[0])
        first, second = sorted((int(where[row, j]), int(where[row, j + 1])))
        raise ValueError(f"{op}: teacher_token_ids[{row}] has the id {int(ordered[row, j])} at entries {first} and "
                         f"{second}; mask the repeats with support_mask")


@dataclass(frozen=True)
class SparseCall:
    split: Split
    student: Transform
    beta: float
    add_tail: bool
    keep: Tensor | None
    none: bool


def _support_chunk(call: SparseCall, ids: Tensor, mask: Tensor, chunk: Any) -> tuple[Tensor, Tensor, Tensor]:
    """A chunk's ids relative to this rank's slice (clamped into it), which of them it holds, and the mask."""
    rel = _take(ids, chunk).long() - call.split.offset
    on = _take(mask, chunk)
    inside = on & (rel >= 0) & (rel < call.split.local)
    return rel.clamp(0, max(call.split.local - 1, 0)), inside, on


def sparse_forward(call: SparseCall, x: Tensor, logprobs: Tensor, ids: Tensor, mask: Tensor
                   ) -> tuple[Tensor, Tensor, Tensor]:
    """The loss over (R, V_local) logits and the (R, K) support: the global sum (0-dim) or 'none''s (kept, K(+1))
    values; each kept row's support log-probabilities (kept, K) and normalizer (kept,), which the backward reads."""
    acc = torch.float64 if torch.float64 in (x.dtype, logprobs.dtype) else torch.float32
    result = torch.promote_types(x.dtype, logprobs.dtype)
    rows, k = ids.shape
    kept = rows if call.keep is None else int(call.keep.sum())
    step = chunk_rows(call.split)
    total = torch.zeros((), dtype=acc, device=x.device)
    values = x.new_empty((kept, k + call.add_tail), dtype=result) if call.none else None
    support = x.new_empty((kept, k), dtype=acc)
    lse_all = x.new_empty((kept,), dtype=acc)
    in_terms = wide(acc, x.device)
    done = 0
    for chunk in _chunks(call.keep, rows, step):
        z, _ = call.student(_take(x, chunk), acc)
        (lse,) = log_normalizers([z], call.split.group)
        rel, inside, on = _support_chunk(call, ids, mask, chunk)
        at = take_at(z, rel) if z.size(1) else torch.zeros(rel.shape, dtype=acc, device=x.device)
        s = _all_reduce(torch.where(inside, at, torch.zeros((), dtype=acc, device=x.device)), call.split.group)
        s = s - lse[:, None]
        n = s.size(0)
        support[done:done + n] = s
        lse_all[done:done + n] = lse
        value = support_terms(s.to(in_terms), _take(logprobs, chunk).to(in_terms), on, call.beta, call.add_tail,
                              torch.finfo(acc).tiny)
        if values is not None:
            values[done:done + n] = value.to(result)
        else:
            total += value.sum()
        done += n
    if values is not None:
        return values, support, lse_all
    # Every rank of the group holds the whole support's terms: the sum crosses only a token split.
    if call.split.rows_group is not None:
        total = _all_reduce(total, call.split.rows_group)
    return total.to(result), support, lse_all


def sparse_backward(call: SparseCall, x: Tensor, logprobs: Tensor, ids: Tensor, mask: Tensor, support: Tensor,
                    lse_all: Tensor, grad: Tensor, grads: tuple[bool, bool]) -> tuple[Tensor | None, Tensor | None]:
    """The gradients w.r.t. the rank's logits slice and the teacher's log-probabilities: the support's G by
    autograd on (n, K), then the log-softmax's backward on the slice, with no collective."""
    acc = support.dtype
    in_terms = wide(acc, x.device)
    rows = ids.size(0)
    step = chunk_rows(call.split)
    gx = torch.zeros_like(x) if grads[0] else None
    gl = torch.zeros_like(logprobs) if grads[1] else None
    done = 0
    for chunk in _chunks(call.keep, rows, step):
        rel, inside, on = _support_chunk(call, ids, mask, chunk)
        n = rel.size(0)
        s = support[done:done + n].detach().to(in_terms).requires_grad_()
        t = _take(logprobs, chunk).detach().to(in_terms).requires_grad_()
        w = (grad[done:done + n] if call.none else grad).to(in_terms)
        lse = lse_all[done:done + n]
        done += n
        with torch.enable_grad():
            terms = support_terms(s, t, on, call.beta, call.add_tail, torch.finfo(acc).tiny)
            g_s, g_t = torch.autograd.grad((terms * w).sum(), (s, t))
        g_s = g_s.to(acc)
        if gl is not None:
            _put(gl, chunk, g_t)
        if gx is not None:
            z, dz = call.student(_take(x, chunk), acc)
            dense = (z - lse[:, None]).exp() * -g_s.sum(-1, keepdim=True)
            if dense.size(1):
                add_at(dense, rel, torch.where(inside, g_s, torch.zeros((), dtype=acc, device=x.device)))
            _put(gx, chunk, dense * dz)
    return gx, gl


class _SparseJsd(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, logprobs: Tensor, ids: Tensor, mask: Tensor,
                call: SparseCall) -> Tensor:
        value, support, lse = sparse_forward(call, x.detach(), logprobs.detach(), ids, mask)
        ctx.call = call
        ctx.save_for_backward(x, logprobs, ids, mask, support, lse)
        return value

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, logprobs, ids, mask, support, lse = ctx.saved_tensors
        gx, gl = sparse_backward(ctx.call, x, logprobs, ids, mask, support, lse, grad,
                                 (ctx.needs_input_grad[0], ctx.needs_input_grad[1]))
        return gx, gl, None, None, None


def sparse_jsd_loss(student: Any, teacher_logprobs: Any, teacher_token_ids: Any, labels: Any, *, group: Any,
                    support_mask: Any, beta: float, temperature: float, add_tail: bool, reduction: str,
                    num_items_in_batch: Any, ignore_index: int, student_logit_scale: float,
                    student_softcap: float | None) -> Any:
    """functional.sparse_jsd_loss on a split: each rank its slice of the student's logits, the served teacher's
    (..., K) whole (its ids global)."""
    op = "sparse_jsd_loss"
    how = "sum" if num_items_in_batch is not None else reduction
    layout = None
    if group is None:
        from torch.distributed.tensor import DTensor

        if not isinstance(student, DTensor):
            raise ValueError(f"{op}: student_logits must be the DTensor split over the vocabulary")
        layout = _layout(op, student, student, ("student_logits", "student_logits"))
        if how == "none" and labels is not None and layout.token is not None:
            raise ValueError(f"{op}: reduction='none' with labels on logits split over tokens and the vocabulary: "
                             "the kept rows differ from rank to rank; pass labels=None, or replicate the tokens")
        teacher_logprobs, teacher_token_ids, support_mask, labels = (
            _local_rows(op, name, tensor, layout) for name, tensor in (
                ("teacher_logprobs", teacher_logprobs), ("teacher_token_ids", teacher_token_ids),
                ("support_mask", support_mask), ("labels", labels)))
        group = layout.mesh.get_group(layout.vocab_dim)
        rows_group = None if layout.token is None else layout.mesh.get_group(layout.token[0])
        student = student.to_local()
    else:
        rows_group = None
    lead = tuple(student.shape[:-1])
    def check() -> None:
        for name, tensor in (("teacher_logprobs", teacher_logprobs), ("teacher_token_ids", teacher_token_ids),
                             ("support_mask", support_mask)):
            if tensor is not None and (tensor.dim() != len(lead) + 1 or tuple(tensor.shape[:-1]) != lead
                                       or tensor.shape[-1] != teacher_logprobs.shape[-1]):
                raise RuntimeError(f"{op}: {name} must be (..., K) of the logits' leading shape {lead}, got "
                                   f"{tuple(tensor.shape)}")
        if labels is not None and tuple(labels.shape) != lead:
            raise RuntimeError(f"{op}: labels must have the logits' leading shape {lead}, got {tuple(labels.shape)}")
        if teacher_token_ids.dtype.is_floating_point or teacher_token_ids.dtype == torch.bool:
            raise TypeError(f"{op}: teacher_token_ids must be of an integer dtype, got {teacher_token_ids.dtype}")

    refused = _refusal(check)
    rows = math.prod(lead)
    keep = None if labels is None else labels.reshape(-1) != ignore_index
    split = split_of(op, group, student.size(-1), rows, rows if keep is None else int(keep.sum()), rows_group,
                     refused)
    k = teacher_logprobs.size(-1)
    x = student.reshape(rows, student.size(-1))
    logprobs = teacher_logprobs.reshape(rows, k)
    ids = teacher_token_ids.reshape(rows, k)
    mask = (torch.ones_like(ids, dtype=torch.bool) if support_mask is None else support_mask.reshape(rows, k).bool())
    check_support_ids(op, ids, mask, split.vocab, keep)
    call = SparseCall(split, Transform(student_logit_scale, student_softcap, temperature), beta, add_tail, keep,
                      how == "none")
    value = _SparseJsd.apply(*_graded(x, logprobs), ids, mask, call)  # type: ignore[no-untyped-call]
    if how == "none" and labels is None:
        value = value.view(lead + (k + add_tail,))
    count = None
    if keep is not None:
        count = keep.sum()
        if rows_group is not None:
            count = _all_reduce(count, rows_group)
    shape = (layout.shape[:-1] if layout is not None else lead) + (k + add_tail,)
    value = _divided(value, how, num_items_in_batch, count, shape, k + add_tail)
    if layout is not None:
        from torch.distributed.tensor import Replicate, Shard

        placements: list[Any] = [Replicate()] * layout.mesh.ndim
        if how == "none":
            if layout.token is not None:
                placements[layout.token[0]] = Shard(layout.token[1])
            value = _dtensor_result(value, layout, placements, shape if labels is None else tuple(value.shape))
        else:
            value = _dtensor_result(value, layout, placements, ())
    return value


# ---- the linear form (fused_linear_jsd_loss): lm_head weights split by rows (vocabulary entries) ------------------
#
# Each chunk's logits slice is made from the replicated hidden states and the rank's rows of each weight, used as
# the logits form uses them, and becomes the gradients of the weights' rows and biases, and the rank's partial
# gradient of the hidden states, before the next chunk. The hard loss (cross entropy on the student's transformed,
# untempered logits) adds a third side to the normalizers where T != 1 and, in the per-row all-reduce, the label's
# logit from the rank that holds it.


def linear_chunk(rows: int, vocab: int, buffers: float) -> int:
    """The linear forms' default chunk of rows: as many as keep the call's `buffers` chunk buffers (C, V_r) within
    3/16 of one rank's N x V_r, the family's budget on the CPU (docs/semantics.md, "The default chunk"; its bound is
    0.25x), and each within 1 GiB of float32 over the whole vocabulary. It depends on N, V and the call's scalars
    alone, so every rank of the group takes the same chunks. Smaller chunks cost time: each streams the weights'
    rows through three products and adds into the weight's gradient (at N 2,048, V 151,936 over 2 ranks, 51 rows
    per chunk took 18.2 s a call, 77 rows 15 s, 256 rows 12.3 s at 0.6x N x V_r)."""
    return max(1, min(int(rows * 3 / (16 * buffers)), (1 << 28) // max(vocab, 1)))


@dataclass(frozen=True)
class LinearCall:
    split: Split
    beta: float
    student: Transform
    teacher: Transform
    keep: Tensor | None
    labels: Tensor | None  # (R,) where the hard loss is computed
    soft: float  # weight_soft_loss / the JSD's divisor
    hard: float  # weight_hard_loss / the cross entropy's divisor (0 where it is not computed)
    chunk: int
    entropy: bool
    reduce_input_grads: bool  # DTensor: the hidden states' gradient made whole over the group (one N x H each)


def _logits_into(h: Tensor, w: Tensor, b: Tensor | None, out: Tensor) -> Tensor:
    return torch.mm(h, w.t(), out=out) if b is None else torch.addmm(b, h, w.t(), out=out)


def linear_forward(call: LinearCall, hs: Tensor, ws: Tensor, bs: Tensor | None, ht: Tensor, wt: Tensor,
                   bt: Tensor | None, grads: tuple[bool, bool]) -> tuple[Tensor, Tensor, Tensor | None, list[Any]]:
    """The JSD's and the cross entropy's global sums (0-dim, `wide`), the entropy per row (or None), and the
    gradients of the weighted loss w.r.t. (hs, ws, bs, ht, wt, bt) where `grads` asks for a side."""
    acc = torch.float64 if torch.float64 in (hs.dtype, ht.dtype) else torch.float32
    rows = hs.size(0)
    group = call.split.group
    summed = wide(acc, hs.device)
    soft = torch.zeros((), dtype=summed, device=hs.device)
    hard = torch.zeros((), dtype=summed, device=hs.device)
    entropy = torch.zeros(rows, dtype=torch.float32, device=hs.device) if call.entropy else None
    out: list[Any] = [None] * 6
    if grads[0]:
        out[0:3] = [torch.zeros_like(hs), torch.zeros_like(ws), None if bs is None else torch.zeros_like(bs)]
    if grads[1]:
        out[3:6] = [torch.zeros_like(ht), torch.zeros_like(wt), None if bt is None else torch.zeros_like(bt)]
    with_hard = call.labels is not None
    untempered = Transform(call.student.scale, call.student.softcap, 1.0)
    own_normalizer = with_hard and call.student.temperature != 1.0
    width = ws.size(0)
    work = Workspace(min(call.chunk, max(rows, 1)), width, acc, hs.device)
    # The products in the inputs' dtype where it is not the one the call computes in (bfloat16, float16).
    raw = {side: Workspace(work.shape[0], width, dtype, hs.device) for side, dtype in (("s", hs.dtype), ("t", ht.dtype))
           if dtype != acc}
    for chunk in _chunks(call.keep, rows, call.chunk):
        h_s, h_t = _take(hs, chunk), _take(ht, chunk)
        n = h_s.size(0)
        a, b = work("s", n), work("t", n)
        x_s = _logits_into(h_s, ws, bs, raw["s"]("x", n) if "s" in raw else a)
        x_t = _logits_into(h_t, wt, bt, raw["t"]("x", n) if "t" in raw else b)
        if own_normalizer:  # the hard loss's untempered logits, before the JSD's transform overwrites x_s
            u = work("u", n)
            transform_into(untempered, x_s, u, None)
        slope_s = transform_into(call.student, x_s, a, work("slope_s", n) if grads[0] else None)
        slope_t = transform_into(call.teacher, x_t, b, work("slope_t", n) if grads[1] else None)
        scratch = [work("c", n), work("d", n), work("e", n)]
        lse = normalizers_into([a, b, u] if own_normalizer else [a, b], group, scratch[0])
        part, a_s, a_t, sums = jsd_chunk_terms(call.beta, a, b, lse[0], lse[1], scratch, call.entropy, None)
        soft += part.to(summed)
        if with_hard:  # the label's log-probability of the untempered logits, from the rank that holds it
            log_u = u.sub_(lse[2][:, None]) if own_normalizer else a
            label = _take(call.labels, chunk).long() - call.split.offset  # type: ignore[arg-type]
            mine = ((label >= 0) & (label < width)).nonzero().squeeze(-1)
            at = label[mine]
            sums.append(torch.zeros_like(lse[0]).index_put_((mine,), log_u[mine, at]))
        reduced = _all_reduce(torch.stack(sums), group).unbind(0)
        if entropy is not None:
            _put(entropy, chunk, (lse[0] - reduced[2]).float())
        if with_hard:
            hard -= reduced[-1].sum().to(summed)
        for side in (0, 1):
            if not grads[side]:
                continue
            logp, slope, h = (a, slope_s, h_s) if side == 0 else (b, slope_t, h_t)
            g = log_softmax_backward_into(a_s if side == 0 else a_t, logp, reduced[side], slope, scratch[2])
            if call.soft != 1.0:
                g.mul_(call.soft)
            if side == 0 and with_hard and call.hard != 0.0:  # + hard * (softmax(u) - one_hot) * du/dx
                prob = torch.exp(log_u, out=scratch[2])
                prob[mine, at] -= 1.0
                du = slope * call.student.temperature
                g.add_(prob.mul_(du) if isinstance(du, Tensor) else prob, alpha=call.hard * (
                    1.0 if isinstance(du, Tensor) else du))
            if h.dtype != acc:
                g = (raw["s" if side == 0 else "t"])("g", n).copy_(g)
            weight = ws if side == 0 else wt
            _put(out[3 * side], chunk, g @ weight)
            out[3 * side + 1].addmm_(g.t(), h)
            if out[3 * side + 2] is not None:
                out[3 * side + 2] += g.sum(0)
    soft = _all_reduce(soft, group)
    if call.split.rows_group is not None:
        soft = _all_reduce(soft, call.split.rows_group)
        hard = _all_reduce(hard, call.split.rows_group)
    if call.reduce_input_grads:
        for side in (0, 3):
            if out[side] is not None:
                out[side] = _all_reduce(out[side], group)
    return soft, hard, entropy, out


def _hard_labels(op: str, labels: Tensor | None, keep: Tensor | None, vocab: int, wanted: bool) -> Tensor | None:
    """The labels the linear forms' cross entropy reads (None where it is not computed), each kept one checked to be
    in [0, V) of the whole vocabulary (the same on every rank)."""
    if labels is None or not wanted:
        return None
    flat = labels.reshape(-1)
    wrong = cast(Tensor, keep) & ((flat < 0) | (flat >= vocab))  # labels given: keep is made from them
    if bool(wrong.any()):
        row = int(wrong.nonzero()[0])
        raise ValueError(f"{op}: labels[{row}] = {int(flat[row])} is outside the vocabulary [0, {vocab}) where the "
                         "cross entropy reads it")
    return flat


def _linear_outputs(ctx: Any, made: list[Any], need: tuple[bool, ...], sums: tuple[Tensor, Tensor, Tensor | None],
                    call: Any, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """A linear form's Function outputs: the weighted loss (differentiable: the gradients `made` in the forward,
    kept for the backward where autograd needs them), the soft and hard sums and the entropy (not)."""
    soft, hard, entropy = sums
    ctx.grads_made = [g if wanted else None for g, wanted in zip(made, need)]
    loss = (soft * call.soft + hard * call.hard).to(dtype)
    if entropy is None:
        entropy = torch.zeros(0, dtype=torch.float32, device=soft.device)
    ctx.mark_non_differentiable(soft, hard, entropy)
    return loss, soft, hard, entropy


class _LinearJsd(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hs: Tensor, ws: Tensor, bs: Tensor | None, ht: Tensor, wt: Tensor,
                bt: Tensor | None, call: LinearCall) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        need = ctx.needs_input_grad
        grads = (any(need[0:3]), any(need[3:6]))
        soft, hard, entropy, out = linear_forward(call, hs.detach(), ws.detach(), None if bs is None else bs.detach(),
                                                  ht.detach(), wt.detach(), None if bt is None else bt.detach(), grads)
        return _linear_outputs(ctx, out, need[:6], (soft, hard, entropy), call, torch.promote_types(hs.dtype, ht.dtype))

    @staticmethod
    def backward(ctx: Any, grad: Tensor, *_unused: Tensor) -> tuple[Tensor | None, ...]:
        return (*scaled_in_place(ctx, "grads_made", grad), None)


def _weight_split(weight: Any, inputs: Any) -> int | None:
    """The mesh dimension over which a DTensor lm_head weight's rows (vocabulary) are split, where the hidden states
    are replicated across it (a vocabulary split); None where they are not split, or where the hidden states are
    sharded across it too: FSDP's Shard(0), which the caller gathers once."""
    from torch.distributed.tensor import DTensor

    if not isinstance(weight, DTensor):
        return None
    placements: Any = weight.placements
    for i, placement in enumerate(placements):
        if placement.is_shard() and placement.dim % 2 == 0:
            if isinstance(inputs, DTensor) and inputs.device_mesh == weight.device_mesh \
                    and not inputs.placements[i].is_replicate():
                return None
            return i
    return None


def fsdp_gathered(weight: Any, inputs: Any) -> Any:
    """A DTensor lm_head weight whose rows are sharded over a mesh dimension across which its hidden states are
    sharded too (FSDP), replicated over it: gathered once, as TRL gathers it, so that the op's rules take it."""
    from torch.distributed.tensor import DTensor, Replicate

    if not isinstance(weight, DTensor) or not isinstance(inputs, DTensor):
        return weight
    placements: list[Any] = list(weight.placements)
    for i, placement in enumerate(placements):
        if placement.is_shard() and placement.dim % 2 == 0 and not inputs.placements[i].is_replicate():
            placements[i] = Replicate()
    return weight if placements == list(weight.placements) else weight.redistribute(weight.device_mesh, placements)


def vocabulary_split_weights(*pairs: tuple[Any, Any]) -> bool:
    """Whether any (weight, hidden states) pair is a DTensor vocabulary split (not FSDP's)."""
    return any(_weight_split(w, h) is not None for w, h in pairs)


def fused_linear_jsd_loss(student_input: Any, student_weight: Any, teacher_input: Any, teacher_weight: Any,
                          labels: Any, *, group: Any, student_bias: Any, teacher_bias: Any, beta: float,
                          temperature: float, ignore_index: int, reduction: str, weight_hard_loss: float,
                          weight_soft_loss: float, chunk_size: int | None, student_logit_scale: float,
                          teacher_logit_scale: float, student_softcap: float | None, teacher_softcap: float | None,
                          return_soft_hard_loss: bool, return_entropy: bool) -> tuple[Any, Any, Any, Any]:
    """functional.fused_linear_jsd_loss on a split: each rank its rows of both weights (and biases), the hidden
    states whole. Returns (loss, soft, hard, entropy) as the op does."""
    op = "fused_linear_jsd_loss"
    mesh = token = None
    vocab_dim = 0
    if group is None:
        mesh, vocab_dim, token = _linear_layout(
            op, ((student_input, "student_input"), (teacher_input, "teacher_input")),
            ((student_weight, student_input, "student_weight"), (teacher_weight, teacher_input, "teacher_weight")))
        _check_bias(op, ((student_bias, student_weight, "student_bias"), (teacher_bias, teacher_weight,
                                                                           "teacher_bias")))
        labels = _local_rows(op, "labels", labels, _Layout(mesh, vocab_dim, token, ()))
        group = mesh.get_group(vocab_dim)
        rows_group = None if token is None else mesh.get_group(token[0])
        student_input, teacher_input = student_input.to_local(), teacher_input.to_local()
        student_weight, student_bias, teacher_weight, teacher_bias = (
            _weight_local(t, token) for t in (student_weight, student_bias, teacher_weight, teacher_bias))
    else:
        rows_group = None
    lead = tuple(student_input.shape[:-1])
    def check() -> None:
        if tuple(teacher_input.shape[:-1]) != lead:
            raise RuntimeError(f"{op}: teacher_input's leading shape {tuple(teacher_input.shape[:-1])} is not "
                               f"student_input's {lead}")
        for weight, inputs, name in ((student_weight, student_input, "student_weight"),
                                     (teacher_weight, teacher_input, "teacher_weight")):
            if weight.dim() != 2 or weight.size(1) != inputs.size(-1):
                raise RuntimeError(f"{op}: {name} must be (V_r, H) with H = {inputs.size(-1)}, got "
                                   f"{tuple(weight.shape)}")
        if teacher_weight.size(0) != student_weight.size(0):
            raise RuntimeError(f"{op}: each rank's rows of teacher_weight ({teacher_weight.size(0)}) and "
                               f"student_weight ({student_weight.size(0)}) must be the same slice of the vocabulary")
        if weight_hard_loss != 0.0 and labels is None:
            raise ValueError(f"{op}: weight_hard_loss={weight_hard_loss} needs labels")

    refused = _refusal(check)
    rows = math.prod(lead)
    keep = None if labels is None else labels.reshape(-1) != ignore_index
    kept = rows if keep is None else int(keep.sum())
    split = split_of(op, group, student_weight.size(0), rows, kept, rows_group, refused)
    hs = student_input.reshape(rows, student_input.size(-1))
    ht = teacher_input.reshape(rows, teacher_input.size(-1))
    count = float(kept)
    if rows_group is not None:
        count = float(_all_reduce(torch.tensor(kept, dtype=torch.float64), rows_group))
    hard_labels = _hard_labels(op, labels, keep, split.vocab, weight_hard_loss != 0.0 or return_soft_hard_loss)
    soft_div = {"sum": 1.0, "batchmean": max(count, 1.0), "mean": max(count, 1.0) * split.vocab}[reduction]
    hard_div = 1.0 if reduction == "sum" else max(count, 1.0)
    if chunk_size is None:  # s, t and three scratch buffers, the slopes of the softcaps, the hard loss's own
        half = 0.5 if hs.itemsize < 4 else 0.0  # logits, and the products in the inputs' 16-bit dtype
        chunk_size = linear_chunk(rows, split.vocab, 5 + (student_softcap is not None) + (teacher_softcap is not None)
                                  + (hard_labels is not None and temperature != 1.0) + 3 * half)
    call = LinearCall(split, beta, Transform(student_logit_scale, student_softcap, temperature),
                      Transform(teacher_logit_scale, teacher_softcap, temperature), keep, hard_labels,
                      weight_soft_loss / soft_div, weight_hard_loss / hard_div, chunk_size, return_entropy,
                      mesh is not None)
    tensors = _graded(hs, student_weight, student_bias, ht, teacher_weight, teacher_bias)
    loss, soft, hard, entropy = _LinearJsd.apply(*tensors, call)  # type: ignore[no-untyped-call]
    result = torch.promote_types(hs.dtype, ht.dtype)
    soft, hard = (soft / soft_div).to(result), (hard / hard_div).to(result)
    entropy = entropy.view(lead) if return_entropy else entropy
    return _linear_results((loss, soft, hard, entropy), mesh, vocab_dim, token, return_entropy)


# ---- the served teacher's linear form (fused_linear_sparse_jsd_loss): the student's weight split by rows --------


@dataclass(frozen=True)
class SparseLinearCall:
    split: Split
    student: Transform
    beta: float
    add_tail: bool
    keep: Tensor | None
    labels: Tensor | None  # (R,) where the hard loss is computed
    soft: float  # weight_soft_loss / the divergence's divisor
    hard: float  # weight_hard_loss / the cross entropy's divisor
    chunk: int
    entropy: bool
    reduce_input_grad: bool


def sparse_linear_forward(call: SparseLinearCall, hs: Tensor, ws: Tensor, bs: Tensor | None, logprobs: Tensor,
                          ids: Tensor, mask: Tensor, grads: tuple[bool, bool]
                          ) -> tuple[Tensor, Tensor, Tensor | None, list[Any]]:
    """The divergence's and the cross entropy's sums (0-dim, `wide`), the entropy per row, and the gradients of the
    weighted loss w.r.t. (hs, ws, bs, logprobs) where `grads` asks (the student's side, the teacher's values)."""
    acc = torch.float64 if hs.dtype == torch.float64 else torch.float32
    tiny = torch.finfo(acc).tiny
    rows, k = ids.shape
    group = call.split.group
    width = ws.size(0)
    summed = wide(acc, hs.device)
    soft = torch.zeros((), dtype=summed, device=hs.device)
    hard = torch.zeros((), dtype=summed, device=hs.device)
    entropy = torch.zeros(rows, dtype=torch.float32, device=hs.device) if call.entropy else None
    out: list[Any] = [None] * 4
    if grads[0]:
        out[0:3] = [torch.zeros_like(hs), torch.zeros_like(ws), None if bs is None else torch.zeros_like(bs)]
    if grads[1]:
        out[3] = torch.zeros_like(logprobs)
    with_hard = call.labels is not None
    untempered = Transform(call.student.scale, call.student.softcap, 1.0)
    own_normalizer = with_hard and call.student.temperature != 1.0
    work = Workspace(min(call.chunk, max(rows, 1)), width, acc, hs.device)
    raw = Workspace(work.shape[0], width, hs.dtype, hs.device) if hs.dtype != acc else None
    zero = torch.zeros((), dtype=acc, device=hs.device)
    for chunk in _chunks(call.keep, rows, call.chunk):
        h = _take(hs, chunk)
        n = h.size(0)
        a = work("s", n)
        x = _logits_into(h, ws, bs, raw("x", n) if raw is not None else a)
        if own_normalizer:
            u = work("u", n)
            transform_into(untempered, x, u, None)
        slope = transform_into(call.student, x, a, work("slope", n) if grads[0] else None)
        scratch = work("c", n)
        lse = normalizers_into([a, u] if own_normalizer else [a], group, scratch)
        rel, inside, on = _support_chunk(call, ids, mask, chunk)  # type: ignore[arg-type]
        at = take_at(a, rel) if width else torch.zeros(rel.shape, dtype=acc, device=hs.device)
        parts = [torch.where(inside, at, zero)]
        if with_hard:  # the label's untempered logit, from the rank that holds it
            label = _take(call.labels, chunk).long() - call.split.offset  # type: ignore[arg-type]
            mine = ((label >= 0) & (label < width)).nonzero().squeeze(-1)
            u_logits = u if own_normalizer else a
            parts.append(torch.zeros(n, 1, dtype=acc, device=hs.device).index_put_(
                (mine, torch.zeros_like(mine)), u_logits[mine, label[mine]]))
        a.sub_(lse[0][:, None])  # a: the student's log-probabilities over the slice
        if entropy is not None:  # sum(p z) = sum(p s) + lse * sum(p)
            p = torch.exp(a, out=scratch)
            mass = p.sum(-1)
            parts.append((p.mul_(a).sum(-1) + lse[0] * mass)[:, None])
        reduced = _all_reduce(torch.cat(parts, dim=1), group)
        s = reduced[:, :k] - lse[0][:, None]
        if entropy is not None:
            _put(entropy, chunk, (lse[0] - reduced[:, -1]).float())
        t = _take(logprobs, chunk).detach().to(summed).requires_grad_(grads[1])
        s_wide = s.to(summed).requires_grad_(grads[0])
        with torch.enable_grad():
            terms = support_terms(s_wide, t, on, call.beta, call.add_tail, tiny)
            total = terms.sum()
            wanted = [x for x, g in ((s_wide, grads[0]), (t, grads[1])) if g]
            g_terms = torch.autograd.grad(total, wanted) if wanted else ()
        soft += total.detach()
        log_u = None
        if with_hard:
            lse_u = lse[1] if own_normalizer else lse[0]
            hard -= (reduced[:, k] - lse_u).sum().to(summed)
        if grads[1]:
            _put(out[3], chunk, g_terms[-1] * call.soft)
        if not grads[0]:
            continue
        g_s = g_terms[0].to(acc)
        d = work("d", n)
        # The log-softmax's backward on the slice: -p * sum(G) everywhere, G added at the ids this rank holds.
        torch.exp(a, out=d).mul_(-g_s.sum(-1, keepdim=True))
        if width:
            add_at(d, rel, torch.where(inside, g_s, zero))
        d.mul_(slope).mul_(call.soft)
        if with_hard and call.hard != 0.0:  # + hard * (softmax(u) - one_hot) * du/dx
            log_u = u.sub_(lse[1][:, None]) if own_normalizer else a
            prob = torch.exp(log_u, out=scratch)
            prob[mine, label[mine]] -= 1.0
            du = slope * call.student.temperature
            d.add_(prob.mul_(du) if isinstance(du, Tensor) else prob,
                   alpha=call.hard * (1.0 if isinstance(du, Tensor) else du))
        g = raw("g", n).copy_(d) if raw is not None else d
        _put(out[0], chunk, g @ ws)
        out[1].addmm_(g.t(), h)
        if out[2] is not None:
            out[2] += g.sum(0)
    # Every rank holds the whole support's terms and the label's log-probability: the sums cross a token split only.
    if call.split.rows_group is not None:
        soft = _all_reduce(soft, call.split.rows_group)
        hard = _all_reduce(hard, call.split.rows_group)
    if call.reduce_input_grad and out[0] is not None:
        out[0] = _all_reduce(out[0], group)
    return soft, hard, entropy, out


class _SparseLinearJsd(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hs: Tensor, ws: Tensor, bs: Tensor | None, logprobs: Tensor,
                ids: Tensor, mask: Tensor, call: SparseLinearCall) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        need = ctx.needs_input_grad
        grads = (any(need[0:3]), need[3])
        soft, hard, entropy, out = sparse_linear_forward(
            call, hs.detach(), ws.detach(), None if bs is None else bs.detach(), logprobs.detach(), ids, mask, grads)
        return _linear_outputs(ctx, out, need[:4], (soft, hard, entropy), call,
                               torch.promote_types(hs.dtype, logprobs.dtype))

    @staticmethod
    def backward(ctx: Any, grad: Tensor, *_unused: Tensor) -> tuple[Tensor | None, ...]:
        return (*scaled_in_place(ctx, "grads_made", grad), None, None, None)


def _linear_layout(op: str, inputs: tuple[tuple[Any, str], ...], weights: tuple[tuple[Any, Any, str], ...]
                   ) -> tuple[Any, int, tuple[int, int] | None]:
    """A linear form's DTensor layout: the mesh, the mesh dimension over which every weight's rows are split (the
    same for each), and the token split of the hidden states (mesh dimension, tensor dimension) or None."""
    from torch.distributed.tensor import DTensor, Shard

    dims = {_weight_split(weight, hidden) for weight, hidden, _ in weights}
    if len(dims) != 1 or None in dims:
        names = " and ".join(f"{name} {tuple(getattr(w, 'placements', ()))}" for w, _, name in weights)
        raise ValueError(f"{op}: the weights must be split over the vocabulary alike, on one mesh dimension: {names}"
                         if len(weights) > 1 else f"{op}: {weights[0][2]} must be split over the vocabulary")
    vocab_dim = cast(int, dims.pop())
    mesh = weights[0][0].device_mesh
    token = None
    for tensor, name in inputs:
        if not isinstance(tensor, DTensor) or tensor.device_mesh != mesh:
            raise ValueError(f"{op}: {name} must be a DTensor on the weights' mesh, replicated over the "
                             "vocabulary's mesh dimension")
        placements: Any = tensor.placements
        for i, placement in enumerate(placements):
            if placement.is_shard():
                if placement.dim % tensor.dim() == tensor.dim() - 1 or token not in (None, (i, placement.dim)):
                    raise ValueError(f"{op}: {name} placed {tuple(tensor.placements)}: only one token dimension "
                                     "may be sharded, on a mesh dimension of its own")
                token = (i, placement.dim % tensor.dim())
    for weight, _, name in weights:
        if weight.device_mesh != mesh:
            raise ValueError(f"{op}: {name} must be on the other weight's mesh")
    return mesh, vocab_dim, token


def _check_bias(op: str, biases: tuple[tuple[Any, Any, str], ...]) -> None:
    """Each bias given is a DTensor split as its weight's rows are."""
    from torch.distributed.tensor import DTensor, Shard

    for bias, weight, name in biases:
        if bias is not None and (not isinstance(bias, DTensor) or list(bias.placements)
                                 != [Shard(0) if p.is_shard() else p for p in weight.placements]):
            raise ValueError(f"{op}: {name} must be a DTensor split as its weight's rows are")


def _weight_local(tensor: Any, token: tuple[int, int] | None) -> Any:
    """A weight's (or bias's) rows on this rank; its gradient Partial over a token split (each token rank's share,
    summed where DTensor reads it), never a V x H collective in the loss."""
    from torch.distributed.tensor import Partial

    if tensor is None or token is None:
        return None if tensor is None else tensor.to_local()
    grads = list(tensor.placements)
    grads[token[0]] = Partial()
    return tensor.to_local(grad_placements=grads)


def fused_linear_sparse_jsd_loss(student_input: Any, student_weight: Any, teacher_logprobs: Any,
                                 teacher_token_ids: Any, labels: Any, *, group: Any, student_bias: Any,
                                 support_mask: Any, beta: float, temperature: float, add_tail: bool, reduction: str,
                                 num_items_in_batch: Any, ignore_index: int, student_logit_scale: float,
                                 student_softcap: float | None, weight_hard_loss: float, weight_soft_loss: float,
                                 chunk_size: int | None, return_soft_hard_loss: bool, return_entropy: bool
                                 ) -> tuple[Any, Any, Any, Any]:
    """functional.fused_linear_sparse_jsd_loss on a split: each rank its rows of the student's weight (and bias),
    the hidden states and the served teacher's (..., K) whole. Returns (loss, soft, hard, entropy)."""
    op = "fused_linear_sparse_jsd_loss"
    mesh = token = None
    vocab_dim = 0
    if group is None:
        mesh, vocab_dim, token = _linear_layout(op, ((student_input, "student_input"),),
                                                ((student_weight, student_input, "student_weight"),))
        _check_bias(op, ((student_bias, student_weight, "student_bias"),))
        layout = _Layout(mesh, vocab_dim, token, ())
        teacher_logprobs, teacher_token_ids, support_mask, labels = (
            _local_rows(op, name, tensor, layout) for name, tensor in (
                ("teacher_logprobs", teacher_logprobs), ("teacher_token_ids", teacher_token_ids),
                ("support_mask", support_mask), ("labels", labels)))
        group = mesh.get_group(vocab_dim)
        rows_group = None if token is None else mesh.get_group(token[0])
        student_input = student_input.to_local()
        student_weight, student_bias = _weight_local(student_weight, token), _weight_local(student_bias, token)
    else:
        rows_group = None
    lead = tuple(student_input.shape[:-1])
    k = teacher_logprobs.size(-1)
    def check() -> None:
        for name, tensor in (("teacher_logprobs", teacher_logprobs), ("teacher_token_ids", teacher_token_ids),
                             ("support_mask", support_mask)):
            if tensor is not None and (tuple(tensor.shape[:-1]) != lead or tensor.size(-1) != k):
                raise RuntimeError(f"{op}: {name} must be (..., K) of the hidden states' leading shape {lead}, got "
                                   f"{tuple(tensor.shape)}")
        if student_weight.dim() != 2 or student_weight.size(1) != student_input.size(-1):
            raise RuntimeError(f"{op}: student_weight must be (V_r, H) with H = {student_input.size(-1)}, got "
                               f"{tuple(student_weight.shape)}")
        if labels is not None and tuple(labels.shape) != lead:
            raise RuntimeError(f"{op}: labels must have the hidden states' leading shape {lead}, got "
                               f"{tuple(labels.shape)}")
        if weight_hard_loss != 0.0 and labels is None:
            raise ValueError(f"{op}: weight_hard_loss={weight_hard_loss} needs labels")

    refused = _refusal(check)
    rows = math.prod(lead)
    keep = None if labels is None else labels.reshape(-1) != ignore_index
    kept = rows if keep is None else int(keep.sum())
    split = split_of(op, group, student_weight.size(0), rows, kept, rows_group, refused)
    hs = student_input.reshape(rows, student_input.size(-1))
    logprobs = teacher_logprobs.reshape(rows, k)
    ids = teacher_token_ids.reshape(rows, k)
    mask = torch.ones_like(ids, dtype=torch.bool) if support_mask is None else support_mask.reshape(rows, k).bool()
    check_support_ids(op, ids, mask, split.vocab, keep)
    count = float(kept) if rows_group is None else float(_all_reduce(torch.tensor(float(kept)), rows_group))
    hard_labels = _hard_labels(op, labels, keep, split.vocab, weight_hard_loss != 0.0 or return_soft_hard_loss)
    how = "sum" if num_items_in_batch is not None else reduction
    entries = k + add_tail
    soft_div = {"sum": 1.0, "batchmean": max(count, 1.0), "mean": max(count, 1.0) * entries}[how]
    hard_div = 1.0 if how == "sum" else max(count, 1.0)
    if chunk_size is None:  # s and two scratch buffers, the softcap's slope, the hard loss's own logits, the products'
        half = 0.5 if hs.itemsize < 4 else 0.0
        chunk_size = linear_chunk(rows, split.vocab, 3 + (student_softcap is not None)
                                  + (hard_labels is not None and temperature != 1.0) + 2 * half)
    call = SparseLinearCall(split, Transform(student_logit_scale, student_softcap, temperature), beta, add_tail, keep,
                            hard_labels, weight_soft_loss / soft_div, weight_hard_loss / hard_div, chunk_size,
                            return_entropy, mesh is not None)
    tensors = _graded(hs, student_weight, student_bias, logprobs)
    loss, soft, hard, entropy = _SparseLinearJsd.apply(*tensors, ids, mask, call)  # type: ignore[no-untyped-call]
    result = torch.promote_types(hs.dtype, logprobs.dtype)
    soft, hard = (soft / soft_div).to(result), (hard / hard_div).to(result)
    if num_items_in_batch is not None:
        if isinstance(num_items_in_batch, Tensor):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss, soft, hard = loss / num_items_in_batch, soft / num_items_in_batch, hard / num_items_in_batch
    entropy = entropy.view(lead) if return_entropy else entropy
    return _linear_results((loss, soft, hard, entropy), mesh, vocab_dim, token, return_entropy)


def _linear_results(results: tuple[Tensor, Tensor, Tensor, Tensor], mesh: Any, vocab_dim: int,
                    token: tuple[int, int] | None, return_entropy: bool) -> tuple[Any, Any, Any, Any]:
    """A linear form's (loss, soft, hard, entropy): as they are for a group, DTensors on a mesh (the scalars
    replicated, the entropy sharded as the tokens)."""
    if mesh is None:
        return results
    from torch.distributed.tensor import DTensor, Replicate, Shard

    layout = _Layout(mesh, vocab_dim, token, ())
    replicated: list[Any] = [Replicate()] * mesh.ndim
    loss, soft, hard = (_dtensor_result(x, layout, replicated, ()) for x in results[:3])
    entropy = results[3]
    if return_entropy:
        placements = list(replicated)
        if token is not None:
            placements[token[0]] = Shard(token[1])
        entropy = DTensor.from_local(entropy, mesh, placements, run_check=False)
    return loss, soft, hard, entropy
