"""The emulated runs' test-harness step (npu_emulator/c10_keys.py), which lets torch_npu load into the registry's
CUDA build of torch, and its scope.

On any machine, and in every emulated suite: neither the installed package (the wheel's files, when the suite
runs from the wheel; with _C_npu, in an emulated run) nor csrc/ holds any of the step's names.
scripts/build_wheel.sh checks the wheel itself the same way.

On device="npu" under the emulated CANN: what the step removed when the suite's conftest imported torch_npu
(nothing on a +cpu torch; the two measured keys on the CUDA builds of the lines that need it), the step in a
fresh process (before, after, and once torch_npu registered its keys), and its refusals.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

import npu_loss_ops

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "npu_emulator"))
import c10_keys  # noqa: E402

# The torch_npu lines whose libtorch_npu.so registers the two measured keys again on the registry's (CUDA) torch
# of the same release (docs/releases.md). On a +cpu torch no line needs the step.
LINES_THAT_CLASH = {"2.10", "2.11", "2.12", "2.14"}


def _line():
    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def _expected_removal():
    if torch.version.cuda is None or _line() not in LINES_THAT_CLASH:
        return []
    return sorted(c10_keys.MEASURED)


# ---- scope, on any machine ------------------------------------------------------------------------------------


def test_the_scope_check_finds_the_step():
    """The check below can fail: it finds the step's names in the step's own files."""
    hits = c10_keys.containing([os.path.join(HERE, "npu_emulator")])
    assert any(hit.startswith(c10_keys.__file__) for hit in hits), hits
    for marker in c10_keys.MARKERS:
        assert any(hit.endswith(": " + marker.decode()) for hit in hits), marker


def test_the_installed_package_has_no_harness_step(device):
    """Also in each line's emulated suite (the device fixture), where the package is the NPU build, _C_npu in it."""
    package = os.path.dirname(os.path.abspath(npu_loss_ops.__file__))
    assert c10_keys.containing([package]) == []


def test_the_sources_have_no_harness_step(device):
    sources = [os.path.join(REPO_ROOT, name) for name in ("csrc", "npu_loss_ops", "setup.py", "build_config.py")]
    sources = [path for path in sources if os.path.exists(path)]
    assert os.path.join(REPO_ROOT, "csrc") in sources
    assert c10_keys.containing(sources) == []


# ---- the step, on the emulated NPU -----------------------------------------------------------------------------


@pytest.fixture
def emulated(device):
    if device != "npu":
        pytest.skip("the step runs where torch_npu is imported on the emulated CANN")
    if not os.environ.get(c10_keys.HELPER_VARIABLE):
        pytest.skip("not an emulated run (scripts/run_npu_emulated.sh sets " + c10_keys.HELPER_VARIABLE + ")")
    return device


@pytest.fixture
def fresh(emulated):
    """The tests that start processes of their own: the step does not depend on the chip, so they run on the 910B
    family only, which every emulated run has (and each process costs seconds of imports)."""
    if not os.environ.get("NPU_EMU_SOC", "").startswith("Ascend910B"):
        pytest.skip("the step in a fresh process runs on the emulated 910B family (it does not depend on the chip)")
    return emulated


def _fresh(code):
    """Runs code in a new process of this emulated run, after `import torch` and c10_keys; returns its JSON line."""
    script = f"import json, sys, torch\nsys.path.insert(0, {os.path.join(HERE, 'npu_emulator')!r})\nimport c10_keys\n"
    proc = subprocess.run([sys.executable, "-c", script + code], capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(REPO_ROOT))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_the_suite_process_removed_what_clashed(emulated):
    """conftest imported torch_npu through the step: it removed exactly the keys this line clashes on, and
    torch_npu registered each again."""
    assert "torch_npu" in sys.modules
    assert c10_keys.REMOVED == _expected_removal()
    assert set(c10_keys.REMOVED) <= c10_keys.keys()


def test_the_step_in_a_fresh_process(fresh):
    result, stderr = _fresh("""
before = c10_keys.keys()
removed = c10_keys.release_duplicated_keys()
after = c10_keys.keys()
c10_keys.import_torch_npu()
print(json.dumps({"form": c10_keys.key_set()[0], "before": sorted(before), "removed": removed,
                  "after": sorted(after), "final": sorted(c10_keys.keys())}))
""")
    before, after, final = set(result["before"]), set(result["after"]), set(result["final"])
    # "none" only on a torch whose c10 has no key set (2.7, 2.8), where nothing can clash.
    assert result["form"] in ("accessor", "storage") or (result["form"] == "none" and not result["before"])
    assert (result["form"] == "none") == (not c10_keys._declares_the_set())
    assert result["removed"] == _expected_removal()
    assert after == before - set(result["removed"])  # nothing else touched
    assert set(result["removed"]) <= final  # torch_npu registered them itself
    if result["removed"]:
        assert f"c10_keys: removed {result['removed']}" in stderr  # it reports what it removed
    else:
        assert before == after and "c10_keys: removed" not in stderr  # changes nothing where not needed


def test_the_step_refuses_once_torch_npu_is_imported(emulated):
    with pytest.raises(c10_keys.HarnessError, match="torch_npu is imported already"):
        c10_keys.release_duplicated_keys()


def test_a_torch_without_the_set_names_the_symbols(fresh):
    if not c10_keys._declares_the_set():
        pytest.skip("this torch's c10 has no allocator key set (torch 2.7, 2.8): the step has nothing to look for")
    result, _ = _fresh("""
c10_keys._ACCESSOR, c10_keys._STORAGE, c10_keys._GUARD = "no_such_accessor", "no_such_storage", "no_such_guard"
try:
    c10_keys.release_duplicated_keys()
    print(json.dumps({"error": None}))
except c10_keys.HarnessError as exc:
    print(json.dumps({"error": str(exc)}))
""")
    assert result["error"] and "no_such_accessor" in result["error"] and "no_such_storage" in result["error"]


def test_an_unknown_clashing_key_is_named_and_nothing_removed(fresh):
    """Were every key of the set registered by another library (libc10.so naming none of them) and named by
    torch_npu's library (a stand-in file naming them all), keys outside MEASURED would clash: the step names them
    and removes nothing."""
    if not c10_keys._declares_the_set():
        pytest.skip("this torch's c10 has no allocator key set (torch 2.7, 2.8): no key can clash")
    result, _ = _fresh("""
import os, tempfile
before = c10_keys.keys()
with tempfile.NamedTemporaryFile("wb", suffix=".so", delete=False) as fake:
    fake.write(b"\\0" + b"\\0".join(key.encode() for key in sorted(before)) + b"\\0")
real_names = c10_keys._names
c10_keys._libtorch_npu = lambda: fake.name
c10_keys._names = lambda path, keys: set() if path.endswith("libc10.so") else real_names(path, keys)
try:
    c10_keys.release_duplicated_keys()
    error = None
except c10_keys.HarnessError as exc:
    error = str(exc)
finally:
    os.unlink(fake.name)
print(json.dumps({"error": error, "unchanged": c10_keys.keys() == before, "removed": c10_keys.REMOVED,
                  "before": sorted(before), "set": c10_keys.key_set()[1] is not None}))
""")
    if not result["set"]:
        # Declared but never constructed (torch 2.9: neither CUDA nor torch_npu registers a key): no key can
        # clash, and the step does nothing.
        assert result["before"] == [] and result["error"] is None and result["removed"] == [], result
        return
    unknown = [key for key in result["before"] if key not in c10_keys.MEASURED]
    assert unknown and result["error"], result
    assert all(repr(key) in result["error"] for key in unknown), result
    assert result["unchanged"] and result["removed"] == []
