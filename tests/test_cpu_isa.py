"""NPU_LOSS_OPS_CPU_ISA picks the CPU kernels' instruction set (docs/cpu_kernels.md): every instruction set
this CPU runs gives the float64 references' numbers on the shared samples, the instruction sets agree with
each other, and a bad value stops the import (ImportError) with a message that names the variable. Each
case runs in a fresh interpreter: the choice is made once per process."""
import os
import subprocess
import sys

import pytest
import torch

import npu_loss_ops
from reference import RTOL, assert_close, reference_backward, reference_forward
from samples import LOSSES, all_samples

INFO = npu_loss_ops.build_info()
ISAS = INFO["cpu_isas_available"]
HERE = os.path.dirname(os.path.abspath(__file__))

# Runs every shared sample's forward and backward (tests/samples.py) and saves the results, in order, to
# the file named by argv[1].
SCRIPT = r"""
import sys, torch
sys.path.insert(0, sys.argv[2])
import npu_loss_ops
from samples import LOSSES, all_samples
results = [(s.run_forward(), s.run_backward()) for loss in LOSSES for s in all_samples(loss)]
torch.save({"isa": npu_loss_ops.build_info()["cpu_isa"], "results": results}, sys.argv[1])
"""


def run(isa=None, script="", *args):
    env = dict(os.environ)
    env.pop("NPU_LOSS_OPS_CPU_ISA", None)
    if isa is not None:
        env["NPU_LOSS_OPS_CPU_ISA"] = isa
    return subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = {}
    for isa in ISAS:
        path = str(tmp_path_factory.mktemp(isa) / "results.pt")
        proc = run(isa, SCRIPT, path, HERE)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[isa] = torch.load(path)
    return out


SAMPLES = [s for loss in LOSSES for s in all_samples(loss)]


@pytest.mark.parametrize("isa", ISAS)
def test_every_isa_matches_pytorch(results, isa):
    """Every sample's forward and backward on this instruction set, against the float64 references."""
    r = results[isa]
    assert r["isa"] == isa
    assert len(r["results"]) == len(SAMPLES)
    for s, (fwd, bwd) in zip(SAMPLES, r["results"]):
        value, mag, _, _ = reference_forward(s)
        assert_close(fwd, value, mag, msg=f"{isa}: {s.name} forward")
        value, mag, _, _ = reference_backward(s)
        assert_close(bwd, value, mag, msg=f"{isa}: {s.name} backward")


@pytest.mark.skipif(len(ISAS) < 2, reason="this CPU runs one instruction set: nothing to compare")
def test_isas_agree_with_each_other(results):
    """float64 runs the baseline's code on every instruction set: the same bits. float32 differs by
    rounding (a few ulp of the result's magnitude), the 16-bit types by at most their own tolerance."""
    first = results[ISAS[0]]["results"]
    for isa in ISAS[1:]:
        for s, ours, theirs in zip(SAMPLES, first, results[isa]["results"]):
            for part, a, b, ref in (("forward", ours[0], theirs[0], reference_forward),
                                    ("backward", ours[1], theirs[1], reference_backward)):
                msg = f"{ISAS[0]} vs {isa}: {s.name} {part}"
                if a.dtype == torch.float64:
                    assert torch.equal(a.nan_to_num(), b.nan_to_num()) and torch.equal(a.isnan(), b.isnan()), msg
                else:
                    _, mag, _, _ = ref(s)
                    rtol = 1e-6 if a.dtype == torch.float32 else RTOL[a.dtype]
                    assert_close(b, a.double(), mag, msg=msg, rtol=rtol)


def test_default_is_the_best_the_cpu_runs():
    """Without NPU_LOSS_OPS_CPU_ISA, the best instruction set the CPU and the build run (docs/cpu_kernels.md),
    AVX-512 included."""
    proc = run(None, "import npu_loss_ops; print(npu_loss_ops.build_info()['cpu_isa'])")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ISAS[-1] == INFO["cpu_isas_available"][-1]
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
