"""python run_script.py SCRIPT [ARGS...]: runs SCRIPT as __main__, with ARGS, after importing torch_npu through
emulator.import_torch_npu() (c10_keys.py's step, in an emulated run). For the user-facing scripts the emulated
runs start (examples/), which import torch_npu as users do: their `import torch_npu` then finds it loaded.
"""
import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import emulator  # noqa: E402

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python run_script.py SCRIPT [ARGS...]")
    emulator.import_torch_npu()
    script = os.path.abspath(sys.argv[1])
    sys.argv = [script, *sys.argv[2:]]
    sys.path.insert(0, os.path.dirname(script))
    runpy.run_path(script, run_name="__main__")
