"""Test harness only: the step that lets torch_npu load into the registry's CUDA build of torch (README.md in
this directory, "torch_npu on a CUDA build of torch"). It is never part of npu_loss_ops, its wheel or csrc/
(tests/test_emulator_harness.py checks).

torch_npu's wheels are made for torch's +cpu build. On a CUDA build, libc10_cuda.so registers its allocator
settings' keys in c10's one process-wide key set during `import torch`; on some torch_npu lines libtorch_npu.so
registers two of the same keys during `import torch_npu`, and c10 throws from that static initializer, which
aborts the process. Between the two imports, `release_duplicated_keys()` removes the CUDA build's copies of those
two keys (`MEASURED`), and torch_npu then registers them itself. c10 keeps the last parser registered, so NPU's
replaces CUDA's: what a +cpu torch has anyway.

    import_torch_npu() -> module         the step, then `import torch_npu`, then the check that torch_npu
                                         registered every removed key again; the emulated runs import torch_npu
                                         only through it (TORCH_DEVICE_BACKEND_AUTOLOAD=0 in their whole tree)
    release_duplicated_keys() -> list    the step alone: the keys it removed, [] where none clash (a +cpu
                                         torch, or a line whose torch_npu registers no key of the CUDA build's)
    REMOVED                              what the step removed in this process
    key_set() -> (form, address)         where c10's set is: "accessor" (getMutableKeys() exported, 2.13 on)
                                         or "storage" (the accessor inline, its static exported, 2.10 to 2.12);
                                         "none" on a torch without it (no getMutableKeys in its
                                         c10/core/AllocatorConfig.h, 2.7 and 2.8): nothing can clash there
    keys() -> set                        the keys in the set now
    containing(paths) -> list            the files under paths that hold any of MARKERS (the step's names): the
                                         scope check of tests/test_emulator_harness.py and scripts/build_wheel.sh
    python c10_keys.py --absent PATH...  that check from the shell: exits 1 naming each such file

It edits a c10 internal (the set's symbols and a std::unordered_set's layout): re-check it at each torch release.
Which keys clash is read, not assumed: a key in the set that libc10.so does not name (another library
registered it) and that libtorch_npu.so names as a string (torch_npu will register it). A clashing key outside
MEASURED is an error naming it, never removed.
"""

import ctypes
import importlib.util
import mmap
import os
import sys

# The keys measured to clash (torch_npu 2.10.0.post7 and 2.14.0 on the registry's torch of the same release):
# removing only the first moves the abort to the second.
MEASURED = ("pinned_reserve_segment_size_mb", "per_process_memory_fraction")
_ACCESSOR = "_ZN3c1016CachingAllocator26AcceleratorAllocatorConfig14getMutableKeysB5cxx11Ev"
_STORAGE = "_ZZN3c1016CachingAllocator26AcceleratorAllocatorConfig14getMutableKeysB5cxx11EvE4keys"
_GUARD = "_ZGV" + _STORAGE[2:]
HELPER_VARIABLE = "NPU_EMU_C10_KEYS_LIB"
# Names only the step has (this module, its helper's symbols and library): none may appear in what users install.
MARKERS = (b"c10_keys", b"npu_emu_c10keys", b"release_duplicated_keys", HELPER_VARIABLE.encode())

REMOVED: list = []


class HarnessError(RuntimeError):
    """The step cannot tell what to do: the set is not where it looked, or a key it does not know clashes."""


def _torch_lib_dir():
    torch = sys.modules.get("torch")
    if torch is None:
        raise HarnessError("c10_keys: import torch first (the step runs between `import torch` and `import torch_npu`)")
    return os.path.join(os.path.dirname(torch.__file__), "lib")


def _libc10():
    path = os.path.join(_torch_lib_dir(), "libc10.so")
    return ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY), path


def _address(lib, name):
    try:
        return ctypes.cast(lib[name], ctypes.c_void_p).value
    except AttributeError:
        return None


def _declares_the_set():
    """Whether this torch's c10 has the key set: its header declares getMutableKeys (2.9 on; 2.7 and 2.8 have neither)."""
    header = os.path.join(os.path.dirname(_torch_lib_dir()), "include", "c10", "core", "AllocatorConfig.h")
    if not os.path.isfile(header):
        return False
    with open(header, errors="replace") as f:
        return "getMutableKeys" in f.read()


def key_set():
    """("accessor" | "storage", address of the set); ("storage", None) when the set was never constructed (2.9:
    nothing registers a key); ("none", None) on a torch without it (2.7, 2.8). In both, nothing can clash."""
    if not _declares_the_set():
        return "none", None
    lib, path = _libc10()
    accessor = _address(lib, _ACCESSOR)
    if accessor is not None:
        return "accessor", ctypes.CFUNCTYPE(ctypes.c_void_p)(accessor)()
    storage, guard = _address(lib, _STORAGE), _address(lib, _GUARD)
    if storage is not None and guard is not None:
        # The Itanium ABI's guard: its first byte is set once the function-local static is constructed.
        return "storage", storage if ctypes.c_ubyte.from_address(guard).value else None
    raise HarnessError(f"c10_keys: {path} exports neither the key set's accessor {_ACCESSOR} nor its storage "
                       f"{_STORAGE} (with its guard {_GUARD}), though c10/core/AllocatorConfig.h declares "
                       "getMutableKeys; this torch keeps c10's allocator keys elsewhere, so the step must be "
                       "re-checked for it")


def _helper():
    path = os.environ.get(HELPER_VARIABLE)
    if not path or not os.path.isfile(path):
        raise HarnessError(f"c10_keys: {HELPER_VARIABLE} names no helper library ({path!r}); tests/npu_emulator/"
                           "build.sh builds it and emulator.env() sets the variable")
    lib = ctypes.CDLL(path)
    lib.npu_emu_c10keys_list.restype = ctypes.c_size_t
    lib.npu_emu_c10keys_list.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.npu_emu_c10keys_erase.restype = ctypes.c_int
    lib.npu_emu_c10keys_erase.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    return lib


def keys():
    """The keys in c10's set now (empty when it was never constructed)."""
    _, address = key_set()
    if address is None:
        return set()
    lib = _helper()
    size = lib.npu_emu_c10keys_list(address, None, 0)
    buf = ctypes.create_string_buffer(size)
    lib.npu_emu_c10keys_list(address, buf, size)
    return set(buf.value.decode().split())


def _names(path, candidates):
    """The candidates that the library at path holds as a NUL-terminated string of their own."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return {key for key in candidates if data.find(b"\0" + key.encode() + b"\0") >= 0}


def _libtorch_npu():
    spec = importlib.util.find_spec("torch_npu")  # locates it without importing it
    if spec is None or not spec.submodule_search_locations:
        raise HarnessError("c10_keys: torch_npu is not installed for this python")
    return os.path.join(list(spec.submodule_search_locations)[0], "lib", "libtorch_npu.so")


def release_duplicated_keys():
    """The step: removes from c10's set the keys another library registered that torch_npu will register again
    (only MEASURED ones; any other is a HarnessError naming it). Returns them; [] changes nothing."""
    if "torch_npu" in sys.modules:
        raise HarnessError("c10_keys: torch_npu is imported already; the step must run before it")
    form, address = key_set()
    present = keys()
    # Keys libc10.so does not name were registered by another library (libc10_cuda.so on a CUDA build).
    foreign = present - _names(os.path.join(_torch_lib_dir(), "libc10.so"), present)
    clash = sorted(_names(_libtorch_npu(), foreign)) if foreign else []
    unknown = [key for key in clash if key not in MEASURED]
    if unknown:
        raise HarnessError(f"c10_keys: torch_npu would register {unknown} again, which this torch registered already; "
                           f"the step removes only {list(MEASURED)}, so it must be re-checked for this torch")
    helper = _helper() if clash else None
    for key in clash:
        if helper.npu_emu_c10keys_erase(address, key.encode()) != 1:
            raise HarnessError(f"c10_keys: could not remove {key!r} from c10's key set ({form})")
        REMOVED.append(key)
    if clash:
        print(f"c10_keys: removed {clash} from c10's allocator key set ({form}; torch_npu registers them again)",
              file=sys.stderr)
    return clash


def import_torch_npu():
    """The step, `import torch_npu`, and the check that torch_npu registered each removed key again."""
    if "torch_npu" not in sys.modules:
        import torch  # noqa: F401  (the window opens once torch is imported)

        release_duplicated_keys()
    import torch_npu

    missing = [key for key in REMOVED if key not in keys()]
    if missing:
        raise HarnessError(f"c10_keys: removed {missing}, but torch_npu did not register them again")
    return torch_npu


def containing(paths):
    """The files under paths (files or directories, walked) whose bytes hold any of MARKERS, with the marker."""
    found = []
    for top in paths:
        files = [top] if os.path.isfile(top) else [os.path.join(d, f) for d, _, fs in os.walk(top) for f in fs]
        for path in sorted(files):
            if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) == 0:
                continue
            with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                found += [f"{path}: {marker.decode()}" for marker in MARKERS if data.find(marker) >= 0]
    return found


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "--absent":
        sys.exit("usage: python c10_keys.py --absent PATH...")
    hits = containing(sys.argv[2:])
    if hits:
        sys.exit("the test harness's step is in what users install:\n  " + "\n  ".join(hits))
    print(f"c10_keys: none of its names in {len(sys.argv) - 2} path(s)")
