"""Small helpers several test modules share that are neither samples (samples.py) nor references
(reference.py): a free TCP port for torch.distributed, and a dispatch mode that records the ops a call
runs."""
from __future__ import annotations

import os
import socket

from torch.utils._python_dispatch import TorchDispatchMode


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


class RecordOps(TorchDispatchMode):
    """Records the name of every op that reaches the dispatcher inside the `with` block, e.g.
    "npu_loss.l1_loss.default" or "aten.abs.default", in `.ops`, and runs it unchanged."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))
