"""Verify the NPU build without an NPU: what CI can check of _C_npu where CANN is absent.

Run in an environment where torch-npu is installed (with TORCH_DEVICE_BACKEND_AUTOLOAD=0) after building
with NPU_LOSS_OPS_NPU=1. Checks that
  1. _C_npu was built and records libtorch_npu.so as a needed library (readelf -d);
  2. every aclnn API the NPU sources call is present by name in it, as a NUL-terminated C string
     (NPU_LOSS_EXEC_ACLNN resolves them by name at run time, so nm cannot see them);
  3. the symbol guard (scripts/check_npu_symbols.py): every symbol _C_npu and _C import is provided by
     something they are loaded with, and the guard rejects a probe that imports c10_npu::GetSocVersion()
     (declared by torch_npu's headers, not exported), the defect that once kept _C_npu from loading;
  4. the call-site type guard works: the probe tests/npu_build/aclnn_call_types.cpp compiles as written and
     fails to compile, on the guard's static_assert, with a double beta, an int reduction, an int
     log_target, or a missing argument;
  5. `import npu_loss_ops` still works (torch_npu cannot import without CANN), reports why the NPU kernels
     are off, and computes on CPU.
Exits non-zero on the first failed check.
"""
import glob
import importlib.util
import os
import re
import subprocess
import sys
import sysconfig
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_build_config():
    """build_config.py (the include directories setup.py uses), loaded by path: putting the repository on
    sys.path would make the source tree shadow the installed npu_loss_ops this script checks."""
    spec = importlib.util.spec_from_file_location("build_config", os.path.join(ROOT, "build_config.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


torch_npu_include_dirs = _load_build_config().torch_npu_include_dirs
GUARD_MESSAGE = "arguments do not match the prototype of"
MISMATCHES = ["MISMATCH_DOUBLE_BETA", "MISMATCH_INT_REDUCTION", "MISMATCH_INT_LOG_TARGET", "MISMATCH_MISSING_ARGUMENT"]


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


def ok(message):
    print(f"ok: {message}")


def package_dir():
    spec = importlib.util.find_spec("npu_loss_ops")
    if spec is None:
        fail("npu_loss_ops is not installed")
    return list(spec.submodule_search_locations)[0]


def torch_npu_root():
    spec = importlib.util.find_spec("torch_npu")
    if spec is None:
        fail("torch_npu is not installed in this environment")
    return list(spec.submodule_search_locations)[0]


def called_aclnn_apis():
    names = set()
    for path in glob.glob(os.path.join(ROOT, "csrc", "npu", "*.cpp")):
        with open(path) as f:
            names.update(re.findall(r"NPU_LOSS_EXEC_ACLNN\(\s*(aclnn\w+)", f.read()))
    if not names:
        fail("no NPU_LOSS_EXEC_ACLNN call found in csrc/npu")
    return sorted(names)


def check_library():
    libs = glob.glob(os.path.join(package_dir(), "_C_npu*.so"))
    if not libs:
        fail(f"_C_npu was not built (nothing matches {package_dir()}/_C_npu*.so)")
    lib = libs[0]
    ok(f"built {os.path.basename(lib)}")
    dynamic = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True, check=True).stdout
    if "[libtorch_npu.so]" not in dynamic:
        fail("readelf -d shows no NEEDED libtorch_npu.so")
    ok("readelf -d: NEEDED libtorch_npu.so")
    # Each name as the C string the frame looks up: its bytes followed by the NUL that ends it. (`strings` splits
    # the file into runs of printable bytes, and a constant the compiler stores without a NUL right before a
    # name joins the two into one run: a build against torch 2.7.1 laid "aclnnL1LossBackwardGetWorkspaceSize"
    # out that way.)
    with open(lib, "rb") as f:
        data = f.read()
    for name in called_aclnn_apis():
        for symbol in (name, name + "GetWorkspaceSize"):
            if symbol.encode() + b"\0" not in data:
                fail(f"no C string {symbol} in {os.path.basename(lib)}")
        ok(f"C strings: {name} and {name}GetWorkspaceSize")


def check_symbols():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import check_npu_symbols

    for pattern in ("_C_npu*.so", "_C.*.so"):
        lib = glob.glob(os.path.join(package_dir(), pattern))[0]
        missing = check_npu_symbols.unresolved_symbols(lib)
        if missing:
            fail(f"{os.path.basename(lib)} imports symbols nothing provides (it would not load): {missing}")
        ok(f"symbol guard: every symbol {os.path.basename(lib)} imports is provided")
    # The guard must catch the defect it exists for.
    include = os.path.join(torch_npu_root(), "include")
    with tempfile.TemporaryDirectory() as tmp:
        probe = os.path.join(tmp, "undefined_symbol_probe.so")
        cmd = [os.environ.get("CXX", "c++"), "-shared", "-fPIC", f"-I{include}",
               os.path.join(ROOT, "tests", "npu_build", "undefined_symbol_probe.cpp"),
               f"-L{os.path.join(torch_npu_root(), 'lib')}", "-ltorch_npu", "-o", probe]
        subprocess.run(cmd, check=True)
        missing = check_npu_symbols.unresolved_symbols(probe)
    if "_ZN7c10_npu13GetSocVersionEv" not in missing:
        fail(f"the symbol guard let c10_npu::GetSocVersion() through (it reported {missing})")
    ok("symbol guard rejects a probe importing c10_npu::GetSocVersion() (not exported by libtorch_npu.so)")


def compile_probe(define):
    from torch.utils.cpp_extension import include_paths
    import torch

    major, minor = torch.__version__.split(".")[:2]
    # The same include directories setup.py builds _C_npu with.
    dirs = include_paths() + torch_npu_include_dirs(torch_npu_root()) + [sysconfig.get_paths()["include"]]
    # C++20: the standard BuildExtension compiles the extension with (torch 2.13's headers are written for it).
    cmd = [os.environ.get("CXX", "c++"), "-std=c++20", "-fsyntax-only", f"-DCURRENT_VERSION=V{major}R{minor}"]
    cmd += [f"-I{d}" for d in dirs]
    if define:
        cmd.append(f"-D{define}")
    cmd.append(os.path.join(ROOT, "tests", "npu_build", "aclnn_call_types.cpp"))
    return subprocess.run(cmd, capture_output=True, text=True)


def check_type_guard():
    # The five probe compiles are independent: two at a time (each is one compiler process).
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip([None] + MISMATCHES, pool.map(compile_probe, [None] + MISMATCHES)))
    result = results[None]
    if result.returncode != 0:
        fail("the probe with the exact aclnn types does not compile:\n" + result.stderr[-3000:])
    ok("probe with exact aclnn argument types compiles")
    for define in MISMATCHES:
        result = results[define]
        if result.returncode == 0:
            fail(f"{define}: the probe compiled, the type guard let it through")
        if GUARD_MESSAGE not in result.stderr:
            fail(f"{define}: compilation failed, but not on the type guard:\n" + result.stderr[-3000:])
        ok(f"{define}: rejected at compile time by the type guard")


def check_import():
    import torch
    import npu_loss_ops

    info = npu_loss_ops.build_info()
    if npu_loss_ops.npu_kernels_available():
        ok("NPU kernels are active (an NPU is present)")
    else:
        ok(f"import works without CANN; NPU kernels off: {info['npu_reason']}")
    x = torch.tensor([0.0, 0.5, 3.0])
    got = torch.ops.npu_loss.smooth_l1_loss_backward(torch.ones(3), x, torch.zeros(3), 0, 1.0)
    if not torch.equal(got, torch.tensor([0.0, 0.5, 1.0])):
        fail(f"CPU smooth_l1_loss_backward gave {got.tolist()}")
    ok("CPU kernels compute in the NPU build")


def main():
    check_library()
    check_symbols()
    check_type_guard()
    check_import()
    print("NPU build check passed")


if __name__ == "__main__":
    main()
