"""Synthetic GGUF models with the real layouts (random weights): see writer's docstring."""

from __future__ import annotations

from .writer import PRESETS, WEIGHT_TYPES, SynthError, SynthResult, parse_size, quantize_nvfp4, synthesize

__all__ = ["PRESETS", "WEIGHT_TYPES", "SynthError", "SynthResult", "parse_size", "quantize_nvfp4", "synthesize"]
