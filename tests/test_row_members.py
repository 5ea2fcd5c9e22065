"""Every row member the declaration list holds (csrc/losses.h, LossKind::Rows), walked through every layer's
table: its schemas, its fake kernels, autograd, its DTensor rules, the CPU frame's kernel table and the NPU's
row frame (docs/adding_a_loss.md, "Adding a row member"). Nothing is declared here: the members come from
``_C._losses()``, so a member added to the list and missing from any layer fails here."""
from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from npu_loss_ops import _C, _dtensor  # type: ignore[attr-defined]

ROWS: list[dict[str, Any]] = [row for row in _C._losses() if row["kind"] == "rows"]
IDS = [row["forward"] for row in ROWS]


def _ops_of(row: dict[str, Any]) -> list[str]:
    """The names of every op the member declares: its three, and its linear form's two."""
    ops = [row["forward"], row["with_grads"], row["backward"]]
    if row["linear"] is not None:
        ops += [row["linear"]["forward"], row["linear"]["with_grads"]]
    return ops


def _overload(name: str) -> torch._ops.OpOverload:
    return getattr(torch.ops.npu_loss, name).default


def _has_kernel(name: str, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"npu_loss::{name}", key)


def test_the_list_has_row_members():
    assert IDS, "the declaration list holds no row member"


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_schemas_name_the_declared_arguments(row):
    for name in _ops_of(row):
        assert hasattr(torch.ops.npu_loss, name), f"no schema for npu_loss::{name}"
    forward = [a.name for a in _overload(row["forward"])._schema.arguments]
    inputs = [i["name"] for i in row["inputs"]]
    assert forward == [*row["logits"], *inputs, row["labels"], "reduction", *row["scalars"], row["index"]]
    backward = [a.name for a in _overload(row["backward"])._schema.arguments]
    assert backward == ["grad_output", *forward, "output_mask"]
    with_grads = [a.name for a in _overload(row["with_grads"])._schema.arguments]
    assert with_grads == [*forward, "output_mask"]
    if row["linear"] is not None:
        f = row["linear"]
        names = [a.name for a in _overload(f["forward"])._schema.arguments]
        assert names[:7] == [f["inputs"][0], f["weights"][0], f["inputs"][1], f["weights"][1], row["labels"],
                             *f["biases"]]
        n = len(row["scalars"])
        assert names[8:11 + n] == [*row["scalars"], row["index"], *f["weights_of"]]


def _tensors(row: dict[str, Any], rows: int = 3, vocab: int = 11,
             **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """The member's student logits, its teacher in the declared form (logits of the same shape, or K = 4
    log-probabilities over a support) and each declared input without a gradient, of the teacher's shape."""
    student = torch.randn(rows, vocab, **kwargs)
    if row["teacher"] == "logits":
        teacher = torch.randn(rows, vocab, **kwargs)
    else:
        teacher = torch.randn(rows, 4).log_softmax(-1).requires_grad_(kwargs.get("requires_grad", False))
    inputs = [torch.stack([torch.randperm(vocab)[:teacher.size(-1)] for _ in range(rows)]) if i["kind"] == "ids"
              else torch.ones(teacher.shape, dtype=torch.bool) for i in row["inputs"]]
    return student, teacher, inputs


def _defaults(row: dict[str, Any]) -> list[Any]:
    """The forward's declared scalars and index at their schema defaults."""
    arguments = _overload(row["forward"])._schema.arguments
    return [a.default_value for a in arguments[-1 - len(row["scalars"]):]]


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_fake_kernels_give_the_real_shapes(row):
    student, teacher, inputs = _tensors(row)
    labels = torch.tensor([0, -100, 2])
    rest = _defaults(row)

    def calls(s: torch.Tensor, t: torch.Tensor, i: list[torch.Tensor], l: torch.Tensor,
              g: torch.Tensor) -> list[Any]:
        return [
            _overload(row["forward"])(s, t, *i, l, 2),
            _overload(row["with_grads"])(s, t, *i, None, 2, *rest, [True, True]),
            _overload(row["backward"])(g, s, t, *i, None, 2, *rest, [True, False]),
        ]

    real = calls(student, teacher, inputs, labels, torch.tensor(1.0))
    with FakeTensorMode() as mode:
        fake = calls(*(mode.from_tensor(t) for t in (student, teacher)), [mode.from_tensor(i) for i in inputs],
                     mode.from_tensor(labels), mode.from_tensor(torch.tensor(1.0)))
    flat = lambda xs: [x for r in xs for x in (r if isinstance(r, tuple) else (r,))]  # noqa: E731
    for r, f in zip(flat(real), flat(fake), strict=True):
        assert (tuple(f.shape), f.dtype) == (tuple(r.shape), r.dtype)


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_autograd_kernels_make_the_gradients(row):
    assert row["forward"] in _C._differentiable_ops()
    student, teacher, inputs = _tensors(row, requires_grad=True)
    _overload(row["forward"])(student, teacher, *inputs, None, 1).backward()
    assert student.grad is not None and teacher.grad is not None
    assert student.grad.abs().sum() > 0 and teacher.grad.abs().sum() > 0
    if row["linear"] is not None:
        assert _has_kernel(row["linear"]["forward"], "Autograd")


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_dtensor_rules_cover_every_op(row):
    from torch.distributed.tensor import DTensor

    assert row["forward"] in {r.forward for r in _dtensor.ROW_LOSSES}
    funcs = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs
    missing = [name for name in _ops_of(row) if _overload(name) not in funcs]
    assert not missing, f"no DTensor rule for {missing}"


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_the_cpu_frame_has_a_kernel(row):
    assert row["cpu_kernel"], f"{row['forward']} has no entry in the CPU row kernels' table"
    missing = [name for name in _ops_of(row) if not _has_kernel(name, "CPU")]
    assert not missing, f"no CPU kernel for {missing}"


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_the_npu_row_frame_runs_it(row, device):
    if device != "npu":
        pytest.skip("the NPU's row frame is walked where the NPU runs (scripts/run_npu_emulated.sh)")
    from npu_loss_ops import _C_npu  # type: ignore[attr-defined]

    # A member whose chip paths name an aclnn API has chunk math in the NPU's row frame; one whose paths all run
    # the composite (the sparse JSD, for now) has none, and its ops still have NPU kernels: the composite's.
    on_aclnn = any(p["api"] != "composite" for p in _C._chip_paths() if p["op"] == row["forward"])
    assert (row["forward"] in _C_npu.row_members()) == on_aclnn
    missing = [name for name in _ops_of(row) if not _has_kernel(name, "PrivateUse1")]
    assert not missing, f"no NPU kernel for {missing}"
    student, teacher, inputs = _tensors(row)
    value = _overload(row["forward"])(student.to(device), teacher.to(device), *(i.to(device) for i in inputs))
    assert value.device.type == "npu"
    torch.testing.assert_close(value.cpu(), _overload(row["forward"])(student, teacher, *inputs), rtol=1e-5,
                               atol=1e-6)
