"""The symbol guard: fail when a shared object imports a symbol that nothing it is loaded with provides.

Linking a shared object tolerates undefined symbols; Python then loads extensions with RTLD_NOW and the
import fails on the NPU machine (`c10_npu::GetSocVersion()` was such a symbol: declared in torch_npu's
headers, not exported by libtorch_npu.so). `_C_npu` is loaded after torch and torch_npu, so a symbol it
imports is provided only if one of these has it:
  - libtorch_npu.so's exports, and the CANN functions libtorch_npu.so itself imports (CANN is loaded
    wherever libtorch_npu is);
  - the functions the wheel's acl headers declare (libascendcl is on the search path wherever
    libtorch_npu loads);
  - torch's libraries (libtorch, libtorch_cpu, libc10, libtorch_python, ...);
  - the C/C++ runtime (libc, libm, libstdc++, libgcc_s, OpenMP) and the Python interpreter.

Usage: python scripts/check_npu_symbols.py path/to/_C_npu*.so  (in an environment with torch and
torch-npu installed; nothing is imported from torch_npu). Exit status 1 lists the unresolved symbols.
"""
import glob
import importlib.util
import os
import re
import subprocess
import sys
import sysconfig

# acl headers declare their functions as `ACL_FUNC_VISIBILITY <type> <name>(`.
ACL_DECLARATION = re.compile(r"ACL_FUNC_VISIBILITY\s+[^;(]*?\b(\w+)\s*\(")


def _package_root(name):
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"check_npu_symbols: {name} is not installed in this environment")
    return list(spec.submodule_search_locations)[0]


def _nm(path, *flags):
    """Names from `nm -D` (version suffixes such as @GLIBC_2.14 removed)."""
    result = subprocess.run(["nm", "-D", *flags, path], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"check_npu_symbols: nm failed on {path}: {result.stderr.strip()}")
    names = set()
    for line in result.stdout.splitlines():
        parts = line.split()
        if not parts:
            continue
        names.add(parts[-1].split("@")[0])
    return names


def undefined_symbols(path):
    """The strong undefined symbols of a shared object (weak ones may stay unresolved)."""
    result = subprocess.run(["nm", "-D", "--undefined-only", path], capture_output=True, text=True, check=True)
    names = set()
    for line in result.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[-2] == "U":
            names.add(parts[-1].split("@")[0])
    return names


def _runtime_libraries():
    """The C/C++ runtime and OpenMP libraries the compiler links against, as files."""
    cxx = os.environ.get("CXX", "c++")
    found = []
    for name in ("libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "libgomp.so.1", "libpthread.so.0",
                 "libdl.so.2", "librt.so.1"):
        path = subprocess.run([cxx, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
        if os.path.isabs(path) and os.path.exists(path):
            found.append(os.path.realpath(path))
            continue
        # Some toolchains only know the linker names; ask ldconfig for the runtime ones.
        cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
        match = re.search(rf"\s{re.escape(name)} \(.*x86-64.*\) => (\S+)|\s{re.escape(name)} \(.*\) => (\S+)", cache)
        if match:
            found.append(match.group(1) or match.group(2))
    return found


def _interpreter():
    """The interpreter's binary: sys.executable, unless that is a wrapper script (scripts/aarch64.sh runs an
    aarch64 Python under qemu-user through one; there /proc/self/exe names the binary qemu runs)."""
    path = os.path.realpath(sys.executable)
    with open(path, "rb") as f:
        if f.read(4) == b"\x7fELF":
            return path
    return os.path.realpath("/proc/self/exe")


def _host_path(path):
    """A file the interpreter names, as this machine's tools (nm) find it. Under qemu-user the aarch64
    interpreter sees its sysroot at / (qemu's -L), nm does not: NPU_LOSS_OPS_SYSROOT names that sysroot
    (scripts/aarch64.sh sets it). Unset, the path is returned as it is."""
    sysroot = os.environ.get("NPU_LOSS_OPS_SYSROOT", "")
    if sysroot and os.path.isabs(path) and os.path.exists(sysroot + path):
        return sysroot + path
    return path


def provided_symbols():
    """Every symbol some library loaded with `_C_npu` provides, and where the set came from."""
    torch_root = _package_root("torch")
    npu_root = _package_root("torch_npu")
    provided = set()
    sources = []

    libtorch_npu = os.path.join(npu_root, "lib", "libtorch_npu.so")
    provided |= _nm(libtorch_npu, "--defined-only")
    provided |= undefined_symbols(libtorch_npu)  # provided wherever libtorch_npu loads
    sources.append(libtorch_npu)
    for lib in sorted(glob.glob(os.path.join(npu_root, "lib", "*.so"))):
        if lib != libtorch_npu:
            provided |= _nm(lib, "--defined-only")
            sources.append(lib)

    headers = glob.glob(os.path.join(npu_root, "include", "third_party", "acl", "inc", "acl", "*.h"))
    headers += glob.glob(os.path.join(npu_root, "include", "acl", "*.h"))
    for header in headers:
        with open(header, errors="replace") as f:
            provided |= set(ACL_DECLARATION.findall(f.read()))
    sources.append(f"{len(headers)} acl headers")

    for lib in sorted(glob.glob(os.path.join(torch_root, "lib", "*.so*"))):
        provided |= _nm(lib, "--defined-only")
        sources.append(lib)
    for lib in _runtime_libraries():
        provided |= _nm(lib, "--defined-only")
        sources.append(lib)

    # The interpreter: the executable itself, or libpython when Python is built shared.
    provided |= _nm(_interpreter(), "--defined-only")
    libpython = os.path.join(sysconfig.get_config_var("LIBDIR") or "", sysconfig.get_config_var("LDLIBRARY") or "")
    libpython = _host_path(libpython)
    if libpython.endswith(".so") or ".so." in libpython:
        if os.path.exists(libpython):
            provided |= _nm(libpython, "--defined-only")
    sources.append(sys.executable)
    return provided, sources


def unresolved_symbols(path):
    provided, _ = provided_symbols()
    return sorted(undefined_symbols(path) - provided)


def _demangle(names):
    if not names:
        return []
    result = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    return result.stdout.splitlines() if result.returncode == 0 else list(names)


def main(argv):
    if len(argv) != 2:
        raise SystemExit(__doc__)
    path = argv[1]
    missing = unresolved_symbols(path)
    if missing:
        print(f"FAIL: {os.path.basename(path)} imports {len(missing)} symbol(s) that nothing it is loaded with "
              "provides (the import would fail with 'undefined symbol'):")
        for mangled, readable in zip(missing, _demangle(missing)):
            print(f"  {mangled}   {readable}")
        return 1
    print(f"ok: every symbol {os.path.basename(path)} imports is provided "
          f"({len(undefined_symbols(path))} imported symbols checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
