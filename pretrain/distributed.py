"""Running on one process or many: what the training loop needs from torch.distributed.

A script runs single-process when started normally and data-parallel when started by
`torchrun --nproc_per_node=N ...` (which sets RANK, WORLD_SIZE, MASTER_ADDR, ...). Nothing
else changes: the same command line, the same code. The process group is created lazily,
the first time a training loop or a command asks for it, with gloo on CPU and NCCL on GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1

    @property
    def is_main(self) -> bool:
        """Only the main process writes outputs and shows progress."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def launched_size() -> int:
    """WORLD_SIZE as set by torchrun (1 when started as a plain process)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def local_size() -> int:
    """Processes on this machine (LOCAL_WORLD_SIZE from torchrun; 1 for a plain process).
    Differs from the world size when torchrun spans several nodes."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def world() -> World:
    """This process's place in the run, initialising the process group if torchrun started us."""
    if launched_size() > 1 and not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend())
    if dist.is_available() and dist.is_initialized():
        return World(rank=dist.get_rank(), size=dist.get_world_size())
    return World()


def device() -> torch.device:
    """Where this process trains: its GPU under NCCL, else the CPU."""
    if torch.cuda.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def from_main(value):
    """The main process's `value`, in every process (itself where there is no process group)."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    shared = [value]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    """Leave the process group (end of a command run under torchrun)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
