"""Weight types: which GGML type each tensor gets, and its deterministic random bytes (:func:`draw`,
the one place values are generated)."""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from .plan import Init, Plan, SynthError, TensorSpec


WEIGHT_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "ud-q8-k-xl", "nvfp4-mix")
# Architectures whose graph at the pin multiplies routed experts by their per-expert NVFP4 ``scale_2``
# (``ffn_*_exps.scale``, read by build_moe_ffn): an NVFP4 mix of any other one would load and compute wrong.
NVFP4_SCALED_ARCHS = ("glm-dsa", "deepseek32")
CHUNK_BYTES = 32 << 20  # bytes generated and written at a time



# --- weight types and random data -------------------------------------------------------


def ggml_type_for(spec: TensorSpec, weight_type: str):
    """The GGML type a tensor gets under ``weight_type``."""
    from gguf import GGMLQuantizationType as T

    if spec.role in ("norm", "f32"):
        return T.F32
    if spec.role == "index":
        return T.I32
    quantizable = spec.ne[0] % 32 == 0
    if weight_type == "ud-q8-k-xl":
        if spec.role == "expert" and quantizable:
            return T.MXFP4
        return T.Q8_0 if quantizable else T.F16
    if weight_type == "nvfp4-mix":  # as a ModelOpt NVFP4 checkpoint converted by the pin: routed experts NVFP4
        if spec.role == "expert" and spec.ne[0] % 64 == 0:
            return T.NVFP4
        return T.Q8_0 if quantizable else T.F16
    simple = {"f32": T.F32, "f16": T.F16, "bf16": T.BF16}
    if weight_type in simple:
        return simple[weight_type]
    if weight_type in ("q8_0", "q4_0"):
        return (T.Q8_0 if weight_type == "q8_0" else T.Q4_0) if quantizable else T.F16
    raise SynthError(f"unknown weight type {weight_type!r}: choose one of {', '.join(WEIGHT_TYPES)}")


def _file_type(weight_type: str) -> int:
    from gguf import LlamaFileType as F

    return {
        "f32": F.ALL_F32, "f16": F.MOSTLY_F16, "bf16": F.MOSTLY_BF16, "q8_0": F.MOSTLY_Q8_0,
        "q4_0": F.MOSTLY_Q4_0, "ud-q8-k-xl": F.MOSTLY_MXFP4_MOE, "nvfp4-mix": F.MOSTLY_NVFP4,
    }[weight_type]


# NVFP4 as the pin stores it (ggml-common.h block_nvfp4: 4 UE4M3 sub-block scales, then 32 bytes of E2M1 pairs, 64
# values): value = kvalues_mxfp4[q] * ue4m3(d) / 2 (ggml-impl.h ggml_ue4m3_to_fp32), times the expert's scale_2
# (``ffn_*_exps.scale``, F32 per expert) in build_moe_ffn. Unlike the other quantized types (random blocks),
# nvfp4-mix quantizes the very values the f16 file of the same seed holds: its NMSE against that file is the
# quantization's own error. scale_2 = std / 448 puts a sub-block's amax / 6 well inside UE4M3's normal range
# (ModelOpt's per-tensor amax / (6 * 448), with amax near 6 std).
NVFP4_SCALE2_PER_STD = 1 / 448
_FP4_LEVELS = np.array([0, 1, 2, 3, 4, 6, 8, 12], dtype=np.float32)  # kvalues_mxfp4 magnitudes (E2M1 doubled)
_FP4_MIDPOINTS = (_FP4_LEVELS[1:] + _FP4_LEVELS[:-1]) / 2


def quantize_nvfp4(values: np.ndarray) -> np.ndarray:
    """float32 values (a multiple of 64) -> NVFP4 blocks (n, 36) uint8, as ggml-quants.c quantize_row_nvfp4_ref.

    The ``gguf`` package (0.19.0) decodes NVFP4 but refuses to encode it. Per 16-value
    sub-block: UE4M3 scale of amax / 6, then each value's nearest of kvalues_mxfp4 * scale (ties to the lower
    index, as best_index_mxfp4's first minimum; -0 is never chosen).
    """
    from gguf.quants import NVFP4

    x = values.reshape(-1, 4, 16).astype(np.float32)
    ue = NVFP4.fp32_to_ue4m3(np.abs(x).max(axis=-1) / 6.0)
    d = NVFP4.ue4m3_to_fp32(ue).astype(np.float32)[..., None]
    scaled = np.divide(np.abs(x), d, out=np.zeros_like(x), where=d > 0)
    level = np.searchsorted(_FP4_MIDPOINTS, scaled, side="left").astype(np.uint8)
    idx = np.where((x < 0) & (level > 0), level + 8, level).astype(np.uint8)
    qs = idx[..., :8] | (idx[..., 8:] << 4)
    return np.concatenate([ue.astype(np.uint8), qs.reshape(-1, 32)], axis=1)


def typed_tensors(the_plan: Plan, weight_type: str) -> list[tuple[TensorSpec, Any]]:
    """Every tensor the file holds under ``weight_type`` with its GGML type.

    ``nvfp4-mix`` adds each NVFP4 expert tensor's per-expert ``scale_2`` (``blk.N.ffn_*_exps.scale``, F32,
    one value per expert), named as the pin's converter names them (conversion/base.py
    ``_flush_nvfp4_experts``) and loaded by llama-model.cpp's generic ``.scale`` pass.
    """
    from gguf import GGMLQuantizationType as T

    out = [(t, ggml_type_for(t, weight_type)) for t in the_plan.tensors]
    if weight_type != "nvfp4-mix":
        return out
    if the_plan.arch not in NVFP4_SCALED_ARCHS:
        raise SynthError(f"--type nvfp4-mix: the pinned llama.cpp's {the_plan.arch} graph ignores NVFP4's per-expert scales "
                         f"(only {', '.join(NVFP4_SCALED_ARCHS)} apply them); choose ud-q8-k-xl (MXFP4 experts) for {the_plan.arch}")
    scales = []
    for spec, ggml_type in out:
        if ggml_type == T.NVFP4:
            scales.append((TensorSpec(spec.name.removesuffix(".weight") + ".scale", (spec.ne[-1],), "f32",
                                      Init(mean=spec.init.std * NVFP4_SCALE2_PER_STD)), T.F32))
    if not scales:
        raise SynthError(f"--type nvfp4-mix: {the_plan.arch} has no routed experts to store in NVFP4; choose q8_0 or q4_0")
    return out + scales


def tensor_nbytes(spec: TensorSpec, ggml_type) -> int:
    from gguf import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[ggml_type]
    return spec.n_elements // block * size


def _rng(seed: int, arch: str, name: str) -> np.random.Generator:
    # the architecture is part of the stream: presets that share a layout (glm-dsa, deepseek32) get independent weights
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, zlib.crc32(arch.encode()), zlib.crc32(name.encode())])))


def _f16_scales(rng: np.random.Generator, n: int, base: float) -> np.ndarray:
    return (base * rng.uniform(0.5, 1.5, n)).astype(np.float16).view(np.uint8).reshape(n, 2)


def draw(spec: TensorSpec, ggml_type, seed: int, arch: str, *, from_values: bool = False) -> Iterator[bytes]:
    """The tensor's bytes by its :class:`Init`, in pieces of about CHUNK_BYTES, deterministic in (seed, arch, name).

    ``from_values`` (nvfp4-mix): a quantized tensor holds the values the F16 type would draw, quantized (Q8_0 by
    the ``gguf`` package, NVFP4 by :func:`quantize_nvfp4` over value / scale_2), instead of random blocks.
    """
    from gguf import GGML_QUANT_SIZES
    from gguf import GGMLQuantizationType as T

    rng = _rng(seed, arch, spec.name)
    init = spec.init
    std = np.float32(init.std)
    means = None if isinstance(init.mean, (int, float)) else np.asarray(init.mean, dtype=np.float32)
    block, block_bytes = GGML_QUANT_SIZES[ggml_type]
    row_elems = spec.ne[0]
    rows = spec.n_elements // row_elems
    row_bytes = row_elems // block * block_bytes
    rows_per_chunk = max(1, CHUNK_BYTES // max(row_bytes, 1))
    done = 0
    while done < rows:
        n_rows = min(rows_per_chunk, rows - done)
        n = n_rows * row_elems
        if ggml_type in (T.F32, T.F16, T.BF16):
            values = rng.standard_normal(n, dtype=np.float32) * std
            if means is not None:
                values += means[done * row_elems : done * row_elems + n]
            elif init.mean:
                values += np.float32(init.mean)
            if ggml_type == T.F32:
                yield values.tobytes()
            elif ggml_type == T.F16:
                yield values.astype(np.float16).tobytes()
            else:  # BF16: the top half of each float32
                yield (values.view(np.uint32) >> 16).astype(np.uint16).tobytes()
        elif ggml_type == T.I32:
            # tid2eid: n_expert_used distinct experts per token
            first = rng.integers(0, init.high, size=n // row_elems, dtype=np.int64)
            ids = (first[:, None] + np.arange(row_elems)[None, :]) % init.high
            yield ids.astype(np.int32).tobytes()
        elif from_values:
            from gguf.quants import quantize

            values = rng.standard_normal(n, dtype=np.float32) * std  # the F16 type's stream, value for value
            if ggml_type == T.NVFP4:
                yield quantize_nvfp4(values / np.float32(init.std * NVFP4_SCALE2_PER_STD)).tobytes()
            else:
                yield quantize(values.reshape(n_rows, row_elems), ggml_type).tobytes()
        else:
            if init.mean != 0.0:
                raise SynthError(f"internal: {spec.name} is quantized ({ggml_type.name}) but its init has a mean")
            n_blocks = n // block
            out = np.frombuffer(rng.bytes(n_blocks * block_bytes), dtype=np.uint8).reshape(n_blocks, block_bytes).copy()
            if ggml_type == T.Q8_0:  # f16 d, 32 x int8 (uniform: std ~ 74)
                out[:, :2] = _f16_scales(rng, n_blocks, init.std / 74.0)
            elif ggml_type == T.Q4_0:  # f16 d, 32 x 4-bit (q - 8: std ~ 4.6)
                out[:, :2] = _f16_scales(rng, n_blocks, init.std / 4.6)
            elif ggml_type == T.MXFP4:  # e8m0 scale (2^(e-128) in ggml), 32 x e2m1 (doubled: std ~ 5.2)
                e = 128 + int(round(math.log2(init.std / 5.2)))
                out[:, 0] = rng.integers(e - 1, e + 2, n_blocks, dtype=np.int64).astype(np.uint8)
            else:
                raise SynthError(f"no random generator for {ggml_type.name}")
            yield out.tobytes()
        done += n_rows
