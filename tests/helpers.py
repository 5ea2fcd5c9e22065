"""Small helpers several test modules share that are neither samples (samples.py) nor references
(reference.py): a free TCP port for torch.distributed, a dispatch mode that records the ops a call runs, a
script's results at one CPU instruction set,
the repository's build_config.py, the package under test's folder, temporary venvs with this torch and an
installed copy of the package, and every bfloat16 value."""
from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import venv
from types import ModuleType
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def repo_module(path: str) -> ModuleType:
    """A Python file of the repository (a path under it), loaded by path."""
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO_ROOT, path))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_config() -> ModuleType:
    """The repository's build_config.py (the tested torch / torch_npu releases), loaded by path."""
    return repo_module("build_config.py")


def venv_with_this_torch(path: str) -> str:
    """A new venv (its python returned) whose only addition is a .pth naming the directory this torch is
    installed in: torch (and what sits beside it) without a second install. A .pth line adds a directory;
    the .pth files inside it, such as an editable install's finder, are not run."""
    import torch

    venv.create(path, with_pip=False)
    python = os.path.join(path, "bin", "python")
    with open(os.path.join(site_packages(python), "_this_torch.pth"), "w") as f:
        f.write(os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__))) + "\n")
    return python


def site_packages(python: str) -> str:
    return subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()


def built_package_dir() -> str:
    """This environment's built package folder (the sources with the compiled libraries)."""
    import npu_loss_ops

    return os.path.dirname(os.path.abspath(npu_loss_ops.__file__))


def package_parent() -> str:
    """The directory the package under test is imported from: the checkout for an editable or in-place
    build, site-packages for an installed wheel. A subprocess started there (`python -c` puts its working
    directory first on sys.path) imports that same package, never a checkout's unbuilt source folder."""
    return os.path.dirname(built_package_dir())


def install_built_copy(python: str) -> str:
    """What a plain `pip install .` leaves in a venv: the package folder with its compiled libraries, here
    copied from this environment's build. Returns the installed folder."""
    installed = os.path.join(site_packages(python), "npu_loss_ops")
    shutil.copytree(built_package_dir(), installed, ignore=shutil.ignore_patterns("__pycache__"))
    return installed


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on right now (for a gloo process group)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_gloo(rank: int, world: int, store_dir: str) -> None:
    """Joins a gloo process group of `world` processes through a file store in `store_dir`. A file store rather
    than a TCP one: the rank hosting a TCPStore can abort at exit while its peer is still disconnecting
    ("terminate called without an active exception", about one run in ten under load)."""
    import torch.distributed as dist

    store = f"file://{os.path.join(store_dir, 'store')}"
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world)


def leave_gloo(finished: bool) -> None:
    """Ends a two-process test worker: waits for the other rank (when this one finished its work) and exits
    without tearing anything down. Neither gloo's process-group teardown (destroy_process_group) nor the
    interpreter's runs: after the work is done and saved, either one sometimes aborts under load inside torch
    ("terminate called without an active exception" at exit; once, glibc's abort "malloc(): unaligned
    tcache chunk detected" at the end of a DTensor worker's run, which did not recur in 19 further runs, 10 of
    them with MALLOC_CHECK_=3). The operating system closes the sockets. A worker that raised exits with status 1, so
    the parent still sees the failure."""
    import torch.distributed as dist

    if finished:
        dist.barrier()
    os._exit(0 if finished else 1)


def run_ranks(worker: Callable, args: tuple, nprocs: int, time_limit: float, what: str) -> None:
    """Runs worker(rank, *args) in `nprocs` spawned processes and waits for them all; past `time_limit` seconds
    kills them and fails the test, naming `what` ("the two DTensor processes")."""
    import time

    import pytest
    import torch.multiprocessing as mp

    context = mp.start_processes(worker, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + time_limit
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"{what} took more than {time_limit} s")


class RecordOps(TorchDispatchMode):
    """Records the name of every op that reaches the dispatcher inside the `with` block, e.g.
    "npu_loss.l1_loss.default" or "aten.abs.default", in `.ops`, and runs it unchanged."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def backward_eager_and_compiled(
    make_loss: Callable[[], tuple[torch.Tensor, list[torch.Tensor]]],
) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None], list[str]]:
    """``make_loss()`` returns a loss and the leaves it was made from (fresh each call). The loss's .backward()
    runs once eagerly and once under compiled autograd (each graph compiled fullgraph with the eager backend):
    the leaves' gradients of each, and the code of the graphs compiled autograd captured."""
    import torch._dynamo

    captured: list[str] = []

    def compiler_fn(gm: torch.fx.GraphModule) -> Callable[..., object]:
        captured.append(gm.code)
        return torch.compile(gm, backend="eager", fullgraph=True)

    results = []
    for compiled in (False, True):
        loss, leaves = make_loss()
        torch._dynamo.reset()
        try:
            if compiled:
                with torch._dynamo.compiled_autograd._enable(compiler_fn):
                    loss.backward()
            else:
                loss.backward()
        finally:
            torch._dynamo.reset()
        results.append([t.grad for t in leaves])
    return results[0], results[1], captured


def results_at_isa(script: str, isa: str, out_dir: str) -> list:
    """The results a script computes with the CPU kernels of one instruction set (NPU_LOSS_OPS_CPU_ISA), in a
    fresh interpreter: the script gets the output path and the tests' folder as sys.argv[1:3], and saves
    {"isa": build_info()["cpu_isa"], "results": [...]} there."""
    path = os.path.join(out_dir, f"results-{isa}.pt")
    proc = subprocess.run([sys.executable, "-c", script, path, os.path.dirname(os.path.abspath(__file__))],
                          env={**os.environ, "NPU_LOSS_OPS_CPU_ISA": isa}, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = torch.load(path)
    assert out["isa"] == isa, f"ran at {out['isa']}, not {isa}"
    return out["results"]


def every_bfloat16() -> torch.Tensor:
    """Every bfloat16 bit pattern (65,536, NaNs and infinities included), as float32 values."""
    return (torch.arange(0, 1 << 16, dtype=torch.int32) << 16).view(torch.float32)
