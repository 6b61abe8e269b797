"""What a synthetic model is made of: tensor specs with their random init (:class:`Init`, the
rule in the package docstring), collected in a :class:`Plan` by each architecture's planner."""

from __future__ import annotations

import dataclasses
import math
from typing import Any


from ..errors import PyllmError



class SynthError(PyllmError, ValueError):
    """``unknown preset 'x': choose one of tiny-deepseek4, ...``"""


# --- tensor plans -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Init:
    """How a tensor's values are drawn: ``mean + std * N(0, 1)`` per element.

    ``mean`` is a number or one value per element (small tensors: hyper-connection bases);
    ``high`` makes an I32 hash-routing table of ids in ``[0, high)`` instead.
    """

    std: float = 0.0
    mean: float | tuple[float, ...] = 0.0
    high: int = 0


def reader(fan_in: int) -> Init:
    """A projection that reads an activation: unit-RMS in, unit-RMS out."""
    return Init(std=1.0 / math.sqrt(fan_in))


def writer(fan_in: int, depth: int, factor: float = 1.0) -> Init:
    """A projection whose output is added to the residual stream: all ``depth`` layers together add about one unit."""
    return Init(std=factor / math.sqrt(fan_in * 2 * depth))


EMBEDDING = Init(std=1.0)  # the residual stream enters the first layer at unit RMS
GAIN = Init(std=0.1, mean=1.0)  # RMSNorm / LayerNorm weights
BIAS = Init(std=0.01)  # router correction biases, LayerNorm biases
SINKS = Init(std=1.0)  # attention sink logits
POSITION_BIAS = Init(std=0.1)  # compressor position biases (APE)


def hc_base(hc: int, comb: bool = True) -> Init:
    """Hyper-connection bases at the identity point: pre 1/hc, post 1, comb 0.9 on the diagonal."""
    pre = [-math.log(hc - 1)] * hc  # sigmoid -> 1/hc
    if not comb:
        return Init(std=0.1, mean=tuple(pre))
    post = [0.0] * hc  # 2 * sigmoid -> 1
    diagonal = math.log(9 * (hc - 1))  # softmax row -> 0.9 on the diagonal, Sinkhorn keeps it
    mix = [diagonal if i == j else 0.0 for i in range(hc) for j in range(hc)]
    return Init(std=0.1, mean=tuple(pre + post + mix))


HC_SCALE = Init(std=0.01, mean=0.1)


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One tensor: GGUF name, shape in ggml order (``ne[0]`` contiguous), its role and its values.

    Roles: ``matrix`` (follows the weight type), ``expert`` (routed experts: MXFP4 in the
    UD-like mix), ``norm`` and ``f32`` (always F32: norms, biases, sinks, hyper-connection
    and compressor position tensors), ``index`` (I32 hash-routing table).
    """

    name: str
    ne: tuple[int, ...]
    role: str
    init: Init = Init()

    @property
    def n_elements(self) -> int:
        return math.prod(self.ne)


@dataclasses.dataclass
class Plan:
    arch: str
    n_layers: int
    kv: list[tuple[str, Any, str]]  # key, value, gguf type name ("u32", "f32", "bool", "str", "u32[]", "f32[]")
    tensors: list[TensorSpec]

    def add(self, key: str, value: Any, kind: str) -> None:
        self.kv.append((f"{self.arch}.{key}" if not key.startswith(("general.", "tokenizer.")) else key, value, kind))

    def tensor(self, name: str, ne: tuple[int, ...], role: str = "matrix", init: Init | None = None) -> None:
        """Add a tensor; ``init`` defaults to ``reader(ne[0])`` for matrices and experts, ``GAIN`` for norms."""
        ne = tuple(int(n) for n in ne)
        if init is None:
            defaults = {"matrix": reader(ne[0]), "expert": reader(ne[0]), "norm": GAIN}
            if role not in defaults:
                raise SynthError(f"internal: {name} ({role}) needs an explicit init: pass init=BIAS, SINKS, "
                                 "POSITION_BIAS, reader(fan_in) or Init(std=..., mean=...) by the module's rule")
            init = defaults[role]
        if not isinstance(init.mean, (int, float)) and len(init.mean) != math.prod(ne):
            raise SynthError(f"internal: {name} has {math.prod(ne)} elements but {len(init.mean)} means")
        self.tensors.append(TensorSpec(name, ne, role, init))
