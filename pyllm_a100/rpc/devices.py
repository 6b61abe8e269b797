"""The devices llama.cpp will use for a model, and their order.

llama.cpp gives a model the RPC workers' devices first ("to minimize network transfers", src/llama.cpp), then the
local GPUs; ``--tensor-split`` follows that order. :func:`in_model_order` is that rule, for `pyllm serve` (device
records) and ``Llama(rpc=...)`` (ggml device handles) alike; :func:`list_devices` makes the records, asking each
worker once and taking the local GPUs as NVML saw them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .protocol import Endpoint, Worker, probe

T = TypeVar("T")
MIB = 2**20


@dataclasses.dataclass(frozen=True)
class Device:
    """One device a model may use: a local GPU (``gpu``: its nvidia-smi number) or a worker's (RPC0, RPC1...)."""

    name: str  # "CUDA0", "RPC0"
    description: str
    total_mib: int
    free_mib: int
    gpu: int | None = None

    @property
    def remote(self) -> bool:
        return self.name.startswith("RPC")

    @property
    def label(self) -> str:
        """``CUDA0 (GPU 2)`` for a local GPU by nvidia-smi's number, ``RPC1 (worker 10.0.0.2:50052)`` for a worker's."""
        if self.remote:
            return f"{self.name} (worker {self.description})"
        return f"{self.name} (GPU {self.gpu})" if self.gpu is not None else self.name


def in_model_order(devices: Sequence[T], remote: Callable[[T], bool]) -> list[T]:
    """``devices`` as llama.cpp hands them to a model: the workers' first, then the local ones, each in its order."""
    return [d for d in devices if remote(d)] + [d for d in devices if not remote(d)]


def worker_devices(workers: Sequence[Worker]) -> list[Device]:
    """The workers' devices as llama.cpp names them: RPC0, RPC1... in the order --rpc gives the workers, each
    described by its worker's endpoint (ggml-rpc.cpp, ggml_backend_rpc_add_server)."""
    out: list[Device] = []
    for worker in workers:
        for free, total in worker.memory:
            out.append(Device(f"RPC{len(out)}", str(worker.endpoint), total // MIB, free // MIB))
    return out


def list_devices(endpoints: Sequence[Endpoint] = (), gpus: Sequence[Any] = ()) -> list[Device]:
    """The devices a model would use, in its order: the workers' (each asked once: :func:`probe`), then the local
    GPUs (``gpus``: NVML's view, :func:`devices.gpus.visible_gpus`, as CUDA numbers them in the child)."""
    local = [Device(f"CUDA{i}", g.name, g.memory_total // MIB, g.memory_free // MIB, g.physical_index)
             for i, g in enumerate(gpus)]
    return in_model_order(worker_devices([probe(e) for e in endpoints]) + local, lambda d: d.remote)
