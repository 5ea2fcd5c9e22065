"""Build facts written once, shared by setup.py, the scripts and .ci/run: the torch releases the extension is
built and tested against, each with its torch_npu release, which of them CI runs and how far, and where
torch_npu's wheel keeps the headers the NPU kernels include.

    python3 build_config.py --torch-version            prints DEFAULT_TORCH (what the scripts install)
    python3 build_config.py --torch-npu-version 2.9.1  prints the torch_npu release paired with torch 2.9.1
                                                       (nothing, and exit 0, for a row without torch_npu)
    python3 build_config.py --tested                   prints the tested torch releases, one per line
    python3 build_config.py --role NAME                prints the release CI runs in that role (see ROLES)
"""
import os
import sys

# Each torch release the package is built and tested against, with the torch_npu release made for it, pinned
# exactly (None: no torch_npu line is paired with that torch, and its NPU part is not built). README,
# "Supported versions", says what runs on each; docs/releases.md holds the last check of every row. setup.py
# builds against whatever torch is installed; a release outside this table gets a one-line notice and is
# still built.
TESTED_RELEASES = {
    "2.7.1": "2.7.1.post11",
    "2.8.0": "2.8.0.post5",
    "2.9.1": "2.9.0.post9",
    "2.10.0": "2.10.0.post7",
    "2.11.0": "2.11.0.post3",
    "2.12.0": "2.12.0.post3",
    "2.13.0": "2.13.0",
    "2.14.0": "2.14.0",
    "2.15.0": None,
}

# What the scripts install when NPU_LOSS_OPS_TORCH_VERSION does not name another release: exactly
# torch==2.13.0 (and torch-npu==2.13.0), never a range, which would pull whatever release is newest.
DEFAULT_TORCH = "2.13.0"

# The architectures the package is built for. x86-64 runs everything natively; aarch64 (the host of most
# Ascend training servers) is cross-built and run under qemu-aarch64-static (scripts/aarch64.sh).
ARCHITECTURES = ("x86_64", "aarch64")


def _key(release):
    return tuple(int(part) for part in release.split("."))


def _with_npu():
    return sorted((r for r, npu in TESTED_RELEASES.items() if npu is not None), key=_key)


# The releases the checks run in a role, derived from the table above (`build_config.py --role NAME`). CI
# runs the default release only; every other release, and what CI runs of the default only in part, is a row
# of docs/releases.md (scripts/check_releases.sh).
ROLES = {
    "default": DEFAULT_TORCH,  # CI: CPU suite, NPU build check, emulated 910B and one other family, wheel
    "oldest-npu": _with_npu()[0],  # the oldest torch_npu line (README, "Supported versions")
    "newest": max(TESTED_RELEASES, key=_key),  # scripts/check_releases.sh's rebuild check (default, then this)
}

# How far each release's NPU kernels were taken; build_info()["npu_tested"] reports it. docs/releases.md has
# what scripts/check_releases.sh ran on every other row.
NPU_TESTED = {
    ROLES["default"]: "run on the emulated CANN in CI (910B and one other chip family per commit, in rotation; "
                      "every family by scripts/check_releases.sh)",
}
# Every other line with a torch_npu: its NPU build check and emulated 910B suite, on the registry's CUDA build of
# torch (for 2.10 to 2.12 and 2.14 through the emulated runs' test-harness step, tests/npu_emulator/README.md).
NPU_CHECKED_ELSEWHERE = ("built, symbol-checked and run on the emulated CANN (910B family) by "
                         "scripts/check_releases.sh (docs/releases.md has the last run)")


def release_of(version):
    """'2.9.1+cu128' -> '2.9.1': the release without its local build tag."""
    return version.split("+", 1)[0]


def torch_npu_release(torch_version):
    """The torch_npu release paired with a torch release (None when it is not a tested one or has none)."""
    return TESTED_RELEASES.get(release_of(torch_version))


def npu_tested(torch_version):
    """How far the NPU kernels were taken at this torch release (None when it has no tested torch_npu)."""
    release = release_of(torch_version)
    if TESTED_RELEASES.get(release) is None:
        return None
    return NPU_TESTED.get(release, NPU_CHECKED_ELSEWHERE)


def torch_npu_include_dirs(torch_npu_root):
    """The include directories of an installed torch_npu: its own headers, the CANN acl headers it ships,
    and op-plugin's (EXEC_NPU_CMD_EXT and the aclnn call machinery)."""
    include = os.path.join(torch_npu_root, "include")
    return [
        include,
        os.path.join(include, "third_party", "acl", "inc"),
        os.path.join(include, "third_party", "op-plugin"),
        os.path.join(include, "third_party", "op-plugin", "op_plugin", "include"),
    ]


def _main(argv):
    if argv == ["--torch-version"]:
        print(DEFAULT_TORCH)
    elif argv == ["--tested"]:
        print("\n".join(sorted(TESTED_RELEASES, key=_key)))
    elif len(argv) == 2 and argv[0] == "--role" and argv[1] in ROLES:
        print(ROLES[argv[1]])
    elif len(argv) == 2 and argv[0] == "--torch-npu-version":
        if release_of(argv[1]) not in TESTED_RELEASES:
            sys.exit(f"torch {argv[1]} is not a tested release ({', '.join(TESTED_RELEASES)})")
        print(TESTED_RELEASES[release_of(argv[1])] or "")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    _main(sys.argv[1:])
