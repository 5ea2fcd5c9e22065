"""The op library is docs/semantics.md's ("The ops"): the twenty-three schemas exactly (names, argument order,
defaults, keyword-only and alias annotations), a kernel for CPU and the composite fallback, a fake (Meta)
kernel, autograd for the eighteen functional ops, Functionalize kernels for the five out= overloads."""
import pytest
import torch

import npu_loss_ops

SCHEMAS = [
    "npu_loss::smooth_l1_loss(Tensor self, Tensor target, int reduction=1, float beta=1.) -> Tensor",
    "npu_loss::smooth_l1_loss_backward(Tensor grad_output, Tensor self, Tensor target, int reduction, float beta) -> Tensor",
    "npu_loss::smooth_l1_loss_backward.grad_input(Tensor grad_output, Tensor self, Tensor target, int reduction, float beta, *, Tensor(a!) grad_input) -> Tensor(a!)",
    "npu_loss::l1_loss(Tensor self, Tensor target, int reduction=1) -> Tensor",
    "npu_loss::l1_loss_backward(Tensor grad_output, Tensor self, Tensor target, int reduction) -> Tensor",
    "npu_loss::l1_loss_backward.grad_input(Tensor grad_output, Tensor self, Tensor target, int reduction, *, Tensor(a!) grad_input) -> Tensor(a!)",
    "npu_loss::kl_div(Tensor self, Tensor target, int reduction=1, *, bool log_target=False) -> Tensor",
    "npu_loss::kl_div_target_backward(Tensor grad_output, Tensor self, Tensor target, int reduction, bool log_target) -> Tensor",
    "npu_loss::kl_div_target_backward.grad_target(Tensor grad_output, Tensor self, Tensor target, int reduction, bool log_target, *, Tensor(a!) grad_target) -> Tensor(a!)",
    "npu_loss::huber_loss(Tensor self, Tensor target, int reduction=1, float delta=1.) -> Tensor",
    "npu_loss::huber_loss_backward(Tensor grad_output, Tensor self, Tensor target, int reduction, float delta) -> Tensor",
    "npu_loss::huber_loss_backward.out(Tensor grad_output, Tensor self, Tensor target, int reduction, float delta, *, Tensor(a!) grad_input) -> Tensor(a!)",
    "npu_loss::mse_loss(Tensor self, Tensor target, int reduction=1) -> Tensor",
    "npu_loss::mse_loss_backward(Tensor grad_output, Tensor self, Tensor target, int reduction) -> Tensor",
    "npu_loss::mse_loss_backward.grad_input(Tensor grad_output, Tensor self, Tensor target, int reduction, *, Tensor(a!) grad_input) -> Tensor(a!)",
    "npu_loss::generalized_jsd_loss(Tensor student_logits, Tensor teacher_logits, Tensor? labels=None, int reduction=1, float beta=0.5, float temperature=1., float student_logit_scale=1., float teacher_logit_scale=1., float? student_softcap=None, float? teacher_softcap=None, int ignore_index=-100) -> Tensor",
    "npu_loss::generalized_jsd_loss_backward(Tensor grad_output, Tensor student_logits, Tensor teacher_logits, Tensor? labels, int reduction, float beta, float temperature, float student_logit_scale, float teacher_logit_scale, float? student_softcap, float? teacher_softcap, int ignore_index, bool[2] output_mask) -> (Tensor, Tensor)",
    "npu_loss::_generalized_jsd_loss_and_grads(Tensor student_logits, Tensor teacher_logits, Tensor? labels, int reduction, float beta, float temperature, float student_logit_scale, float teacher_logit_scale, float? student_softcap, float? teacher_softcap, int ignore_index, bool[2] output_mask) -> (Tensor, Tensor, Tensor, Tensor)",
    "npu_loss::sparse_jsd_loss(Tensor student_logits, Tensor teacher_logprobs, Tensor teacher_token_ids, Tensor? support_mask=None, Tensor? labels=None, int reduction=1, float beta=0., float temperature=1., bool add_tail=True, float student_logit_scale=1., float? student_softcap=None, int ignore_index=-100) -> Tensor",
    "npu_loss::sparse_jsd_loss_backward(Tensor grad_output, Tensor student_logits, Tensor teacher_logprobs, Tensor teacher_token_ids, Tensor? support_mask, Tensor? labels, int reduction, float beta, float temperature, bool add_tail, float student_logit_scale, float? student_softcap, int ignore_index, bool[2] output_mask) -> (Tensor, Tensor)",
    "npu_loss::_sparse_jsd_loss_and_grads(Tensor student_logits, Tensor teacher_logprobs, Tensor teacher_token_ids, Tensor? support_mask, Tensor? labels, int reduction, float beta, float temperature, bool add_tail, float student_logit_scale, float? student_softcap, int ignore_index, bool[2] output_mask) -> (Tensor, Tensor, Tensor, Tensor)",
    "npu_loss::fused_linear_jsd_loss(Tensor student_input, Tensor student_weight, Tensor teacher_input, Tensor teacher_weight, Tensor? labels=None, Tensor? student_bias=None, Tensor? teacher_bias=None, str reduction=\"batchmean\", float beta=0.5, float temperature=1., float student_logit_scale=1., float teacher_logit_scale=1., float? student_softcap=None, float? teacher_softcap=None, int ignore_index=-100, float weight_hard_loss=0., float weight_soft_loss=1., int? chunk_size=None, bool return_soft_hard_loss=False, bool return_entropy=False) -> (Tensor, Tensor, Tensor, Tensor)",
    "npu_loss::_fused_linear_jsd_loss_and_grads(Tensor student_input, Tensor student_weight, Tensor teacher_input, Tensor teacher_weight, Tensor? labels, Tensor? student_bias, Tensor? teacher_bias, str reduction, float beta, float temperature, float student_logit_scale, float teacher_logit_scale, float? student_softcap, float? teacher_softcap, int ignore_index, float weight_hard_loss, float weight_soft_loss, int? chunk_size, bool return_soft_hard_loss, bool return_entropy, bool[6] output_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    "npu_loss::fused_linear_sparse_jsd_loss(Tensor student_input, Tensor student_weight, Tensor teacher_logprobs, Tensor teacher_token_ids, Tensor? labels=None, Tensor? student_bias=None, Tensor? support_mask=None, str reduction=\"batchmean\", float beta=0., float temperature=1., bool add_tail=True, float student_logit_scale=1., float? student_softcap=None, int ignore_index=-100, float weight_hard_loss=0., float weight_soft_loss=1., int? chunk_size=None, bool return_soft_hard_loss=False, bool return_entropy=False) -> (Tensor, Tensor, Tensor, Tensor)",
    "npu_loss::_fused_linear_sparse_jsd_loss_and_grads(Tensor student_input, Tensor student_weight, Tensor teacher_logprobs, Tensor teacher_token_ids, Tensor? labels, Tensor? student_bias, Tensor? support_mask, str reduction, float beta, float temperature, bool add_tail, float student_logit_scale, float? student_softcap, int ignore_index, float weight_hard_loss, float weight_soft_loss, int? chunk_size, bool return_soft_hard_loss, bool return_entropy, bool[6] output_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
]


def _overload(schema: str):
    name = schema.split("(")[0].removeprefix("npu_loss::")
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.npu_loss, packet), overload or "default")


def _parse(schema: str):
    return torch._C.parse_schema(schema)


@pytest.mark.parametrize("schema", SCHEMAS, ids=[s.split("(")[0] for s in SCHEMAS])
def test_schema_is_specs(schema):
    assert _overload(schema)._schema == _parse(schema), str(_overload(schema)._schema)


@pytest.mark.parametrize("schema", SCHEMAS, ids=[s.split("(")[0] for s in SCHEMAS])
def test_kernels_registered(schema):
    qualname = schema.split("(")[0]
    has = lambda key: torch._C._dispatch_has_kernel_for_dispatch_key(qualname, key)  # noqa: E731
    assert has("CPU") and has("CompositeExplicitAutograd") and has("Meta")
    if "." in qualname:
        assert has("Functionalize"), "out= overloads need a Functionalize kernel"
    else:
        assert has("Autograd") or has("AutogradCPU"), "functional ops are differentiable"


@pytest.mark.parametrize("schema", SCHEMAS, ids=[s.split("(")[0] for s in SCHEMAS])
def test_npu_kernels_available_says_whether_the_aclnn_kernels_are_registered(schema):
    """npu_kernels_available() and build_info() tell the truth: True exactly when every op and overload has
    its aclnn kernel registered for the NPU (PrivateUse1); otherwise the reason says why not."""
    available = npu_loss_ops.npu_kernels_available()
    info = npu_loss_ops.build_info()
    assert available is info["npu_kernels"]
    qualname = schema.split("(")[0]
    assert torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "PrivateUse1") is available
    if not available:
        assert info["npu_reason"] and info["npu_reason"] != "aclnn kernels registered for the NPU", info


def test_a_torch_other_than_the_build_one_is_a_clear_rebuild_error():
    npu_loss_ops._check_torch_version(torch.__version__, torch.__version__)  # the normal case passes
    # A release below every supported one, so that it differs from the installed torch on every release.
    with pytest.raises(ImportError, match=r"built against torch 2\.0\.0, but torch .* Rebuild"):
        npu_loss_ops._check_torch_version("2.0.0", torch.__version__)
    assert npu_loss_ops._same_torch_abi(npu_loss_ops._BUILT_WITH_TORCH, torch.__version__)


@pytest.mark.parametrize("built, installed, runs", [
    ("2.13.0+cpu", "2.13.0+cpu", True),
    ("2.13.0+cpu", "2.13.0", True),  # no label
    ("2.13.0+cpu", "2.13.0+cu130", True),
    ("2.13.0", "2.13.0+cpu", True),
    ("2.13.0+rocm7.1", "2.13.0+rocm7.1", True),
    ("2.13.0+cpu", "2.13.0+rocm7.1", False),  # never checked: the exact version only
    ("2.13.0+cpu", "2.13.0+xpu", False),
    ("2.13.0+cpu", "2.13.1+cpu", False),
    ("2.13.0+cpu", "2.14.0", False),
    ("2.13.0a0+git1234567", "2.13.0", False),  # a source build
])
def test_a_wheel_runs_under_the_builds_of_its_release_that_share_the_abi(built, installed, runs):
    """A wheel requires torch==<release> (setup.py, NPU_LOSS_OPS_WHEEL=1), which any build of the release
    satisfies; the import accepts those whose C++ ABI is the one it was built against (docs/usage.md,
    "Deploying")."""
    assert npu_loss_ops._same_torch_abi(built, installed) is runs
    if not runs:
        with pytest.raises(ImportError, match="Rebuild it against the installed torch"):
            npu_loss_ops._check_torch_version(built, installed)


def _row_loss_ops() -> set[str]:
    """The ops of the row losses (csrc/losses.h's LossKind::Rows), as 'npu_loss::name'."""
    from npu_loss_ops import _C

    return {f"npu_loss::{d[k]}" for d in _C._losses() if d["kind"] == "rows" for k in ("forward", "with_grads", "backward")}


def test_fake_tensors_run_the_cpp_meta_kernels_on_symbolic_sizes():
    """No elementwise op has a Python fake kernel: FakeTensorMode runs the C++ Meta kernels
    (csrc/registration/meta.cpp, the checks on SymInt sizes), on symbolic sizes too (a ShapeEnv, as
    torch.compile(dynamic=True) and torch.export use): each result keeps the symbolic batch size. The row
    losses' ops have the package's Python fake kernels (npu_loss_ops/_fake.py: 'none' with labels has an
    unbacked size), which keep the symbolic sizes alike."""
    from torch._library.simple_registry import singleton
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    rows = _row_loss_ops()
    assert len(rows) == 6, rows
    # The linear form's two ops have C++ Meta kernels (their results' sizes are the inputs'), checked below.
    linear = {f"npu_loss::{d['linear'][k]}" for d in npu_loss_ops._C._losses() if d["kind"] == "rows" and d["linear"]
              for k in ("forward", "with_grads")}
    assert len(linear) == 4, linear
    for schema in SCHEMAS:
        qualname = schema.split("(")[0]
        kernel = singleton.find(qualname).fake_impl.kernel
        if qualname in linear:
            assert kernel is None, schema
        elif qualname in rows:
            assert kernel is not None and kernel.source.split(":")[0].endswith("npu_loss_ops/_fake.py"), (schema, kernel)
        else:
            assert kernel is None, schema
    mode = FakeTensorMode(shape_env=ShapeEnv())
    dynamic_batch = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    x = mode.from_tensor(torch.randn(6, 4), symbolic_context=dynamic_batch)
    ops = torch.ops.npu_loss
    with mode:
        t, g = x.sigmoid(), x.cos()  # the same symbolic batch size
        ids = torch.zeros_like(x, dtype=torch.long)
        w = torch.randn(3, 4)  # a (V, H) weight for the linear form
        n = x.shape[0]
        assert isinstance(n, torch.SymInt)
        results = {
            "smooth_l1_loss": ops.smooth_l1_loss(x, t, 0, 0.5),
            "smooth_l1_loss_backward": ops.smooth_l1_loss_backward(g, x, t, 0, 0.5),
            "smooth_l1_loss_backward.grad_input": ops.smooth_l1_loss_backward.grad_input(
                g, x, t, 0, 0.5, grad_input=torch.empty_like(x)),
            "l1_loss": ops.l1_loss(x, t, 0),
            "l1_loss_backward": ops.l1_loss_backward(g, x, t, 0),
            "l1_loss_backward.grad_input": ops.l1_loss_backward.grad_input(g, x, t, 0, grad_input=torch.empty_like(x)),
            "kl_div": ops.kl_div(x, t, 0),
            "kl_div_target_backward": ops.kl_div_target_backward(g, x, t, 0, False),
            "kl_div_target_backward.grad_target": ops.kl_div_target_backward.grad_target(
                g, x, t, 0, False, grad_target=torch.empty_like(t)),
            "huber_loss": ops.huber_loss(x, t, 0, 0.5),
            "huber_loss_backward": ops.huber_loss_backward(g, x, t, 0, 0.5),
            "huber_loss_backward.out": ops.huber_loss_backward.out(g, x, t, 0, 0.5, grad_input=torch.empty_like(x)),
            "mse_loss": ops.mse_loss(x, t, 0),
            "mse_loss_backward": ops.mse_loss_backward(g, x, t, 0),
            "mse_loss_backward.grad_input": ops.mse_loss_backward.grad_input(g, x, t, 0, grad_input=torch.empty_like(x)),
            "generalized_jsd_loss": ops.generalized_jsd_loss(x, t, None, 0, 0.5, 1.0, 1.0, 1.0, None, None, -100),
            "generalized_jsd_loss_backward": ops.generalized_jsd_loss_backward(
                g, x, t, None, 0, 0.5, 1.0, 1.0, 1.0, None, None, -100, [True, True])[1],
            "_generalized_jsd_loss_and_grads": ops._generalized_jsd_loss_and_grads(
                x, t, None, 2, 0.5, 1.0, 1.0, 1.0, None, None, -100, [True, True])[2],
            # a teacher over a support of K = 4 entries, without the tail: 'none' is (n, K), the teacher's gradient too
            "sparse_jsd_loss": ops.sparse_jsd_loss(x, t, ids, None, None, 0, 0.5, 1.0, False, 1.0, None, -100),
            "sparse_jsd_loss_backward": ops.sparse_jsd_loss_backward(
                g, x, t, ids, None, None, 0, 0.5, 1.0, False, 1.0, None, -100, [True, True])[1],
            "_sparse_jsd_loss_and_grads": ops._sparse_jsd_loss_and_grads(
                x, t, ids, None, None, 2, 0.5, 1.0, False, 1.0, None, -100, [True, True])[2],
            # the student's input gradient: (n, 4), as the input
            "_fused_linear_jsd_loss_and_grads": ops._fused_linear_jsd_loss_and_grads(
                x, w, t, w, None, None, None, "sum", 0.5, 1.0, 1.0, 1.0, None, None, -100, 0.0, 1.0,
                None, False, False, [True] * 6)[3],
            # the served teacher's log-probabilities' gradient: (n, K), as they are
            "_fused_linear_sparse_jsd_loss_and_grads": ops._fused_linear_sparse_jsd_loss_and_grads(
                x, w, t, ids, None, None, None, "sum", 0.5, 1.0, False, 1.0, None, -100, 0.0, 1.0, None, False, False,
                [True] * 6)[6],
        }
        linear = ops.fused_linear_jsd_loss(x, w, t, w)
        # with the entropy: one float32 per row, of the symbolic batch size
        entropy = ops.fused_linear_jsd_loss(x, w, t, w, None, None, None, "sum", 0.5, 1.0, 1.0, 1.0, None, None,
                                            -100, 0.0, 1.0, None, False, True)[3]
        mean = ops.l1_loss(x, t, 1)
    sparse_linear = ops.fused_linear_sparse_jsd_loss(x, w, t, ids)
    assert len(results) + 2 == len(SCHEMAS)
    assert [r.shape for r in linear[:3]] == [()] * 3 and all(isinstance(r, FakeTensor) for r in linear)
    assert linear[3].shape == (0,)
    assert [r.shape for r in sparse_linear[:3]] == [()] * 3 and sparse_linear[3].shape == (0,)
    assert entropy.dtype == torch.float32 and entropy.dim() == 1 and str(entropy.shape[0]) == str(n)
    for name, r in results.items():
        assert isinstance(r, FakeTensor) and r.dtype == torch.float32, name
        assert isinstance(r.shape[0], torch.SymInt) and str(r.shape[0]) == str(n) and r.shape[1] == 4, (name, r.shape)
    assert mean.shape == ()


# ---- every op has its block in every per-op table (docs/adding_a_loss.md) ----


def _registered_ops() -> set[str]:
    """Every op and overload registered under npu_loss, as 'name' or 'name.overload'."""
    return {
        name.removeprefix("npu_loss::")
        for name in torch._C._dispatch_get_all_op_names()
        if name.startswith("npu_loss::")
    }


def _functional(ops: set[str]) -> set[str]:
    return {op for op in ops if "." not in op}


def _sample_ops() -> set[str]:
    import samples
    import test_distillation
    import test_fused_linear_jsd
    import test_fused_sparse_jsd
    import test_sparse_jsd

    return (
        set(samples.LOSSES)
        | {samples.BACKWARD_OP[loss] for loss in samples.LOSSES}
        | {f"{samples.BACKWARD_OP[loss]}.{samples.OUT_OVERLOAD[loss]}" for loss in samples.LOSSES}
        | set(test_distillation.OPS)
        | set(test_fused_linear_jsd.OPS)
        | set(test_sparse_jsd.OPS)
        | set(test_fused_sparse_jsd.OPS)
    )


def _dtensor_ops() -> set[str]:
    from npu_loss_ops._dtensor import LOSSES, ROW_LOSSES

    return {name for row in LOSSES for name in (row.forward, row.backward, f"{row.backward}.{row.backward_out}")} | {
        name for row in ROW_LOSSES for name in (row.forward, row.with_grads, row.backward)} | {
        name for row in ROW_LOSSES if row.linear for name in (row.linear.forward, row.linear.with_grads)}


def _chip_path_ops() -> set[str]:
    """The ops with chip-path rows; a row loss's forward with gradients takes its forward's."""
    from npu_loss_ops import _C

    ops = {row["op"] for row in _C._chip_paths()}
    return ops | {d["with_grads"] for d in _C._losses() if d["kind"] == "rows" and d["forward"] in ops} | {
        d["linear"]["with_grads"] for d in _C._losses() if d["kind"] == "rows" and d["linear"]
        and d["linear"]["forward"] in ops}


def _per_op_tables() -> dict[str, set[str]]:
    """Each per-op table, as the set of ops (or functional ops) it has a block for."""
    from npu_loss_ops import _C

    return {
        "schemas (SCHEMAS here, docs/semantics.md)": {s.split("(")[0].removeprefix("npu_loss::") for s in SCHEMAS},
        "declarations (csrc/losses.h)": {
            schema.split("(")[0] for row in _C._losses() for schema in row["schemas"]
        },
        "derivatives blocks (csrc/autograd/derivatives.cpp)": set(_C._differentiable_ops()),
        "NPU path rows (csrc/losses.h)": _chip_path_ops(),
        "sample families (tests/samples.py, tests/test_distillation.py)": _sample_ops(),
        "DTensor rows (npu_loss_ops/_dtensor.py)": _dtensor_ops(),
    }


def test_the_tables_name_only_registered_ops():
    """The registry is read, not assumed: the eighteen ops are there, and no table names an op that is not."""
    registered = _registered_ops()
    assert {s.split("(")[0].removeprefix("npu_loss::") for s in SCHEMAS} <= registered
    for table, ops in _per_op_tables().items():
        assert ops, f"{table} is empty"
        assert ops <= registered, f"{table} names ops that are not registered: {sorted(ops - registered)}"


@pytest.mark.parametrize("op", sorted(_registered_ops()))
def test_every_registered_op_has_a_block_in_every_table(op):
    """A loss added with one block missing fails here, naming the op and the table. Derivatives and
    chip paths are per functional op (an out= overload has neither autograd nor a path of its own)."""
    tables = _per_op_tables()
    per_functional = ("derivatives blocks", "NPU path rows")
    missing = [
        table
        for table, ops in tables.items()
        if ("." not in op or not table.startswith(per_functional)) and op not in ops
    ]
    assert not missing, f"{op} has no block in: {missing}"


def _aten_twins() -> set[str]:
    """The registered ops that have an ATen overload of the same name and schema."""
    twins = set()
    for op in _registered_ops():
        name, _, overload = op.partition(".")
        try:
            aten = getattr(getattr(torch.ops.aten, name), overload or "default")
        except (AttributeError, RuntimeError):
            continue
        ours = getattr(getattr(torch.ops.npu_loss, name), overload or "default")
        if str(aten._schema).removeprefix("aten::") == str(ours._schema).removeprefix("npu_loss::"):
            twins.add(op)
    return twins


def test_enable_routes_every_op_that_has_an_aten_twin():
    """enable() (csrc/enable/aten_kernels.cpp) routes exactly the ATen overloads the package has an op of the same schema
    for: a new loss with ATen's schemas and no routing block fails here."""
    from npu_loss_ops import _C

    routed = {overload for _, overload in _C._aten_routes()}
    twins = _aten_twins()
    assert {"smooth_l1_loss", "huber_loss_backward.out", "kl_div", "mse_loss_backward.grad_input"} <= twins  # the lookup works
    assert routed == twins, f"twins not routed: {sorted(twins - routed)}; routed, not twins: {sorted(routed - twins)}"
