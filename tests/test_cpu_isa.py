"""NPU_LOSS_OPS_CPU_ISA picks the CPU kernels' instruction set (docs/cpu_kernels.md): every instruction set
this CPU runs gives PyTorch's numbers, the instruction sets agree with each other, and a bad value stops the
import (ImportError) with a message that names the variable. Each case runs in a fresh interpreter: the choice is made
once per process."""
import json
import os
import subprocess
import sys

import pytest

import npu_loss_ops

INFO = npu_loss_ops.build_info()
ISAS = INFO["cpu_isas_available"]

# Every op on contiguous, strided and broadcast inputs of each floating dtype, compared with float64
# PyTorch; prints the results as JSON so that the instruction sets can be compared with each other.
SCRIPT = r"""
import json, sys, torch, torch.nn.functional as F
import npu_loss_ops
torch.manual_seed(0)
out = {"isa": npu_loss_ops.build_info()["cpu_isa"], "results": {}, "errors": {}}
TOL = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}

def ref_grad(name, g, x, t, reduction, log_target=False):
    g, x, t = g.double(), x.double(), t.double()
    with torch.enable_grad():
        if name == "kl_div":
            t = t.requires_grad_()
            loss = F.kl_div(x, t, reduction=reduction, log_target=log_target)
            return torch.autograd.grad(loss, t, g)[0]
        x = x.requires_grad_()
        loss = F.smooth_l1_loss(x, t, reduction=reduction, beta=0.5) if name == "smooth_l1_loss" else \
            F.l1_loss(x, t, reduction=reduction)
        return torch.autograd.grad(loss, x, g)[0]

for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
    for layout in ("contiguous", "strided", "broadcast"):
        x = torch.randn(37, 29, dtype=dtype)
        t = torch.rand(37, 29, dtype=dtype) + 0.05
        if layout == "strided":
            x, t = torch.randn(29, 37, dtype=dtype).t(), (torch.rand(29, 37, dtype=dtype) + 0.05).t()
        elif layout == "broadcast":
            t = t[:1]
        for name in ("smooth_l1_loss", "l1_loss", "kl_div", "kl_div[log]"):
            base = name.split("[")[0]
            log_target = name.endswith("[log]")
            tt = t.log() if log_target else t
            for red, r in (("none", 0), ("mean", 1), ("sum", 2)):
                kw = {"log_target": log_target} if base == "kl_div" else {}
                args = (0.5,) if base == "smooth_l1_loss" else ()
                fwd = getattr(torch.ops.npu_loss, base)(x, tt, r, *args, **kw)
                g = torch.randn(fwd.shape, dtype=dtype) if red == "none" else torch.tensor(1.5, dtype=dtype)
                bwd_op = getattr(torch.ops.npu_loss, base + ("_target" if base == "kl_div" else "") + "_backward")
                bwd = bwd_op(g, x, tt, r, *args) if base != "kl_div" else bwd_op(g, x, tt, r, log_target)
                ref_fwd = (F.kl_div(x.double(), tt.double(), reduction=red, log_target=log_target) if base == "kl_div"
                           else getattr(F, base)(x.double(), tt.double(), reduction=red, **({"beta": 0.5} if args else {})))
                ref_bwd = ref_grad(base, g, x, tt, red, log_target)
                key = f"{dtype}-{layout}-{name}-{red}"
                for part, ours, ref in (("fwd", fwd, ref_fwd), ("bwd", bwd, ref_bwd)):
                    err = ((ours.double() - ref).abs() / (1 + ref.abs())).max().item()
                    out["errors"][key + "-" + part] = err / TOL[dtype]
                    out["results"][key + "-" + part] = ours.double().flatten().tolist()
print(json.dumps(out))
"""


def run(isa=None, script=SCRIPT):
    env = dict(os.environ)
    env.pop("NPU_LOSS_OPS_CPU_ISA", None)
    if isa is not None:
        env["NPU_LOSS_OPS_CPU_ISA"] = isa
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def results():
    out = {}
    for isa in ISAS:
        proc = run(isa)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[isa] = json.loads(proc.stdout)
    return out


@pytest.mark.parametrize("isa", ISAS)
def test_every_isa_matches_pytorch(results, isa):
    r = results[isa]
    assert r["isa"] == isa
    worst = max(r["errors"].items(), key=lambda kv: kv[1])
    assert worst[1] <= 1.0, f"{isa}: {worst[0]} is {worst[1]:.2f}x its dtype's tolerance"
    assert len(r["errors"]) == 4 * 3 * 4 * 3 * 2


def test_isas_agree_with_each_other(results):
    """Two instruction sets differ only by rounding: a few float32 ulp, one bfloat16/float16 rounding."""
    first = results[ISAS[0]]["results"]
    for isa in ISAS[1:]:
        other = results[isa]["results"]
        for key, values in first.items():
            rel = 3e-6 if ("float32" in key or "float64" in key) else 8e-3
            if "bfloat16" in key:
                rel = 1.6e-2
            for a, b in zip(values, other[key]):
                assert (a != a and b != b) or abs(a - b) <= rel * (1 + abs(a)), (isa, key, a, b)


def test_default_is_the_best_the_cpu_runs_up_to_avx2():
    """AVX-512 runs only when asked for by name until it has been verified on an AVX-512 CPU
    (docs/cpu_kernels.md)."""
    proc = run(None, "import npu_loss_ops; print(npu_loss_ops.build_info()['cpu_isa'])")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == [isa for isa in ISAS if isa != "avx512"][-1]
    assert INFO["cpu_kernel_isa"]  # a description for bug reports


@pytest.mark.parametrize("value, message", [
    ("avx3", "NPU_LOSS_OPS_CPU_ISA='avx3' is not an instruction set: use avx512, avx2 or baseline"),
    ("AVX2", "NPU_LOSS_OPS_CPU_ISA='AVX2' is not an instruction set"),
])
def test_unknown_value_stops_the_import(value, message):
    proc = run(value, "import npu_loss_ops")
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr and message in proc.stderr, proc.stderr[-2000:]


@pytest.mark.skipif("avx512" in ISAS, reason="this CPU runs every instruction set")
def test_an_isa_the_cpu_lacks_stops_the_import():
    proc = run("avx512", "import npu_loss_ops")
    assert proc.returncode != 0
    assert f"NPU_LOSS_OPS_CPU_ISA='avx512': this CPU (or build) runs at most '{ISAS[-1]}'" in proc.stderr, \
        proc.stderr[-2000:]
