"""A serve request resolved once: :func:`resolve` turns :class:`ServeOptions` into a frozen :class:`ServerConfig`.

Resolution happens here and nowhere else, in this order, so that a bad argument is reported as such even when,
say, the port is busy: the arguments themselves (validate.py), the model files and the draft, the devices llama.cpp
will see (placement.py: NVML once, each RPC worker once), the layers to offload, the KV pool's plan (sizing.py),
then the port. Nothing edits the result; the supervisor runs it as request.json holds it (persist.py).
"""

from __future__ import annotations

from . import placement, sizing, validate
from ..errors import PortInUse, ServerConfigError
from ..models.drafts import refuse_as_model
from ..models.drafts import resolve as resolve_draft
from ..models.gguf_files import ModelFiles, resolve_model
from ..process.net import bind_refusal, free_port, is_loopback
from .config import ServerConfig
from .llama_flags import ALL_LAYERS
from .options import ServeOptions


def resolve(options: ServeOptions, *, require_api_key: bool = True) -> ServerConfig:
    """Validate every input before anything starts and resolve the request; one clear error per mistake.
    ``require_api_key``: a non-loopback host needs options.api_key_file (`pyllm serve` writes one after this)."""
    parsed = validate.check(options, require_api_key=require_api_key)
    options = parsed.request  # its paths made absolute, no secret in it
    files = options.model if isinstance(options.model, ModelFiles) else resolve_model(options.model)
    refuse_as_model(files)
    draft = None
    if options.draft is not None:
        draft = resolve_draft(files, options.draft, options.draft_max).with_default_max()
    where = placement.place(options, parsed, files)
    n_gpu_layers = options.n_gpu_layers
    if n_gpu_layers is None:  # all layers on the GPUs (remote devices hold layers too)
        n_gpu_layers = ALL_LAYERS if parsed.rpc or where.local else None
    planned = sizing.plan(files, options, parsed, where, n_gpu_layers, draft=draft is not None)
    port = options.port or free_port(options.host if is_loopback(options.host) else "0.0.0.0")
    refused = bind_refusal(options.host, port)  # last: a busy port never hides a mistake found above
    if refused:
        in_use, reason = refused
        if in_use:
            raise PortInUse(f"{reason}: pass another --port, or stop that server (pyllm ps / pyllm stop)")
        raise ServerConfigError(reason)
    return ServerConfig(options=options, model=files, port=port, n_gpu_layers=n_gpu_layers,
                        tensor_split=parsed.tensor_split, rpc=parsed.rpc, devices=where.devices, draft=draft,
                        capacity=planned, flags=parsed.flags)
