"""Build npu_loss_ops: the `_C` extension (schemas, CPU kernels, composite fallback) always, and `_C_npu`
(the aclnn kernels) when torch_npu is installed or NPU_LOSS_OPS_NPU=1 forces it.

Install with `pip install --no-build-isolation .`: the extension is compiled against the torch already
installed, whichever release it is, and pip is never asked to change that torch (README, "Install" and
"Supported versions").
"""
import contextlib
import functools
import glob
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile

from setuptools import find_packages, setup
from setuptools.command.build import build
from setuptools.command.build_clib import build_clib

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ROOT)  # build_config.py, beside this file (PEP 517 backends do not put it on the path)
from build_config import (  # noqa: E402
    DEFAULT_TORCH,
    TESTED_RELEASES,
    npu_tested,
    release_of,
    torch_npu_include_dirs,
    torch_npu_release,
)

try:
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError:
    raise SystemExit(
        "npu_loss_ops is compiled against the torch of the environment it will run in, and none is "
        f"importable here. Install torch first (CPU build: pip install torch=={DEFAULT_TORCH} --index-url "
        "https://download.pytorch.org/whl/cpu; on Ascend: install the CPU torch first, the release your "
        f"torch_npu needs, then torch_npu, e.g. torch=={DEFAULT_TORCH} and torch-npu=="
        f"{TESTED_RELEASES[DEFAULT_TORCH]}), then build with pip install --no-build-isolation . (without "
        "--no-build-isolation pip builds in an empty environment that has no torch)."
    ) from None

if release_of(torch.__version__) not in TESTED_RELEASES:
    print(
        f"npu_loss_ops: torch {torch.__version__} is not a tested release ({', '.join(TESTED_RELEASES)}); "
        "building against it anyway (README, 'Supported versions', says what to report).",
        file=sys.stderr,
    )

DEBUG = os.environ.get("DEBUG", "0") == "1"
# The sanitized build (docs/usage.md, "A sanitized build"): NPU_LOSS_OPS_SANITIZE=address,undefined.
SANITIZERS = ("address", "undefined")
SANITIZE = [name.strip() for name in os.environ.get("NPU_LOSS_OPS_SANITIZE", "").split(",") if name.strip()]
for _name in SANITIZE:
    if _name not in SANITIZERS:
        sys.exit(f"npu_loss_ops: NPU_LOSS_OPS_SANITIZE names {_name!r}; it takes a comma-separated list of "
                 f"{', '.join(SANITIZERS)}")


def read_version():
    with open(os.path.join(ROOT, "npu_loss_ops", "version.py")) as f:
        scope = {}
        exec(f.read(), scope)
        return scope["__version__"]


def installed_version(distribution):
    """The installed version of a distribution, read without importing it (torch_npu's import needs CANN)."""
    import importlib.metadata

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def record_torch_version(package_dirs, npu_root):
    """npu_loss_ops/_build_torch.py: the torch the extension is compiled against (its full version, e.g.
    '2.13.0+cpu'), so that importing it under another torch raises a clear 'rebuild' error instead of an
    undefined-symbol traceback, and the torch_npu its NPU kernels were built with, for build_info()."""
    torch_npu = installed_version("torch-npu") if npu_root is not None else None
    tested = npu_tested(torch.__version__) if torch_npu is not None else None
    if torch_npu is not None and torch_npu != torch_npu_release(torch.__version__):
        tested = None  # not the tested pair
    for package_dir in package_dirs:
        os.makedirs(package_dir, exist_ok=True)
        with open(os.path.join(package_dir, "_build_torch.py"), "w") as f:
            f.write("# Written by setup.py when the extension is built.\n")
            f.write(f"TORCH_VERSION = {torch.__version__!r}\n")
            f.write(f"TORCH_NPU_VERSION = {torch_npu!r}\n")
            f.write(f"NPU_TESTED = {tested!r}\n")


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
    """Flags chosen by platform: no host-specific -march; the CPU kernels are built for each instruction set
    and one is picked at import (docs/cpu_kernels.md)."""
    # C++20, named: it is BuildExtension's default from torch 2.13 on, but torch 2.9's BuildExtension
    # defaults to C++17 (it adds its own -std only when the flags name none).
    # -ffp-contract=off: the kernels write every fused multiply-add they want as fma(); a multiply and add
    # the compiler fused in one loop and not in another would make an element's bits depend on its position.
    flags = ["-std=c++20", "-fvisibility=hidden", "-ffp-contract=off"]
    if DEBUG:
        flags += ["-O0", "-g"]
        link = []
    else:
        # Release builds carry no debug info (the compiler's -g comes from Python's flags): a 3 MB library
        # instead of 33 MB, and a faster build. DEBUG=1 keeps it.
        flags += ["-O3", "-fno-math-errno", "-fno-trapping-math", "-g0"]
        link = ["-Wl,--strip-debug"]
    machine = platform.machine().lower()
    if machine in ("aarch64", "arm64"):
        flags.append("-march=armv8-a")
    if compiler_supports("-fopenmp"):
        # Without it at::parallel_for in the extension runs on one thread.
        flags.append("-fopenmp")
        link.append("-fopenmp")
    if SANITIZE:
        # After the package's own flags, so they win: -O1 with -g1, the line tables for the reports' file:line
        # (full -g doubles every compile and adds only local variables; DEBUG=1 keeps its -O0 -g), and
        # -fno-wrapv, because Python's -fwrapv makes signed overflow defined and GCC then drops UBSan's
        # overflow checks. The link keeps the debug info and the runtimes.
        sanitize = f"-fsanitize={','.join(SANITIZE)}"
        flags += ([] if DEBUG else ["-O1", "-g1"]) + ["-fno-omit-frame-pointer", "-fno-wrapv", sanitize]
        link = [arg for arg in link if arg != "-Wl,--strip-debug"] + [sanitize]
    # build_info() reports the optimization level and the sanitizers (tests/test_sanitizer.py).
    level = "0" if DEBUG else "1" if SANITIZE else "3"
    flags.append(f"-DNPU_LOSS_OPS_OPT_LEVEL={level}")
    if "undefined" in SANITIZE:
        flags.append("-DNPU_LOSS_OPS_UBSAN=1")  # GCC defines __SANITIZE_ADDRESS__ itself, no UBSan macro
    link += glibc_floor_link_args()
    return flags, link


# Built into both extensions: with glibc_floor_link_args() it keeps the libraries' glibc floor at 2.28
# (manylinux_2_28) when they are built on a newer glibc; the file says how (docs/usage.md, "Deploying").
GLIBC_FLOOR_SOURCE = "csrc/compat/glibc_floor.cpp"


def glibc_floor_link_args():
    """Every call of exp and log through glibc_floor.cpp's wrappers, which bind them to their first glibc
    versions (GLIBC_2.2.5 on x86-64, GLIBC_2.17 on aarch64) instead of 2.29's."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return []
    if platform.machine() not in ("x86_64", "aarch64"):
        return []
    return ["-Wl,--wrap=exp", "-Wl,--wrap=log"]


def torch_npu_dir():
    """torch_npu's install folder, found without importing it (its import needs CANN)."""
    spec = importlib.util.find_spec("torch_npu")
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def build_npu():
    """NPU_LOSS_OPS_NPU=1 forces the NPU kernels, =0 disables them; by default, build when torch_npu is found."""
    switch = os.environ.get("NPU_LOSS_OPS_NPU", "auto").lower()
    if switch in ("0", "false", "off"):
        return None
    root = torch_npu_dir()
    if root is None and switch in ("1", "true", "on"):
        npu = torch_npu_release(torch.__version__) or "<the release made for your torch>"
        raise RuntimeError(f"NPU_LOSS_OPS_NPU=1 but torch_npu is not installed (pip install torch-npu=={npu} --no-deps)")
    return root


def npu_extension(root, flags, link):
    major, minor = torch.__version__.split(".")[:2]
    return CppExtension(
        "npu_loss_ops._C_npu",
        # The aclnn kernels; the checks, the composite math they fall back to and the chip paths come from the
        # static library.
        sorted(glob.glob("csrc/npu/*.cpp")) + [GLIBC_FLOOR_SOURCE],
        include_dirs=torch_npu_include_dirs(root),
        library_dirs=[os.path.join(root, "lib")],
        libraries=["torch_npu"],
        # torch_npu's headers need the torch version as V<major>R<minor>.
        extra_compile_args={"cxx": flags + [f"-DCURRENT_VERSION=V{major}R{minor}"]},
        # No rpath to this machine's torch_npu: _C_npu is loaded after `import torch_npu`, which has loaded
        # libtorch_npu.so already (as torch's own libraries are found for _C), so a wheel carries no
        # build-machine path.
        extra_link_args=link,
    )


def extensions():
    flags, link = cpu_flags()
    sources = ["csrc/module.cpp", "csrc/enable/aten_kernels.cpp"]
    sources += sorted(glob.glob("csrc/registration/*.cpp"))
    sources += sorted(glob.glob("csrc/autograd/*.cpp"))
    sources += sorted(glob.glob("csrc/cpu/*.cpp"))
    sources.append(GLIBC_FLOOR_SOURCE)
    exts = [
        CppExtension(
            "npu_loss_ops._C",
            sources,
            # Declarations the functorch headers need and the torch wheel lacks (see the header).
            include_dirs=[os.path.join(ROOT, "csrc", "compat")],
            extra_compile_args={"cxx": flags},
            extra_link_args=link,
        )
    ]
    if NPU_ROOT is not None:
        exts.append(npu_extension(NPU_ROOT, flags, link))
    return exts


# What both extensions link, compiled once per build: the checks (every rule once), the composite math and the
# chip paths (plain C++: in it, _C shows them on any machine and _C_npu takes each call's path from them).
STATIC_SOURCES = ["csrc/core/checks.cpp", "csrc/composite/math.cpp", "csrc/composite/rows.cpp", "csrc/composite/linear.cpp",
                  "csrc/composite/sparse_jsd.cpp",
                  "csrc/chips/paths.cpp"]


def static_library():
    """The static library both extensions link, made of STATIC_SOURCES (setuptools' build_clib; build_ext then
    links libnpu_loss_static.a into _C and _C_npu)."""
    from torch.utils.cpp_extension import include_paths

    flags, _ = cpu_flags()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return (
        "npu_loss_static",
        {
            "sources": STATIC_SOURCES,
            "include_dirs": include_paths(),
            # The flags BuildExtension gives the extensions' own files, so the library's inline torch code is the
            # same code (-fPIC: it is linked into shared objects).
            "cflags": flags + ["-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"],
            # build_clib recompiles a source only when it or one of these is newer than its object.
            "obj_deps": {"": sorted(glob.glob("csrc/**/*.h", recursive=True))},
        },
    )


NPU_ROOT = build_npu()


def compiler_identity():
    """The C++ compiler that builds the objects: its command, target and version."""
    cxx = os.environ.get("CXX", "c++")
    try:
        target = subprocess.run([*cxx.split(), "-dumpmachine"], capture_output=True, text=True).stdout.strip()
        version = subprocess.run([*cxx.split(), "--version"], capture_output=True, text=True).stdout
    except OSError:
        return [cxx]
    return [cxx, target, version.splitlines()[0] if version else ""]


@functools.lru_cache(maxsize=None)
def build_key(with_npu):
    """What the compiled objects depend on, as a short digest naming their build directory: the torch build
    (release, commit, C++ ABI), the Python ABI, the architecture, the compiler, the environment's and the
    package's flags, and, for _C_npu's objects, the torch_npu release. A rebuild after any of them changed
    compiles into a directory of its own instead of linking objects made for another torch (README,
    "Install")."""
    import hashlib
    import sysconfig

    flags, link = cpu_flags()
    parts = [
        torch.__version__,
        torch.version.git_version,
        str(torch._C._GLIBCXX_USE_CXX11_ABI),
        sysconfig.get_config_var("EXT_SUFFIX"),
        platform.machine(),
        *compiler_identity(),
        *(f"{name}={os.environ.get(name, '')}" for name in ("CFLAGS", "CPPFLAGS", "CXXFLAGS", "LDFLAGS")),
        *flags,
        *link,
    ]
    if with_npu:
        parts += [installed_version("torch-npu") or "", os.path.realpath(NPU_ROOT)]
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return f"torch{release_of(torch.__version__)}-{platform.machine()}-{digest}"


def object_dir(with_npu=False):
    """The build directory of one build key, under the checkout's build/ whatever the build command (pip's
    editable builds would otherwise compile from scratch in a temporary directory each time)."""
    path = os.path.join(ROOT, "build", "objects", build_key(with_npu))
    os.makedirs(path, exist_ok=True)
    return path


@contextlib.contextmanager
def exclusive(path):
    """Holds the lock of one build directory: two builds of one key in one checkout (two venvs of the same
    torch, say) take turns instead of running two ninjas over the same objects."""
    import fcntl

    with open(os.path.join(path, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield path


class Build(build):
    """The build tree of one build key too (build/lib.<key>): a wheel packs the whole tree, and a tree
    shared between builds would carry a library of an earlier build (an _C_npu built for another torch_npu
    into a CPU-only build, say)."""

    def finalize_options(self):
        if self.build_lib is None and self.build_platlib is None:
            self.build_platlib = os.path.join(self.build_base or "build", "lib." + build_key(NPU_ROOT is not None))
        super().finalize_options()


class BuildClib(build_clib):
    """The static library, compiled into and archived in the current build key's directory."""

    def finalize_options(self):
        super().finalize_options()
        self.build_temp = self.build_clib = object_dir()

    def run(self):
        with exclusive(self.build_temp):
            super().run()

    def build_libraries(self, libraries):
        """build_clib compiles a library's sources one after another; here each is its own compiler process,
        MAX_JOBS at a time (as ninja runs the extensions' own; every CPU when unset), objects in source order."""
        from concurrent.futures import ThreadPoolExecutor

        serial = self.compiler.compile
        jobs = int(os.environ.get("MAX_JOBS") or 0) or os.cpu_count() or 1

        def compile_each(sources, *args, **kwargs):
            with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(sources)))) as pool:
                parts = list(pool.map(lambda source: serial([source], *args, **kwargs), sources))
            return [obj for part in parts for obj in part]

        self.compiler.compile = compile_each
        try:
            super().build_libraries(libraries)
        finally:
            self.compiler.compile = serial


def torch_headers(directory):
    """torch's include directory and its copy in the build key's directory, made (with the files' times) by
    the first build of that key. Every venv with this torch build compiles against the copy, so their
    compile commands are the same and ninja reuses the objects another venv compiled (.venv's in .venv-npu,
    the default build's in the rebuild check) instead of recompiling each one whose -I path changed."""
    source = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "include")
    copy = os.path.join(directory, "torch-include")
    if not os.path.isdir(copy):
        staging = tempfile.mkdtemp(dir=directory)
        shutil.copytree(source, os.path.join(staging, "include"), symlinks=True)
        os.rename(os.path.join(staging, "include"), copy)
        os.rmdir(staging)
    return source, copy


class BuildExt(BuildExtension.with_options(use_ninja=True)):
    """BuildExtension (ninja) that builds the static library first, compiles each extension in the directory
    of its build key against that key's copy of torch's headers, always links (ninja recompiles only what
    changed; distutils' own check would keep a library linked for another torch because it is newer than the
    sources), and records the torch it builds against."""

    def finalize_options(self):
        super().finalize_options()
        # distutils adds a venv's own include directory, which holds no file in a venv pip made: dropped when
        # empty, its path no longer makes each venv's compile commands differ.
        venv_include = os.path.abspath(os.path.join(sys.exec_prefix, "include"))
        if not any(files for _, _, files in os.walk(venv_include)):
            self.include_dirs = [d for d in self.include_dirs if os.path.abspath(d) != venv_include]

    def run(self):
        # Beside the library it describes: in the source folder for in-place (editable) builds, in the build
        # tree otherwise (never both: another venv's editable build of this checkout reads the source one).
        package_dir = os.path.join(ROOT if self.inplace else self.build_lib, "npu_loss_ops")
        record_torch_version([package_dir], NPU_ROOT)
        # An editable install runs build_ext alone; the static library must exist before the extensions link it.
        self.run_command("build_clib")
        self.force = True
        super().run()

    def build_extension(self, ext):
        base = self.build_temp
        with exclusive(object_dir(with_npu=ext.name.endswith("_C_npu"))) as self.build_temp:
            source, copy = torch_headers(self.build_temp)
            ext.include_dirs = [copy + d[len(source):] if d == source or d.startswith(source + os.sep) else d
                                for d in ext.include_dirs]
            try:
                super().build_extension(ext)
            finally:
                self.build_temp = base


# A wheel built for distribution (scripts/build_wheel.sh sets NPU_LOSS_OPS_WHEEL=1; docs/usage.md,
# "Deploying") requires the torch release it was compiled against, as torchvision's wheels do, and, when it
# holds _C_npu, exactly the torch_npu it was built with: pip installs it only beside them. Every other build,
# source and editable installs above all, pins nothing: a requirement would let pip replace the user's torch
# (often the one their torch_npu pins) with another. The switch is explicit because nothing else tells the
# two apart: `pip install .` builds its wheel through the same PEP 517 build_wheel hook as `pip wheel .`.
WHEEL_SWITCH = "NPU_LOSS_OPS_WHEEL"


def install_requires():
    if os.environ.get(WHEEL_SWITCH, "0") != "1":
        return []
    if any(command in sys.argv for command in ("sdist", "develop", "editable_wheel")):
        raise SystemExit(f"{WHEEL_SWITCH}=1 makes a wheel require the torch it is built against; an sdist or an "
                         f"editable install pins nothing: unset {WHEEL_SWITCH}")
    # The release without its local label: torch==2.13.0 accepts 2.13.0+cpu, PyPI's CUDA build 2.13.0 and
    # 2.13.0+cu130 alike. Those builds give the extension the same C++ ABI (the same headers, every symbol it
    # imports), and the import check accepts them (npu_loss_ops/__init__.py, _same_torch_abi).
    requires = [f"torch=={release_of(torch.__version__)}"]
    if NPU_ROOT is not None:
        torch_npu = installed_version("torch-npu")
        if torch_npu is None:
            raise SystemExit(f"{WHEEL_SWITCH}=1: _C_npu is built against a torch_npu that pip does not know "
                             "(no torch-npu distribution is installed), so the wheel cannot require it")
        requires.append(f"torch-npu=={torch_npu}")
    return requires


setup(
    name="npu_loss_ops",
    version=read_version(),
    packages=find_packages(include=["npu_loss_ops", "npu_loss_ops.*"]),
    # The package's inline types are its public typing (PEP 561).
    package_data={"npu_loss_ops": ["py.typed"]},
    libraries=[static_library()],
    ext_modules=extensions(),
    cmdclass={"build": Build, "build_clib": BuildClib, "build_ext": BuildExt},
    # Nothing, except in a wheel built for distribution (NPU_LOSS_OPS_WHEEL=1): see install_requires().
    install_requires=install_requires(),
    license="BSD-3-Clause",
    description="Loss functions and their gradients as torch.ops.npu_loss.* ops on Ascend aclnn "
    "kernels, with native CPU kernels everywhere else",
    long_description=open(os.path.join(ROOT, "README.md")).read(),
    long_description_content_type="text/markdown",
)
