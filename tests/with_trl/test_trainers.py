"""TRL 1.16's own trainers, each trained twice from the same seed, once with TRL's loss and once inside
``npu_loss_ops.trl.patch()``: the per-step losses and gradient norms TRL logs agree within float32 rounding, the
trained weights within what AdamW makes of it (WEIGHT_ATOL), and the package's function ran in the patched run
only, once per micro-batch.

- ``trl.DistillationTrainer``: on-policy generation by the student (sampled, TRL's defaults), the teacher's
  distribution matched by ``_chunked_divergence_loss`` (patched: ``npu_loss_ops.trl.chunked_divergence_loss``).
- ``trl.experimental.gkd.GKDTrainer``: with TRL's defaults (``lmbda=0.5``: some steps on the student's sampled
  completions, the others on the dataset's), ``GKDTrainer.generalized_jsd_loss`` on the full logits (patched:
  ``npu_loss_ops.generalized_jsd_loss``).
- ``trl.experimental.server_distillation.ServerDistillationTrainer``: the teacher served, here by a stand-in for
  TRL's ``VLLMClient`` (an in-process function that serves the tiny teacher's top-k log-probabilities and the
  actual tokens', as vLLM's ``get_sequence_logprobs`` returns them: no network), over each support TRL builds
  (the teacher's top-k at beta 0, with and without the tail; top-1 and the sampled token at 0 < beta < 1; the
  sampled token at 1), ``compute_loss`` patched (``npu_loss_ops.trl.server_compute_loss``).

The models are tiny Qwen2 causal LMs made from a config with fixed seeds (a student of width 64 and a teacher of
width 96 over one 2,048-token vocabulary), the tokenizer a word-level one made here with a chat template, and the
prompts are made in code: nothing is downloaded (conftest.py puts the Hugging Face libraries offline). Training
runs in float32 on the CPU (``bf16=False``: TRL's configs default to bf16 autocast in the models' forward),
without dataloader workers or reporting, with TRL's default gradient checkpointing. Both runs of a trainer seed everything the same way before the trainer is made, so
their sampled completions are the same as long as their weights agree to rounding.

Each run takes 0.3 to 3 seconds on two cores; the terminal summary gives the differences seen.
"""
from __future__ import annotations

import contextlib
import math
import random
from collections import Counter

import pytest
import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, set_seed

import npu_loss_ops
import npu_loss_ops.trl
import trl.trainer.distillation_trainer as distillation_module
from trl import DistillationConfig, DistillationTrainer
import trl.generation.vllm_client as vllm_client_module
from trl.experimental.gkd import GKDConfig, GKDTrainer
from trl.experimental.server_distillation import ServerDistillationConfig, ServerDistillationTrainer

SEED = 1234
STEPS = 4
BATCH = 2
SPECIAL = ["<pad>", "<eos>", "<unk>", "<|user|>", "<|assistant|>"]
VOCAB = 2048
WORDS = [f"w{i}" for i in range(VOCAB - len(SPECIAL))]
# The models declare these words end-of-sequence ids besides <eos> (as Llama 3 declares its end-of-turn tokens), an
# eighth of the vocabulary: a random model then stops its 8-token completions at varied lengths, and the trainers
# pad and mask them (with <eos> alone almost every completion runs to the limit).
STOP_WORDS = WORDS[::8]
# Renders "<|user|> w1 w2 <eos> <|assistant|> w3 <eos> " (a prompt ends with "<|assistant|> "): whole words, so the
# word-level tokenizer splits it on whitespace, and a prompt's tokens are a prefix of its conversation's.
CHAT_TEMPLATE = (
    "{%- for message in messages %}<|{{ message['role'] }}|> {{ message['content'] }} <eos> {% endfor %}"
    "{%- if add_generation_prompt %}<|assistant|> {% endif %}"
)
# The logged losses and gradient norms: float32 rounding (the package's kernels and TRL's composite sum in other
# orders).
RTOL, ATOL = 1e-4, 1e-6
# The trained weights: AdamW (lr 1e-3) moves an element by lr * m / (sqrt(v) + 1e-8), so where a gradient element is
# about 1e-10 (cancellation), a rounding difference there of 1e-10 moves it by up to 1e-5 a step; a wrong
# gradient moves elements by about lr a step.
WEIGHT_ATOL = 1e-4


def make_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {token: i for i, token in enumerate(SPECIAL + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                        unk_token="<unk>", padding_side="left", truncation_side="left",
                                        model_max_length=128)
    tokenizer.chat_template = CHAT_TEMPLATE
    assert len(tokenizer) == VOCAB
    return tokenizer


def make_model(tokenizer, hidden: int, intermediate: int, seed: int) -> Qwen2ForCausalLM:
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=False, initializer_range=0.15, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, *tokenizer.convert_tokens_to_ids(STOP_WORDS)]
    return model.float()


def student_and_teacher(tokenizer):
    return make_model(tokenizer, 64, 128, seed=1), make_model(tokenizer, 96, 192, seed=2)


def _text(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def prompt_dataset(n: int = STEPS * BATCH) -> Dataset:
    rng = random.Random(7)
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": _text(rng, 3, 6)}] for _ in range(n)]})


def conversation_dataset(n: int = STEPS * BATCH) -> Dataset:
    rng = random.Random(8)
    return Dataset.from_dict({"messages": [
        [{"role": "user", "content": _text(rng, 3, 6)}, {"role": "assistant", "content": _text(rng, 2, 6)}]
        for _ in range(n)]})


def common_args(tmp_path, name: str) -> dict:
    return dict(output_dir=str(tmp_path / name), max_steps=STEPS, per_device_train_batch_size=BATCH,
                learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, bf16=False,
                fp16=False, dataloader_num_workers=0, seed=SEED, data_seed=SEED, disable_tqdm=True)


def make_distillation_trainer(tmp_path, name: str, **overrides) -> DistillationTrainer:
    tokenizer = make_tokenizer()
    student, teacher = student_and_teacher(tokenizer)
    args = DistillationConfig(**{**common_args(tmp_path, name), "max_completion_length": 8, **overrides})
    return DistillationTrainer(model=student, teacher_model=teacher, args=args, train_dataset=prompt_dataset(),
                               processing_class=tokenizer)


def make_gkd_trainer(tmp_path, name: str, **overrides) -> GKDTrainer:
    tokenizer = make_tokenizer()
    student, teacher = student_and_teacher(tokenizer)
    args = GKDConfig(**{**common_args(tmp_path, name), "max_new_tokens": 8, "max_length": 64, **overrides})
    return GKDTrainer(model=student, teacher_model=teacher, args=args, train_dataset=conversation_dataset(),
                      processing_class=tokenizer)


# The functions the package swaps into TRL, by their names in npu_loss_ops.trl.call_counts.
SWAPPED = ("chunked_divergence_loss", "generalized_jsd_loss", "server_compute_loss")


class StandInTeacherServer:
    """TRL's VLLMClient as ServerDistillationTrainer uses it, served in-process by a tiny teacher: for each sequence
    (prompt + completion token ids) and its prompt length, per completion token the teacher's top-k
    log-probabilities at `temperature` (sorted, descending) with their ids, and the actual token's log-probability,
    in the lists vLLM's get_sequence_logprobs returns."""

    teacher: Qwen2ForCausalLM | None = None

    def __init__(self, base_url: str | None = None, connection_timeout: float = 0.0, **_: object) -> None:
        self.base_url = base_url

    def get_sequence_logprobs(self, sequences, prompt_lengths, top_logprobs=100, temperature=1.0, **_: object):
        assert self.teacher is not None
        out: dict[str, list] = {"logprobs": [], "logprob_token_ids": [], "actual_logprobs": [], "actual_token_ids": []}
        with torch.no_grad():
            for sequence, prompt_length in zip(sequences, prompt_lengths, strict=True):
                ids = torch.tensor(sequence).unsqueeze(0)
                log_p = torch.log_softmax(self.teacher(input_ids=ids).logits[0].float() / temperature, -1)
                # Position p's token is predicted by the logits at p - 1.
                rows = log_p[prompt_length - 1:len(sequence) - 1]
                tokens = ids[0, prompt_length:]
                top, top_ids = rows.topk(top_logprobs, -1)
                actual = rows.gather(-1, tokens.unsqueeze(-1))
                out["logprobs"].append(top.tolist())
                out["logprob_token_ids"].append(top_ids.tolist())
                out["actual_logprobs"].append(actual.tolist())
                out["actual_token_ids"].append(tokens.unsqueeze(-1).tolist())
        return out


def make_server_trainer(tmp_path, name: str, monkeypatch, **overrides) -> ServerDistillationTrainer:
    tokenizer = make_tokenizer()
    student, teacher = student_and_teacher(tokenizer)
    monkeypatch.setattr(vllm_client_module, "VLLMClient", StandInTeacherServer)
    monkeypatch.setattr(StandInTeacherServer, "teacher", teacher)
    args = ServerDistillationConfig(**{**common_args(tmp_path, name), "max_completion_length": 8,
                                       "teacher_model_server_url": "http://stand-in", **overrides})
    return ServerDistillationTrainer(model=student, args=args, train_dataset=prompt_dataset(),
                                     processing_class=tokenizer)


def train(make, patched: bool, monkeypatch) -> dict:
    """One run from the same seeds: the trainer is made, then trained (inside patch() when `patched`). Returns
    the logged losses and gradient norms, the trained weights, how call_counts moved, and how many of GKD's
    steps generated on-policy."""
    set_seed(SEED)
    trainer = make()
    on_policy = []
    generate = GKDTrainer.generate_on_policy_outputs

    def counted_generate(*args, **kwargs):
        on_policy.append(1)
        return generate(*args, **kwargs)

    before = Counter(npu_loss_ops.trl.call_counts)
    with monkeypatch.context() as m, npu_loss_ops.trl.patch() if patched else contextlib.nullcontext():
        m.setattr(GKDTrainer, "generate_on_policy_outputs", staticmethod(counted_generate))
        trainer.train()
    after = Counter(npu_loss_ops.trl.call_counts)
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    return {
        "loss": [entry["loss"] for entry in logged],
        "grad_norm": [entry["grad_norm"] for entry in logged],
        "weights": {k: v.detach().clone() for k, v in trainer.model.state_dict().items()},
        "calls": {name: after[name] - before[name] for name in SWAPPED},
        "steps": trainer.state.global_step,
        "on_policy_steps": len(on_policy),
        "completion_lengths": [(entry.get("completions/min_length"), entry.get("completions/max_length"))
                               for entry in logged],
    }


def max_difference(a: list[float], b: list[float]) -> str:
    """The largest absolute and relative differences, as text."""
    pairs = list(zip(a, b, strict=True))
    absolute = max(abs(x - y) for x, y in pairs)
    relative = max(abs(x - y) / max(abs(x), 1e-30) for x, y in pairs)
    return f"{absolute:.3g} (relative {relative:.3g})"


def check_runs(plain: dict, patched: dict, counted: str, expected_calls: int, label: str, trl_report) -> None:
    for run in (plain, patched):
        assert run["steps"] == STEPS
        assert len(run["loss"]) == STEPS, run["loss"]
        assert all(math.isfinite(x) and x > 0 for x in run["loss"]), run["loss"]
    assert len(set(plain["loss"])) > 1, f"{label}: the loss did not change over the steps: {plain['loss']}"

    # The package's function ran in the patched run only, once per micro-batch; TRL's in the plain one.
    assert all(n == 0 for n in plain["calls"].values()), f"{label}: the plain run called the package: {plain['calls']}"
    assert patched["calls"][counted] == expected_calls, f"{label}: {patched['calls']}"
    assert all(n == 0 for name, n in patched["calls"].items() if name != counted), f"{label}: {patched['calls']}"

    loss_diff = max_difference(plain["loss"], patched["loss"])
    norm_diff = max_difference(plain["grad_norm"], patched["grad_norm"])
    weight_diff = max((plain["weights"][k] - patched["weights"][k]).abs().max().item() for k in plain["weights"])
    trl_report.append(
        f"{label}: {STEPS} steps, {expected_calls} loss calls; losses {['%.6f' % x for x in plain['loss']]}; "
        f"max |loss diff| {loss_diff}, max |grad_norm diff| {norm_diff}, max |weight diff| {weight_diff:.3g}"
        + (f"; completion lengths (min, max) per step {plain['completion_lengths']}"
           if counted != "generalized_jsd_loss" else f"; {plain['on_policy_steps']} steps on-policy"))
    for key in ("loss", "grad_norm"):
        for step, (x, y) in enumerate(zip(plain[key], patched[key], strict=True), start=1):
            assert math.isclose(x, y, rel_tol=RTOL, abs_tol=ATOL), (
                f"{label}: step {step}'s {key} differs: TRL {x!r}, npu_loss_ops {y!r}\n"
                f"TRL: {plain[key]}\nnpu_loss_ops: {patched[key]}")
    assert weight_diff <= WEIGHT_ATOL, f"{label}: the trained weights differ by up to {weight_diff}"


def both_runs(make, monkeypatch) -> tuple[dict, dict]:
    return train(make, patched=False, monkeypatch=monkeypatch), train(make, patched=True, monkeypatch=monkeypatch)


def test_distillation_trainer(tmp_path, trl_report, monkeypatch):
    original = distillation_module._chunked_divergence_loss
    plain, patched = both_runs(lambda: make_distillation_trainer(tmp_path, "run"), monkeypatch)
    assert distillation_module._chunked_divergence_loss is original, "patch() did not restore TRL's loss"
    check_runs(plain, patched, "chunked_divergence_loss", STEPS, "DistillationTrainer (beta=1.0, sampled on-policy)",
               trl_report)
    # The completions stopped at varied lengths, so rows were padded and masked.
    assert plain["completion_lengths"] == patched["completion_lengths"]
    assert any(low != high for low, high in plain["completion_lengths"]), plain["completion_lengths"]


def test_distillation_trainer_jsd_accumulated(tmp_path, trl_report, monkeypatch):
    # beta=0.5 (the mixture's JSD rather than reverse KL), and two micro-batches per step: each divides its sum by
    # the generation batch's token count (num_items_in_batch).
    overrides = {"beta": 0.5, "gradient_accumulation_steps": 2, "per_device_train_batch_size": 1}
    plain, patched = both_runs(lambda: make_distillation_trainer(tmp_path, "run", **overrides), monkeypatch)
    check_runs(plain, patched, "chunked_divergence_loss", 2 * STEPS,
               "DistillationTrainer (beta=0.5, 2 micro-batches a step)", trl_report)


def test_gkd_trainer(tmp_path, trl_report, monkeypatch):
    original = GKDTrainer.__dict__["generalized_jsd_loss"]
    plain, patched = both_runs(lambda: make_gkd_trainer(tmp_path, "run"), monkeypatch)
    assert GKDTrainer.__dict__["generalized_jsd_loss"] is original, "patch() did not restore TRL's loss"
    check_runs(plain, patched, "generalized_jsd_loss", STEPS, "GKDTrainer (beta=0.5, lmbda=0.5)", trl_report)
    # lmbda=0.5 and this seed: some steps train on the student's completions, the others on the dataset's
    assert plain["on_policy_steps"] == patched["on_policy_steps"]
    assert 0 < plain["on_policy_steps"] < STEPS, plain["on_policy_steps"]


SERVER_CASES = [
    ({"beta": 0.0, "loss_top_k": 8}, "beta=0, the teacher's top-8, the tail"),
    ({"beta": 0.0, "loss_top_k": 8, "loss_add_tail": False}, "beta=0, the teacher's top-8, renormalized"),
    ({"beta": 0.5, "loss_top_k": 1}, "beta=0.5, top-1 and the sampled token, the tail"),
    ({"beta": 0.3, "loss_top_k": 1, "loss_add_tail": False}, "beta=0.3, top-1 and the sampled token, renormalized"),
    # (One entry renormalized is a point mass on both sides: a loss of 0, nothing to compare.)
    ({"beta": 1.0, "loss_top_k": 1}, "beta=1, the sampled token, the tail"),
    ({"beta": 0.0, "loss_top_k": 4, "gradient_accumulation_steps": 2, "per_device_train_batch_size": 1},
     "beta=0, top-4, 2 micro-batches a step"),
]


@pytest.mark.parametrize("overrides,label", SERVER_CASES, ids=[label for _, label in SERVER_CASES])
def test_server_distillation_trainer(tmp_path, trl_report, monkeypatch, overrides, label):
    original = ServerDistillationTrainer.__dict__["compute_loss"]
    plain, patched = both_runs(lambda: make_server_trainer(tmp_path, "run", monkeypatch, **overrides), monkeypatch)
    assert ServerDistillationTrainer.__dict__["compute_loss"] is original, "patch() did not restore TRL's loss"
    micro_batches = overrides.get("gradient_accumulation_steps", 1)
    check_runs(plain, patched, "server_compute_loss", STEPS * micro_batches, f"ServerDistillationTrainer ({label})",
               trl_report)
