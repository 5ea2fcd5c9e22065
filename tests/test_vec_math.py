"""The KL kernels' float log and exp, and the row kernels' tanh (the softcap), (csrc/cpu/vec_math.h) against
float64, on every instruction set this CPU runs: within 2 ulp of the exact value over the whole float range,
IEEE special cases, and results that do not depend on the other lanes of a vector (docs/cpu_kernels.md). The exhaustive sweep of every float is
opt-in (NPU_LOSS_OPS_LARGE_TESTS=1); the default sweep takes every 251st bit pattern. The log of bfloat16
values ('log_bf16', a table lookup on AVX-512) is checked on every bfloat16."""
import math
import os

import pytest
import torch

import npu_loss_ops
from helpers import every_bfloat16

ISAS = npu_loss_ops.build_info()["cpu_isas_available"]
MAX_ULP = 2.0
INF = math.inf


def vec(fn, x, isa):
    return npu_loss_ops._C._vec_math(fn, x, isa)


def ulp_error(ours, x, fn):
    """|ours - fn(x)| in units of the last place of float at fn(x) (computed in float64); where fn(x) rounds
    to a float infinity, 0 if ours is that infinity, else inf."""
    ref = getattr(torch, fn)(x.double())
    _, exponent = torch.frexp(ref)  # |ref| in [2^(e-1), 2^e)
    ulp = torch.ldexp(torch.ones_like(ref), (exponent - 1).clamp(min=-126) - 23)
    err = (ours.double() - ref).abs() / ulp
    overflow = ref.float().isinf()
    return torch.where(overflow, torch.where(ours == ref.float(), 0.0, math.inf), err)


def floats_from_bits(lo, hi, step):
    """float32 values whose bit patterns are lo, lo + step, ... < hi (and hi - 1, the last one)."""
    bits = torch.cat([torch.arange(lo, hi, step, dtype=torch.int64), torch.tensor([hi - 1])])
    return bits.to(torch.int32).view(torch.float32)


# Bit patterns: log over every positive finite float (denormals included); exp over [-104, 89], past
# which it is 0 or inf, its denormal results included.
LOG_RANGE = (0x00000001, 0x7F800000)
EXP_RANGES = [(0x00000000, 0x42B20000), (0x80000000, 0xC2D00000)]  # [0, 89) and (-104, -0]
# tanh over every finite float of both signs (past 9.01 it is +-1).
TANH_RANGES = [(0x00000000, 0x7F800000), (0x80000000, 0xFF800000)]


def sweep(fn, isa, step, chunk=1 << 24):
    ranges = {"log": [LOG_RANGE], "exp": EXP_RANGES, "tanh": TANH_RANGES}[fn]
    worst, worst_x = 0.0, None
    for lo, hi in ranges:
        for start in range(lo, hi, chunk * step):
            x = floats_from_bits(start, min(hi, start + chunk * step), step)
            err = ulp_error(vec(fn, x, isa), x, fn)
            m = err.max().item()
            assert not math.isnan(m), (fn, isa, x[err.isnan()][:5])
            if m > worst:
                worst, worst_x = m, x[err.argmax()].item()
    return worst, worst_x


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fn", ["log", "exp", "tanh"])
def test_within_2_ulp_of_float64(fn, isa):
    worst, at = sweep(fn, isa, step=251)
    assert worst <= MAX_ULP, f"{fn} on {isa}: {worst:.3f} ulp at x = {at!r}"
    assert worst > 0.0  # the sweep really compared rounded values


@pytest.mark.large
@pytest.mark.skipif(os.environ.get("NPU_LOSS_OPS_LARGE_TESTS") != "1",
                    reason="opt-in: set NPU_LOSS_OPS_LARGE_TESTS=1 (every float: about a minute per case)")
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fn", ["log", "exp", "tanh"])
def test_every_float_within_2_ulp(fn, isa):
    worst, at = sweep(fn, isa, step=1)
    assert worst <= MAX_ULP, f"{fn} on {isa}: {worst:.3f} ulp at x = {at!r}"


@pytest.mark.parametrize("isa", ISAS)
def test_log_of_every_bfloat16_within_2_ulp(isa):
    """Every positive finite bfloat16, denormals included: the same bound as log's."""
    x = every_bfloat16()
    x = x[(x > 0) & x.isfinite()]
    err = ulp_error(vec("log_bf16", x, isa), x, "log")
    worst = err.max().item()
    assert worst <= MAX_ULP, f"log_bf16 on {isa}: {worst:.3f} ulp at x = {x[err.argmax()].item()!r}"
    assert worst > 0.0


@pytest.mark.parametrize("isa", ISAS)
def test_log_bf16_special_values_and_negatives(isa):
    """Zero, negatives (every negative bfloat16), infinities and NaN as log gives them."""
    x = every_bfloat16()
    special = x[~((x > 0) & x.isfinite())]
    torch.testing.assert_close(vec("log_bf16", special, isa), vec("log", special, isa), equal_nan=True,
                               rtol=0, atol=0)


SPECIAL = {
    "log": [(0.0, -INF), (-0.0, -INF), (-1.0, math.nan), (-1e-40, math.nan), (-INF, math.nan), (INF, INF),
            (math.nan, math.nan), (1.0, 0.0)],
    "exp": [(INF, INF), (-INF, 0.0), (math.nan, math.nan), (89.0, INF), (-104.0, 0.0), (0.0, 1.0),
            (-0.0, 1.0), (3.4e38, INF), (-3.4e38, 0.0)],
    "tanh": [(INF, 1.0), (-INF, -1.0), (math.nan, math.nan), (0.0, 0.0), (9.1, 1.0), (-9.1, -1.0),
             (3.4e38, 1.0), (-3.4e38, -1.0), (1e-40, 1e-40), (-1e-40, -1e-40)],
}


@pytest.mark.parametrize("isa", ISAS)
def test_tanh_keeps_the_sign_of_zero(isa):
    out = vec("tanh", torch.tensor([0.0, -0.0]), isa)
    assert out.tolist() == [0.0, 0.0] and out.signbit().tolist() == [False, True]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fn", ["log", "exp", "log_bf16", "tanh"])
def test_special_values(fn, isa):
    table = SPECIAL["log" if fn == "log_bf16" else fn]
    x = torch.tensor([v for v, _ in table], dtype=torch.float32)
    if fn == "log_bf16":
        x = x.bfloat16().float()  # -1e-40 is a bfloat16 denormal
    expected = torch.tensor([e for _, e in table], dtype=torch.float32)
    torch.testing.assert_close(vec(fn, x, isa), expected, equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fn", ["log", "exp", "log_bf16", "tanh"])
def test_a_lane_does_not_depend_on_its_neighbours(fn, isa):
    """A vector with one special lane takes the slow path: its ordinary lanes keep the fast path's bits,
    at every position and for every tail length. (tanh's lanes straddle its two forms, at 0.625.)"""
    torch.manual_seed(0)
    x = {"exp": torch.randn(100) * 10, "tanh": torch.randn(100) * 1.5}.get(fn, torch.rand(100) * 4 + 0.01)
    if fn == "log_bf16":
        x = x.bfloat16().float()
    alone = vec(fn, x, isa)
    for special in (0.0, -1.0, INF, math.nan, 1e-41 if fn != "log_bf16" else 2.0 ** -130, 200.0, -200.0):
        for pos in (0, 1, 7, 8, 15, 16, 31, 33, 99):
            y = x.clone()
            y[pos] = special
            mixed = vec(fn, y, isa)
            keep = torch.arange(100) != pos
            assert torch.equal(mixed[keep], alone[keep]), (fn, isa, special, pos)
    for n in range(1, 40):  # tails: the same bits as inside a full vector
        assert torch.equal(vec(fn, x[:n], isa), alone[:n]), (fn, isa, n)


@pytest.mark.parametrize("isa", ISAS)
def test_denormal_inputs_and_results(isa):
    tiny = floats_from_bits(1, 0x00800000, 4099)  # denormal inputs to log
    assert ulp_error(vec("log", tiny, isa), tiny, "log").max().item() <= MAX_ULP
    x = torch.linspace(-103.9, -87.4, 20001)  # exp's denormal results
    assert ulp_error(vec("exp", x, isa), x, "exp").max().item() <= MAX_ULP


def test_rejects_bad_arguments():
    with pytest.raises(RuntimeError, match="fn must be 'log', 'exp', 'log_bf16' or 'tanh'"):
        vec("sin", torch.ones(3), "baseline")
    with pytest.raises(RuntimeError, match="'log_bf16' takes bfloat16 values"):
        vec("log_bf16", torch.tensor([1.0, 1.0 + 2.0 ** -20]), "baseline")
    with pytest.raises(RuntimeError, match="float32 CPU tensor"):
        vec("log", torch.ones(3, dtype=torch.float64), "baseline")
    with pytest.raises(ValueError, match="is not an instruction set"):
        vec("log", torch.ones(3), "sse9")
