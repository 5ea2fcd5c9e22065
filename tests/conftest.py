"""Test devices, the device suite and its summary.

Without NPU_LOSS_OPS_TEST_DEVICE every test runs, on the CPU. With it (a device name or a comma-separated
list, e.g. "npu"), the suite is exactly the tests that take the `device` fixture, each run once per listed
device: the same correctness, autograd, autocast, layout and error tests, on that device's tensors, with
each NPU result compared with the CPU kernels' result on the same inputs and with the float64 reference.
An NPU that was asked for but cannot be used (torch_npu does not import, no device, or npu_loss_ops
without its NPU kernels) fails every NPU test with the reason; it is never skipped.
"""
from __future__ import annotations

import collections
import heapq
import os
import sys

import pytest
import torch

DEVICE_VARIABLE = "NPU_LOSS_OPS_TEST_DEVICE"
DEVICE_SUITE = bool(os.environ.get(DEVICE_VARIABLE, "").strip())
DEVICES = [d.strip() for d in os.environ.get(DEVICE_VARIABLE, "").split(",") if d.strip()] or ["cpu"]

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "npu_emulator"))
import emulator  # noqa: E402  (import_torch_npu; torch_npu's per-thread JIT-compile mode: pin_jit_compile_off)

_torch_npu_error = None
if "npu" in DEVICES:
    try:
        # Before npu_loss_ops, which registers its NPU kernels only with torch_npu. In an emulated run, through the
        # test harness's step that lets torch_npu load into a CUDA build of torch (npu_emulator/c10_keys.py).
        emulator.import_torch_npu()
    except Exception as exc:  # without CANN torch_npu raises more than ImportError
        _torch_npu_error = f"import torch_npu failed: {type(exc).__name__}: {exc}"

import npu_loss_ops  # noqa: E402


def _npu_problem() -> str | None:
    """Why NPU tests cannot run here, or None."""
    if _torch_npu_error:
        return _torch_npu_error
    try:
        present = bool(torch.npu.is_available())
    except Exception as exc:  # noqa: BLE001
        return f"torch.npu.is_available() raised {type(exc).__name__}: {exc}"
    if not present:
        return "torch_npu imports but torch.npu.is_available() is False"
    if not npu_loss_ops.npu_kernels_available():
        return "npu_loss_ops' NPU kernels are not in use: " + npu_loss_ops.build_info()["npu_reason"]
    return None


NPU_PROBLEM = _npu_problem() if "npu" in DEVICES else None


def pytest_configure(config):
    # KL's 'mean' warning (PyTorch's own, reproduced by the API) is expected wherever 'mean' is tested.
    config.addinivalue_line("filterwarnings", "ignore:reduction. 'mean' divides the total loss:UserWarning")
    config.addinivalue_line("filterwarnings", "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
    global NPU_PROBLEM
    if "npu" in DEVICES and NPU_PROBLEM is None:
        try:
            emulator.pin_jit_compile_off()
        except Exception as exc:  # noqa: BLE001  (reported by every NPU test)
            NPU_PROBLEM = f"a first NPU backward failed: {type(exc).__name__}: {exc}"


def pytest_generate_tests(metafunc):
    if "device" in metafunc.fixturenames:
        metafunc.parametrize("device", DEVICES, indirect=True)


@pytest.fixture
def device(request) -> str:
    """The device type a test runs on, "cpu" or "npu" (from NPU_LOSS_OPS_TEST_DEVICE; "cpu" without it)."""
    name = request.param
    if name == "npu" and NPU_PROBLEM is None and not torch.npu.is_jit_compile_false():
        torch.npu.set_compile_mode(jit_compile=False)
    return name


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    # An unusable NPU fails each NPU test (in its call phase: FAILED, not an error at setup, never a skip).
    if NPU_PROBLEM is not None and _device_of(pyfuncitem) == "npu":
        pytest.fail(f"NPU tests requested ({DEVICE_VARIABLE}={os.environ.get(DEVICE_VARIABLE)}) but {NPU_PROBLEM}",
                    pytrace=False)


@pytest.fixture(autouse=True)
def _seeded_and_restored():
    """Every test starts from the same RNG state and leaves the thread count as it found it."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------------------------------------------
# The device suite: only the device tests, and on a slow device a subset of their samples


# Devices where each sample-driven test (one that takes a samples.Sample) runs on a representative subset
# of its samples: the emulated NPU costs ~0.3 ms per aclnn call, a test makes several, and CI runs the suite
# once per chip family. The subset (see `representative`) keeps about a fifth of the samples — every op,
# dtype combination, reduction, beta class / log_target, shape and broadcast kind, grad_output kind and
# layout at least twice — and leaves out float64 samples (rejected on the NPU; test_errors checks that).
# Tests without samples (special values, empty tensors, the error matrix, layouts, autocast) run in full.
# NPU_LOSS_OPS_TEST_FULL=1 runs every sample there too (about twice as long).
SUBSET_DEVICES = set() if os.environ.get("NPU_LOSS_OPS_TEST_FULL") == "1" else {"npu"}


def _device_of(item) -> str | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("device") if callspec else None


def _float64_on_npu(item) -> bool:
    """A sample with a float64 tensor, for the NPU: rejected there (TypeError, covered by test_errors)."""
    from samples import Sample

    return _device_of(item) == "npu" and any(
        isinstance(v, Sample) and v.has_float64 for v in item.callspec.params.values())


_features_cache: dict = {}


def _sample_features(s) -> set:
    # the samples are built once per session (samples.all_samples) and shared by the test kinds
    key = id(s)
    if key not in _features_cache:
        _features_cache[key] = (s, s.features())
    return _features_cache[key][1]


def _item_features(item) -> set | None:
    """The coverage features of a sample-driven test case (None when it takes no Sample)."""
    from samples import Sample

    params = item.callspec.params
    samples = [v for v in params.values() if isinstance(v, Sample)]
    if not samples:
        return None
    features = set().union(*(_sample_features(s) for s in samples))
    features |= {("param", k, repr(v)) for k, v in params.items() if k != "device" and not isinstance(v, Sample)}
    return features


# How many of a test's cases must show each feature (where that many have it): two, so no code path hangs
# on a single sample.
COVER = 2


def representative(items: list) -> list:
    """A deterministic subset of `items` (one test function's cases on one device) that still covers every
    feature the whole list covers, COVER times: every op, dtype combination, reduction, beta class /
    log_target, shape and broadcast kind, grad_output kind and layout, and the pairs of those that pick
    different code paths (see Sample.features). Greedy set cover, the first case winning ties."""
    features = [_item_features(it) for it in items]
    if any(f is None for f in features):
        return items
    need = collections.Counter(f for fs in features for f in fs)
    for f in need:
        need[f] = min(need[f], COVER)
    # Lazy greedy: a case's gain only shrinks as others are chosen, so a stale gain is an upper bound.
    heap = [(-len(fs), i) for i, fs in enumerate(features)]
    heapq.heapify(heap)
    chosen = set()
    remaining = sum(need.values())
    while heap and remaining:
        _, i = heapq.heappop(heap)
        gain = sum(1 for f in features[i] if need[f] > 0)
        if gain == 0:
            continue
        if heap and (-gain, i) > heap[0]:
            heapq.heappush(heap, (-gain, i))  # no longer the best: re-queue with its current gain
            continue
        chosen.add(i)
        for f in features[i]:
            if need[f] > 0:
                need[f] -= 1
                remaining -= 1
    return [it for i, it in enumerate(items) if i in chosen]


def pytest_collection_modifyitems(config, items):
    if not DEVICE_SUITE:
        return
    keep, drop = [], []
    groups = collections.defaultdict(list)
    for item in items:
        dev = _device_of(item)
        if dev is None:
            drop.append(item)  # not a device test: the CPU suite has it
        elif dev in SUBSET_DEVICES:
            groups[(item.module.__name__, item.originalname, dev)].append(item)
        else:
            keep.append(item)
    for group in groups.values():
        # float64 samples cannot run on the NPU: the subset covers what can
        chosen = {id(it) for it in representative([it for it in group if not _float64_on_npu(it)])}
        for it in group:
            (keep if id(it) in chosen else drop).append(it)
    order = {id(it): i for i, it in enumerate(items)}
    keep.sort(key=lambda it: order[id(it)])
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


# ---------------------------------------------------------------------------------------------------
# Summary: one line per test kind

_counts = collections.defaultdict(collections.Counter)


def _kind(nodeid: str) -> str:
    path, _, rest = nodeid.partition("::")
    module = os.path.splitext(os.path.basename(path))[0]
    return f"{module}::{rest.split('[')[0]}"


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and not report.passed):
        outcome = "skipped" if report.skipped else ("passed" if report.passed else "failed")
        _counts[_kind(report.nodeid)][outcome] += 1
    elif report.when == "teardown" and report.failed:
        _counts[_kind(report.nodeid)]["failed"] += 1


def _chip() -> str:
    if "npu" not in DEVICES:
        return ",".join(DEVICES)
    if NPU_PROBLEM is not None:
        return "npu-unavailable"
    return str(npu_loss_ops.build_info().get("npu_soc") or "npu")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not DEVICE_SUITE or not _counts:
        return
    chip = _chip()
    prefix = "npu-suite" if "npu" in DEVICES else "device-suite"
    terminalreporter.section(f"device suite on {','.join(DEVICES)} ({chip})")
    if "npu" in DEVICES:
        info = npu_loss_ops.build_info()
        terminalreporter.write_line(
            f"{prefix} {chip} npu_kernels_available()={npu_loss_ops.npu_kernels_available()} "
            f"chip family: {info.get('npu_chip', '-')} ({info['npu_reason']})")
        harness = sys.modules.get("c10_keys")  # the emulated runs' step (npu_emulator/c10_keys.py), when it ran
        if harness is not None:
            terminalreporter.write_line(f"{prefix} {chip} torch {torch.__version__}: the harness step removed "
                                        f"{harness.REMOVED or 'nothing'} before import torch_npu")
    total = collections.Counter()
    for kind in sorted(_counts):
        c = _counts[kind]
        total.update(c)
        terminalreporter.write_line(
            f"{prefix} {chip} {kind}: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped")
    terminalreporter.write_line(
        f"{prefix} {chip} total: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
