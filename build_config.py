"""Build facts written once, shared by setup.py, scripts/check_npu_build.py and scripts/setup_env.sh:
the torch releases the extension is built and tested against, each with its torch_npu release, and where
torch_npu's wheel keeps the headers the NPU kernels include.

    python3 build_config.py --torch-version            prints DEFAULT_TORCH (what the scripts install)
    python3 build_config.py --torch-npu-version 2.9.1  prints the torch_npu release paired with torch 2.9.1
    python3 build_config.py --tested                   prints the tested torch releases, one per line
"""
import os
import sys

# Each torch release the package is built and tested against, with the torch_npu release made for it
# (README, "Supported versions", says what runs on each). setup.py builds against whatever torch is
# installed; a release outside this table gets a one-line notice and is still built.
TESTED_RELEASES = {
    "2.9.1": "2.9.0.post9",
    "2.13.0": "2.13.0",
    "2.14.0": "2.14.0",
}

# How far the NPU kernels were taken on each tested release's torch_npu; build_info() reports it.
NPU_TESTED = {
    "2.9.1": "run on the emulated CANN (910B and 950 families)",
    "2.13.0": "run on the emulated CANN (every chip family)",
    "2.14.0": "compiled, linked and symbol-checked only: torch-npu 2.14.0 does not import on the registry's "
    "torch 2.14.0 (a CUDA build), so its kernels were never run",
}

# What the scripts install when NPU_LOSS_OPS_TORCH_VERSION does not name another release: exactly
# torch==2.13.0 (and torch-npu==2.13.0), never a range, which would pull whatever release is newest.
DEFAULT_TORCH = "2.13.0"


def release_of(version):
    """'2.9.1+cu128' -> '2.9.1': the release without its local build tag."""
    return version.split("+", 1)[0]


def torch_npu_release(torch_version):
    """The torch_npu release paired with a torch release (None when it is not a tested one)."""
    return TESTED_RELEASES.get(release_of(torch_version))


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
        print("\n".join(TESTED_RELEASES))
    elif len(argv) == 2 and argv[0] == "--torch-npu-version":
        npu = torch_npu_release(argv[1])
        if npu is None:
            sys.exit(f"torch {argv[1]} is not a tested release ({', '.join(TESTED_RELEASES)})")
        print(npu)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    _main(sys.argv[1:])
