"""Build facts written once, shared by setup.py, scripts/check_npu_build.py and scripts/setup_env.sh:
the torch release the extension is built and tested against, and where torch_npu's wheel keeps the headers
the NPU kernels include.

    python3 build_config.py --torch-version     prints TORCH_VERSION (how the shell scripts read the pin)
"""
import os
import sys

# The only torch release supported (torch_npu's release matches it).
TORCH_VERSION = "2.13.0"


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


if __name__ == "__main__":
    if sys.argv[1:] != ["--torch-version"]:
        sys.exit("usage: python3 build_config.py --torch-version")
    print(TORCH_VERSION)
