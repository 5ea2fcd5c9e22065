"""The sanitized build (docs/usage.md, "A sanitized build"; scripts/run_sanitized.sh) is live.

CI's sanitizer stage sets NPU_LOSS_OPS_EXPECT_SANITIZERS: the build must then have exactly those sanitizers,
and these tests must run, not skip. An ordinary build skips them. The liveness test poisons eight floats
in the middle of an input with AddressSanitizer's own interface and calls a loss on it: the report must
come from inside the CPU kernels (dense_kernels.h), at every instruction set the CPU has, so the stage
cannot pass with the instrumentation off.
"""
import os
import re
import shutil
import subprocess
import sys

import pytest

import npu_loss_ops

INFO = npu_loss_ops.build_info()
SANITIZERS = INFO["sanitizers"]
EXPECTED = os.environ.get("NPU_LOSS_OPS_EXPECT_SANITIZERS", "")


def test_the_build_has_the_sanitizers_the_run_expects():
    if not EXPECTED:
        pytest.skip("NPU_LOSS_OPS_EXPECT_SANITIZERS is not set (an ordinary build; scripts/run_sanitized.sh sets it)")
    assert sorted(SANITIZERS) == sorted(EXPECTED.split(",")), INFO
    assert INFO["optimization"] == ("-O0" if os.environ.get("DEBUG") == "1" else "-O1"), INFO


POISON = r"""
import ctypes, torch, npu_loss_ops
asan = ctypes.CDLL(None)  # the preloaded runtime's interface
x, t = torch.randn(4096), torch.randn(4096)
asan.__asan_poison_memory_region(ctypes.c_void_p(t.data_ptr() + 4 * 2048), ctypes.c_size_t(32))
torch.ops.npu_loss.mse_loss(x, t, 2)
print("the kernel read poisoned memory and nothing reported it")
"""


@pytest.mark.skipif("address" not in SANITIZERS, reason="needs the AddressSanitizer build (NPU_LOSS_OPS_SANITIZE)")
@pytest.mark.parametrize("isa", INFO["cpu_isas_available"])
def test_address_sanitizer_reports_a_poisoned_input_inside_the_kernel(isa, tmp_path):
    log = tmp_path / "asan"
    options = re.sub(r"log_path=[^:]*", "", os.environ.get("ASAN_OPTIONS", "")).strip(":")
    env = dict(os.environ, NPU_LOSS_OPS_CPU_ISA=isa, ASAN_OPTIONS=f"{options}:log_path={log}".strip(":"))
    proc = subprocess.run([sys.executable, "-c", POISON], env=env, capture_output=True, text=True, timeout=300)
    reports = list(tmp_path.glob("asan.*"))
    assert proc.returncode != 0 and reports, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    report = reports[0].read_text()
    assert "use-after-poison" in report, report[:3000]
    # The faulting access is in the CPU kernels of this instruction set: the first frames in the package's
    # sources are csrc/cpu/'s vector loads (simd.h) inlined into dense_kernels.h's loop, in the instruction
    # set's namespace (frames above them, if any, are the compiler's intrinsics headers).
    frames = [line.strip() for line in report.splitlines() if re.match(r"\s*#\d+ ", line)]
    ours = [frame for frame in frames if "/csrc/" in frame][:8]
    assert ours and all("/csrc/cpu/" in frame for frame in ours[:2]), report[:3000]
    assert any("dense_kernels.h:" in frame for frame in ours[:3]), report[:3000]
    assert any(f"::{isa}::" in frame for frame in ours), report[:3000]


@pytest.mark.skipif("undefined" not in SANITIZERS, reason="needs the UBSan build (NPU_LOSS_OPS_SANITIZE)")
def test_ubsan_checks_signed_overflow_in_the_library():
    """-fno-wrapv: with Python's -fwrapv alone, GCC drops UBSan's signed-overflow checks (0 sites)."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm is not installed")
    library = npu_loss_ops._C.__file__
    symbols = subprocess.run([nm, "-D", "--undefined-only", library], capture_output=True, text=True).stdout
    for handler in ("__ubsan_handle_add_overflow", "__ubsan_handle_mul_overflow", "__ubsan_handle_type_mismatch_v1"):
        assert handler in symbols, handler
