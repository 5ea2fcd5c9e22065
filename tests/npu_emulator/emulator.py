"""Helpers for running processes on the host-emulated CANN (see README.md in this directory).

Importable as a plain module by path; it imports nothing heavy at module level (no torch).

    SOCS                     the SoC name each chip family runs as (what aclrtGetSocName returns)
    env(family, lib_dir, without_loss_apis=False, reject=(), task_queue=1) -> dict
                             the environment of a subprocess that runs on the emulator (`reject`: APIs whose
                             first phase rejects the package's own calls, NPU_EMU_REJECT)
    import_torch_npu()       `import torch_npu` as the emulated runs do it: through c10_keys.py's step, which
                             lets torch_npu load into a CUDA build of torch (README.md)
    active() -> bool         whether this process runs on the emulator (its libopapi.so is loaded)
    trace() -> dict          counts of executed aclnn operators, rejected GetWorkspaceSize calls
                             ("<api>GetWorkspaceSize:<status>") and aclop fallbacks ("aclop:<optype>")
    trace_reset()            clears the counts
    reject(*apis)            from now on, the named APIs reject the package's own calls (161002); reject() none
    pin_jit_compile_off()    keeps torch_npu's ops on aclnn in this thread and the autograd engine's NPU worker
"""

import ctypes
import json
import os
import sys

# torch_npu maps these names to its SocVersion enum (torch_npu/csrc/core/npu/NpuVariables.cpp; any name
# starting with "Ascend950" is Ascend950). The emulator picks each chip's aclnn semantics from the same name.
SOCS = {
    "910B": "Ascend910B1",       # Atlas A2 (DAV_2201)
    "910_93": "Ascend910_9391",  # Atlas A3 (DAV_2201)
    "950": "Ascend950PR_9599",   # Ascend 950 (regbase)
    "910": "Ascend910A",         # Atlas training series, first generation
    "310P": "Ascend310P3",       # Atlas inference series
    "310B": "Ascend310B1",       # Atlas 200I/500 A2
}

_LIB = "libopapi.so"


def _lib_dirs(lib_dir, without_loss_apis):
    base = os.path.abspath(os.fspath(lib_dir))
    if os.path.isfile(os.path.join(base, "lib", "libascendcl.so")):  # OUT_DIR given
        out = base
    else:  # OUT_DIR/lib (or OUT_DIR/lib-without-loss-apis) given
        out = os.path.dirname(base)
    lib = os.path.join(out, "lib-without-loss-apis" if without_loss_apis else "lib")
    if not os.path.isfile(os.path.join(lib, "libascendcl.so")):
        raise FileNotFoundError(f"no emulator libraries in {lib}; run tests/npu_emulator/build.sh first")
    return out, lib


def env(family, lib_dir, without_loss_apis=False, reject=(), task_queue=1):
    """Environment (a full copy of os.environ plus the emulator's variables) for a subprocess that runs
    torch_npu on the emulated chip `family` (a key of SOCS, or a SoC name such as "Ascend910B2").
    lib_dir is build.sh's OUT_DIR/lib (OUT_DIR works too); without_loss_apis selects the libopapi.so that
    lacks the loss APIs (an older CANN toolkit). `reject`: aclnn APIs whose first phase rejects the package's
    own calls with 161002 (NPU_EMU_REJECT; torch_npu's calls of them keep their path). `task_queue`:
    TASK_QUEUE_ENABLE."""
    soc = SOCS.get(family, family)
    if not str(soc).startswith("Ascend"):
        raise ValueError(f"unknown chip family {family!r}; expected one of {sorted(SOCS)} or an Ascend SoC name")
    out, lib = _lib_dirs(lib_dir, without_loss_apis)
    e = dict(os.environ)
    e["LD_LIBRARY_PATH"] = lib + (os.pathsep + e["LD_LIBRARY_PATH"] if e.get("LD_LIBRARY_PATH") else "")
    e["NPU_EMU_SOC"] = soc
    # Ops go through torch_npu's task queue in mode 1 by default (an error in the run phase would leave mode 2
    # broken; the package's own calls check their first phase before anything is enqueued, in every mode).
    e["TASK_QUEUE_ENABLE"] = str(task_queue)
    if reject:
        e["NPU_EMU_REJECT"] = ",".join(reject)
    ascend = os.path.join(out, "ascend")
    if os.path.isdir(ascend):  # the stand-in install tree build.sh writes (silences torch_npu's warning)
        e["ASCEND_HOME_PATH"] = ascend
        e["ASCEND_OPP_PATH"] = os.path.join(ascend, "opp")
    # torch_npu is imported only through import_torch_npu(), in every process of the run (Inductor's workers and
    # spawned processes included): the backend autoload would import it inside `import torch`, before the step.
    e["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    e["NPU_EMU_C10_KEYS_LIB"] = os.path.join(out, "harness", "libc10_keys.so")
    return e


def import_torch_npu():
    """`import torch_npu` in an emulated run: after `import torch`, c10_keys.py's step (on a CUDA build of torch,
    it removes the two allocator keys torch_npu registers again), then the import. Outside an emulated run
    (no NPU_EMU_C10_KEYS_LIB, as on a real NPU) a plain import."""
    if not os.environ.get("NPU_EMU_C10_KEYS_LIB"):
        import torch_npu

        return torch_npu
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import c10_keys

    return c10_keys.import_torch_npu()


def _loaded_lib():
    try:
        lib = ctypes.CDLL(_LIB, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return None
    try:
        lib.npu_emu_trace_json  # noqa: B018  (only the emulator's libopapi.so has it)
    except AttributeError:
        return None
    return lib


def active():
    """True when this process runs torch_npu on the emulator (the emulator's libopapi.so is loaded, which
    happens at the first aclnn call, or when torch_npu initialises the device)."""
    if _loaded_lib() is not None:
        return True
    # Not loaded yet: the core library is loaded with torch_npu itself.
    try:
        core = ctypes.CDLL("libascendcl.so", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        core.npuemu_trace_json  # noqa: B018
        return True
    except (OSError, AttributeError):
        return False


def _sync():
    torch = sys.modules.get("torch")
    if torch is not None and "torch_npu" in sys.modules:
        try:
            torch.npu.synchronize()
        except Exception:  # noqa: BLE001  (a broken queue must not hide the trace)
            pass


def _trace_lib():
    lib = _loaded_lib()
    if lib is None:
        try:
            lib = ctypes.CDLL("libascendcl.so", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            lib.npu_emu_trace_json  # noqa: B018
        except (OSError, AttributeError):
            raise RuntimeError("the NPU emulator is not loaded in this process") from None
    lib.npu_emu_trace_json.restype = ctypes.c_size_t
    lib.npu_emu_trace_json.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return lib


def trace():
    """Counts since the start (or the last trace_reset()), after synchronizing the NPU: each aclnn operator
    whose run phase executed, by name ("<api>:empty" also counts calls with nothing to launch);
    "<api>GetWorkspaceSize:<status>" for rejected calls; "aclop:<optype>" for the old aclop path;
    "aclCreateTensor:private_format:<format>" for tensors with a private format handed to aclnn."""
    _sync()
    lib = _trace_lib()
    n = lib.npu_emu_trace_json(None, 0)
    buf = ctypes.create_string_buffer(n)
    lib.npu_emu_trace_json(buf, n)
    return {k: int(v) for k, v in json.loads(buf.value.decode()).items()}


def trace_reset():
    """Clears the counts (after synchronizing the NPU)."""
    _sync()
    _trace_lib().npu_emu_trace_reset()


def reject(*apis):
    """From the next call on, the first phase of each named aclnn API rejects the package's own calls with
    161002, as a chip whose CANN does not have it; reject() with no name rejects nothing (NPU_EMU_REJECT's
    list, replaced). torch_npu's own calls of the same APIs keep their path."""
    lib = _loaded_lib()
    if lib is None:
        raise RuntimeError("the emulator's libopapi.so is not loaded in this process yet (make an aclnn call first)")
    lib.npu_emu_reject_set.argtypes = [ctypes.c_char_p]
    lib.npu_emu_reject_set(",".join(apis).encode())


def pin_jit_compile_off():
    """torch_npu keeps "JIT compile" per thread, and a thread that starts without it may derive it from the
    chip ("on" for 910 and 310P), which sends ops down the aclop path (the emulator has none of it, and the
    failed call leaves torch_npu's task queue unusable). Pin it off in this thread and in the autograd
    engine's NPU worker thread (long-lived: a backward through a tensor hook sets it there once)."""
    import torch

    torch.npu.set_compile_mode(jit_compile=False)

    def pin(grad):
        torch.npu.set_compile_mode(jit_compile=False)
        return grad

    x = torch.ones(2, device="npu", requires_grad=True)
    y = x * 2
    y.register_hook(pin)
    y.sum().backward()
    torch.npu.synchronize()
