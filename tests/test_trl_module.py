"""npu_loss_ops.trl without trl: chunked_divergence_loss (TRL 1.16's _chunked_divergence_loss, argument for
argument) against a float64 restatement of TRL's semantics on the logits made whole; and patch() on stand-in trl
modules (the swap, the counter, the restore, nesting, the errors). The same functions against TRL's own, in its
own venv, are tests/with_trl."""
from __future__ import annotations

import contextlib
import inspect
import itertools
import sys
import types

import pytest
import torch

import npu_loss_ops
import npu_loss_ops.trl as ntrl
from reference import student_entropy, transformed, trl_generalized_jsd_loss

SIGNATURE = ("(student_hidden_states, teacher_hidden_states, student_lm_head_weight, teacher_lm_head_weight, "
             "completion_mask, beta, num_items_in_batch=None, student_lm_head_bias=None, teacher_lm_head_bias=None, "
             "student_logit_scale=1.0, teacher_logit_scale=1.0, student_final_logit_softcapping=None, "
             "teacher_final_logit_softcapping=None, temperature=1.0)")


def reference(hs, ht, ws, wt, mask, beta, num_items=None, bs=None, bt=None, s_scale=1.0, t_scale=1.0,
              s_cap=None, t_cap=None, temperature=1.0):
    """TRL 1.16's _chunked_divergence_loss on whole logits in float64: each side's logits transformed
    (reference.transformed), the per-token divergence of reference.trl_generalized_jsd_loss ('none', summed over
    the vocabulary) summed over the kept tokens and divided by max(kept, 1) or num_items; the student's entropy
    (reference.student_entropy) summed over the kept tokens; the kept count. Autograd gives the student's
    gradients."""
    def side(h, w, b, scale, cap):
        z = h.reshape(-1, h.size(-1)) @ w.T
        return transformed(z if b is None else z + b, scale, cap)
    zs, zt = side(hs, ws, bs, s_scale, s_cap), side(ht.detach(), wt.detach(), None if bt is None else bt.detach(),
                                                     t_scale, t_cap)
    per_token = trl_generalized_jsd_loss(zs, zt, None, beta, temperature, "none").sum(-1)
    valid = mask.reshape(-1) != 0
    n_valid = valid.sum()
    total = per_token.masked_fill(~valid, 0).sum()
    loss = total / n_valid.clamp(min=1) if num_items is None else total / num_items
    labels = torch.where(valid, 0, -100)
    return loss, student_entropy(zs, labels, temperature).sum(), n_valid


def _inputs(dtype, b=2, k=5, hs=12, ht=20, vocab=53, bias=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    t = lambda *s, scale=1.0: (torch.randn(*s, generator=gen, dtype=torch.float64) * scale).to(dtype)  # noqa: E731
    x = dict(hs=t(b, k, hs, scale=0.7), ht=t(b, k, ht, scale=0.7), ws=t(vocab, hs), wt=t(vocab, ht),
             bs=t(vocab) if bias else None, bt=t(vocab) if bias else None)
    mask = torch.randint(0, 2, (b, k), generator=gen)
    mask[0, 0] = 1
    return x, mask


def _leaves(x):
    return {name: None if v is None else v.clone().requires_grad_() for name, v in x.items()}


def _call(fn, x, mask, beta, num_items, s_scale, t_scale, s_cap, t_cap, temperature):
    return fn(x["hs"], x["ht"], x["ws"], x["wt"], mask, beta, num_items, x["bs"], x["bt"], s_scale, t_scale, s_cap,
              t_cap, temperature)


def _student_grads(x, loss):
    wanted = [x[n] for n in ("hs", "ws", "bs") if x[n] is not None]
    return torch.autograd.grad(loss, wanted)


CASES = list(itertools.product([0.0, 0.3, 0.5, 1.0], [1.0, 2.0], [(1.0, 1.0, None, None), (0.5, 1.0, None, 6.0),
                                                                  (1.0, 2.0, 3.0, None), (1.5, 0.75, 4.0, 5.0)]))


def test_signature_is_trls():
    parameters = inspect.signature(ntrl.chunked_divergence_loss).parameters.values()
    assert "(" + ", ".join(p.name + ("" if p.default is p.empty else f"={p.default!r}") for p in parameters) + ")" \
        == SIGNATURE
    assert all(p.kind == p.POSITIONAL_OR_KEYWORD for p in parameters)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("beta,temperature,transform", CASES, ids=str)
def test_matches_the_reference(dtype, beta, temperature, transform):
    x, mask = _inputs(dtype)
    got_x, want_x = _leaves(x), _leaves({k: None if v is None else v.double() for k, v in x.items()})
    loss, entropy, n_valid = _call(ntrl.chunked_divergence_loss, got_x, mask, beta, None, *transform, temperature)
    want_loss, want_entropy, want_n = _call(reference, want_x, mask, beta, None, *transform, temperature)
    rtol = 1e-9 if dtype == torch.float64 else 2e-5
    assert loss.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert entropy.dtype == torch.float32 and n_valid.dtype == torch.int64
    assert not entropy.requires_grad and n_valid.item() == want_n.item()
    torch.testing.assert_close(loss.double(), want_loss.detach(), rtol=rtol, atol=rtol)
    torch.testing.assert_close(entropy.double(), want_entropy, rtol=max(rtol, 1e-6), atol=1e-6)
    got_grads, want_grads = _student_grads(got_x, loss), _student_grads(want_x, want_loss)
    for name, a, b in zip(("hidden", "weight", "bias"), got_grads, want_grads):
        scale = max(float(b.abs().max()), 1e-30)
        torch.testing.assert_close(a.double(), b, rtol=rtol * 10, atol=rtol * 10 * scale, msg=name)


@pytest.mark.parametrize("num_items", [None, 7, torch.tensor(3.0)], ids=["none", "int", "tensor"])
@pytest.mark.parametrize("bias", [True, False])
def test_masks_biases_and_num_items(num_items, bias):
    x, mask = _inputs(torch.float64, bias=bias, seed=1)
    for m in (mask, torch.zeros_like(mask), torch.ones_like(mask, dtype=torch.bool)):
        got_x, want_x = _leaves(x), _leaves(x)
        got = _call(ntrl.chunked_divergence_loss, got_x, m, 0.5, num_items, 1.0, 1.0, None, None, 1.0)
        want = _call(reference, want_x, m, 0.5, num_items, 1.0, 1.0, None, None, 1.0)
        torch.testing.assert_close(got[0], want[0].detach(), rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(got[1].double(), want[1], rtol=1e-6, atol=1e-6)  # float32 entropy
        assert got[2].item() == want[2].item()
        if int(m.sum()) == 0:
            assert got[0].item() == 0 and got[1].item() == 0 and got[2].item() == 0
        else:
            for a, b in zip(_student_grads(got_x, got[0]), _student_grads(want_x, want[0])):
                torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-8 * float(b.abs().max()))


def test_only_the_student_gets_gradients():
    x, mask = _inputs(torch.float32)
    leaves = _leaves(x)
    loss, _, _ = _call(ntrl.chunked_divergence_loss, leaves, mask, 0.5, None, 1.0, 1.0, None, None, 1.0)
    loss.backward()
    assert all(leaves[n].grad is not None for n in ("hs", "ws", "bs"))
    assert all(leaves[n].grad is None for n in ("ht", "wt", "bt"))


def test_autocast_projects_in_its_dtype():
    """Under autocast the package projects in autocast's dtype (TRL's _compute_dtype): the call equals one on
    the inputs cast to bfloat16, and the gradients reach the float32 leaves in float32."""
    x, mask = _inputs(torch.float32, vocab=64)
    leaves = _leaves(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, entropy, _ = _call(ntrl.chunked_divergence_loss, leaves, mask, 0.5, None, 1.0, 1.0, None, None, 1.0)
    loss.backward()
    cast = _leaves({k: None if v is None else v.to(torch.bfloat16) for k, v in x.items()})
    want_loss, want_entropy, _ = _call(ntrl.chunked_divergence_loss, cast, mask, 0.5, None, 1.0, 1.0, None, None,
                                       1.0)
    want_loss.backward()
    assert torch.equal(loss, want_loss) and torch.equal(entropy, want_entropy)
    assert leaves["hs"].grad.dtype == torch.float32
    torch.testing.assert_close(leaves["hs"].grad, cast["hs"].grad.float())


# ---- patch() on stand-in trl modules -------------------------------------------------------------------------


def _trl_originals():
    def chunked(*args, **kwargs):
        return "trl's chunked"

    def gkd(*args, **kwargs):
        return "trl's gkd"
    return chunked, gkd


@pytest.fixture
def fake_trl(monkeypatch):
    """Modules named as TRL 1.16's, holding stand-ins for the two functions, and TRL's gather context, which
    records what it was entered with."""
    chunked, gkd = _trl_originals()
    gathered = []

    @contextlib.contextmanager
    def maybe_gather_lm_head_ctx(*params):
        gathered.append(params)
        yield

    modules = {}
    for name in ("trl", "trl.trainer", "trl.trainer.distillation_trainer", "trl.trainer.utils", "trl.experimental",
                 "trl.experimental.gkd", "trl.experimental.gkd.gkd_trainer", "trl.experimental.server_distillation",
                 "trl.experimental.server_distillation.server_distillation_trainer"):
        modules[name] = types.ModuleType(name)
        monkeypatch.setitem(sys.modules, name, modules[name])
    modules["trl"].__version__ = "1.16.0"
    modules["trl.trainer.distillation_trainer"]._chunked_divergence_loss = chunked
    modules["trl.trainer.utils"].maybe_gather_lm_head_ctx = maybe_gather_lm_head_ctx
    modules["trl.experimental.gkd.gkd_trainer"].GKDTrainer = type("GKDTrainer", (), {"generalized_jsd_loss":
                                                                                     staticmethod(gkd)})

    def server(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return "trl's server compute_loss"
    modules["trl.experimental.server_distillation.server_distillation_trainer"].ServerDistillationTrainer = type(
        "ServerDistillationTrainer", (), {"compute_loss": server})
    yield types.SimpleNamespace(modules=modules, chunked=chunked, gkd=gkd, server=server, gathered=gathered)
    assert ntrl._holders == 0, "a test left the swap installed"


SERVER_MODULE = "trl.experimental.server_distillation.server_distillation_trainer"


def _current(fake):
    return (fake.modules["trl.trainer.distillation_trainer"]._chunked_divergence_loss,
            fake.modules["trl.experimental.gkd.gkd_trainer"].GKDTrainer.generalized_jsd_loss,
            vars(fake.modules[SERVER_MODULE].ServerDistillationTrainer)["compute_loss"])


def test_patch_swaps_counts_and_restores(fake_trl):
    handle = npu_loss_ops.trl.patch()
    try:
        chunked, gkd, server = _current(fake_trl)
        assert chunked.__wrapped__ is ntrl.chunked_divergence_loss
        assert gkd.__wrapped__ is npu_loss_ops.generalized_jsd_loss  # a staticmethod: no self
        assert server is ntrl.server_compute_loss  # a plain method: it gets the trainer as self
        before = dict(ntrl.call_counts)
        x, mask = _inputs(torch.float32)
        chunked(x["hs"], x["ht"], x["ws"], x["wt"], mask, 0.5)
        student, teacher = torch.randn(3, 7), torch.randn(3, 7)
        fake_trl.modules["trl.experimental.gkd.gkd_trainer"].GKDTrainer().generalized_jsd_loss(student, teacher)
        assert ntrl.call_counts["chunked_divergence_loss"] == before.get("chunked_divergence_loss", 0) + 1
        assert ntrl.call_counts["generalized_jsd_loss"] == before.get("generalized_jsd_loss", 0) + 1
        # TRL's gather context was entered for both heads, with their weights and biases.
        assert len(fake_trl.gathered) == 2 and fake_trl.gathered[0][0] is x["ws"]
    finally:
        handle.restore()
    assert _current(fake_trl) == (fake_trl.chunked, fake_trl.gkd, fake_trl.server)
    handle.restore()  # a second restore does nothing
    assert _current(fake_trl) == (fake_trl.chunked, fake_trl.gkd, fake_trl.server)


def test_patch_is_idempotent_and_nests(fake_trl):
    with npu_loss_ops.trl.patch() as outer:
        swapped = _current(fake_trl)
        with npu_loss_ops.trl.patch() as inner:
            assert _current(fake_trl) == swapped  # not wrapped twice
            assert inner.active and outer.active
        assert _current(fake_trl) == swapped  # the outer handle still holds it
        assert not inner.active
    assert _current(fake_trl) == (fake_trl.chunked, fake_trl.gkd, fake_trl.server)
    assert not outer.active


def test_patch_names_a_missing_attribute(fake_trl):
    del fake_trl.modules["trl.trainer.distillation_trainer"]._chunked_divergence_loss
    with pytest.raises(AttributeError, match=r"trl\.trainer\.distillation_trainer\._chunked_divergence_loss is "
                                             r"missing in this trl \(trl 1\.16\.0\)"):
        npu_loss_ops.trl.patch()
    # Nothing was replaced: the check comes before the swap.
    assert fake_trl.modules["trl.experimental.gkd.gkd_trainer"].GKDTrainer.generalized_jsd_loss is fake_trl.gkd


def test_patch_names_a_missing_method(fake_trl):
    delattr(fake_trl.modules[SERVER_MODULE].ServerDistillationTrainer, "compute_loss")
    with pytest.raises(AttributeError, match=r"server_distillation_trainer\.ServerDistillationTrainer\.compute_loss "
                                             r"is missing"):
        npu_loss_ops.trl.patch()
    assert fake_trl.modules["trl.trainer.distillation_trainer"]._chunked_divergence_loss is fake_trl.chunked


def test_patch_names_a_missing_class(fake_trl):
    del fake_trl.modules["trl.experimental.gkd.gkd_trainer"].GKDTrainer
    with pytest.raises(AttributeError, match=r"trl\.experimental\.gkd\.gkd_trainer\.GKDTrainer is missing"):
        npu_loss_ops.trl.patch()
    assert fake_trl.modules["trl.trainer.distillation_trainer"]._chunked_divergence_loss is fake_trl.chunked


def test_patch_without_trl(monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)  # import trl raises ImportError
    with pytest.raises(ImportError, match=r"npu_loss_ops\.trl\.patch: cannot import trl\.trainer\."
                                          r"distillation_trainer .*pip install trl==1\.16\.0"):
        npu_loss_ops.trl.patch()
    assert ntrl._holders == 0


def test_module_imports_without_trl():
    import subprocess
    code = ("import sys; sys.modules['trl'] = None; import npu_loss_ops.trl as t; "
            "print(t.chunked_divergence_loss.__name__, 'trl' in sys.modules and sys.modules['trl'] is None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["chunked_divergence_loss", "True"]


FSDP2_HEADS = r"""
import os, sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
sys.path.insert(0, sys.argv[1])
from test_trl_module import _inputs
import npu_loss_ops.trl as ntrl

dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,))
x, mask = _inputs(torch.float32)
calls = []
full = DTensor.full_tensor
DTensor.full_tensor = lambda self, *a, **k: calls.append(1) or full(self, *a, **k)
ws = distribute_tensor(x["ws"], mesh, [Shard(0)]).requires_grad_()
bs = distribute_tensor(x["bs"], mesh, [Shard(0)]).requires_grad_()
wt = distribute_tensor(x["wt"], mesh, [Shard(0)])
loss, entropy, n = ntrl.chunked_divergence_loss(x["hs"], x["ht"], ws, wt, mask, 0.5, student_lm_head_bias=bs,
                                               teacher_lm_head_bias=x["bt"])
loss.backward()
plain_ws, plain_bs = x["ws"].clone().requires_grad_(), x["bs"].clone().requires_grad_()
want = ntrl.chunked_divergence_loss(x["hs"], x["ht"], plain_ws, x["wt"], mask, 0.5, student_lm_head_bias=plain_bs,
                                    teacher_lm_head_bias=x["bt"])
want[0].backward()
assert torch.equal(loss, want[0]) and torch.equal(entropy, want[1]), (loss, want)
assert isinstance(ws.grad, DTensor) and torch.equal(ws.grad.full_tensor(), plain_ws.grad)
assert torch.equal(bs.grad.full_tensor(), plain_bs.grad)
print("full_tensor calls", len(calls) - 2)  # the two above, on the gradients
dist.destroy_process_group()
"""


def test_fsdp2_heads_are_made_whole_once_per_head(tmp_path):
    """DTensor heads (FSDP2's Shard(0), one process over gloo): full_tensor() once per weight and bias given as
    a DTensor, as TRL does, the values and the DTensor weight's gradient those of plain tensors."""
    import subprocess
    out = subprocess.run([sys.executable, "-c", FSDP2_HEADS, str(__import__("pathlib").Path(__file__).parent),
                          str(tmp_path / "store")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-1] == "3"  # the student's weight and bias, the teacher's weight
