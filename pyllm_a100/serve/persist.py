"""What a detached supervisor runs, on disk: ``request.json``, written once when a launch is prepared.

It holds the request as asked (the options' fields at its top level, the API key never: a key file's path at
most), what pyllm resolved it to (``resolved``: the model's files, port, devices, plan...) and the view `pyllm ps`
shows (``view``, computed once). :func:`read_launch` gives the supervisor the same launch back, nothing resolved
again; state.json (state.py) records only what changes while it runs.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ..home import PRIVATE_FILE, write_json_atomic
from ..models.gguf_files import resolve_model
from ..planning.capacity import Budget, Capacity
from ..rpc.devices import Device
from ..rpc.protocol import parse_endpoints
from ..rpc.worker import WorkerOptions
from .config import ServerConfig
from .options import ServeOptions
from .state import REQUEST



def config_json(config: ServerConfig) -> dict[str, Any]:
    """The resolved part of a server's launch."""
    return {
        "model": str(config.model.first),
        "port": config.port,
        "n_gpu_layers": config.n_gpu_layers,
        "tensor_split": list(config.tensor_split) if config.tensor_split is not None else None,
        "rpc": [str(e) for e in config.rpc],
        "devices": [dataclasses.asdict(d) for d in config.devices],
        "draft": None if config.draft is None else {
            "path": str(config.draft.files.first) if config.draft.files is not None else None,
            "spec_type": config.draft.spec_type, "n_max": config.draft.n_max},
        "capacity": None if config.capacity is None else dataclasses.asdict(config.capacity),
    }


def options_of(cls: type, data: dict[str, Any]) -> Any:
    """The options dataclass ``cls`` from the fields it has in ``data`` (a secret is never there)."""
    return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


def config_from_json(options: ServeOptions, data: dict[str, Any]) -> ServerConfig:
    """The config :func:`config_json` wrote: the model's files are read again (their headers), nothing is resolved."""
    from ..models.drafts import Draft

    draft = data.get("draft")
    if draft is not None:
        files = resolve_model(draft["path"], check_arch=False) if draft["path"] else None
        draft = Draft(files, draft["spec_type"], draft["n_max"])
    capacity = data.get("capacity")
    if capacity is not None:
        budget = capacity.pop("budget")
        capacity = Capacity(**capacity, budget=Budget(tuple(budget["per_device"]), budget["gpu"], budget["rule"]))
    return ServerConfig(options=options, model=resolve_model(data["model"]), port=data["port"],
                        n_gpu_layers=data["n_gpu_layers"],
                        tensor_split=tuple(data["tensor_split"]) if data["tensor_split"] is not None else None,
                        rpc=tuple(parse_endpoints(",".join(data["rpc"]))) if data["rpc"] else (),
                        devices=tuple(Device(**d) for d in data["devices"]), draft=draft, capacity=capacity)


def write_request(directory: Path, kind: str, request: dict[str, Any], resolved: dict[str, Any],
                  view: dict[str, Any]) -> None:
    """request.json, atomically and private (0600)."""
    write_json_atomic(directory / REQUEST, {**request, "kind": kind, "resolved": resolved, "view": view},
                      mode=PRIVATE_FILE)


def read_request(directory: Path) -> dict[str, Any]:
    """request.json as written; ``{}`` when it is missing or unreadable (an entry from before it, a hand-made one)."""
    try:
        data = json.loads((directory / REQUEST).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def target_of(data: dict[str, Any]) -> ServerConfig | WorkerOptions:
    """What request.json says to run: a resolved server, or a worker's options."""
    if data.get("kind") == "rpc-worker":
        return options_of(WorkerOptions, data)
    return config_from_json(options_of(ServeOptions, data), data["resolved"])
