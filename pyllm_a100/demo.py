"""The README's demo: a tiny synthetic DeepSeek-V4, a managed llama-server, one real chat request.

It shows the whole path a real deployment takes (model check, server start with load
progress, OpenAI-compatible request, clean stop) in seconds on any machine. The model
has random weights, so the answer is gibberish; the point is that every part runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from .server import Server
from .state import home
from .synth import synthesize

DEMO_PRESET = "tiny-deepseek4"


def demo_model() -> Path:
    """The demo model under $PYLLM_HOME/models (written once, reused)."""
    path = home() / "models" / f"{DEMO_PRESET}-demo.gguf"
    if not path.exists():
        synthesize(DEMO_PRESET, path, seed=42)
    return path


def run(say: Callable[[str], None] = print, prompt: str = "Say hello in three languages.") -> dict:
    """Synthesize, serve, ask once through the openai client, stop. Returns the figures."""
    from openai import OpenAI

    model = demo_model()
    say(f"model:  {model} (synthetic {DEMO_PRESET}, random weights)")
    started = time.monotonic()
    with Server(model, port=0, ctx_size=2048) as server:
        ready = time.monotonic() - started
        say(f"server: {server.openai_base_url} ready in {ready:.1f} s (llama-server pid {server.pid})")
        client = OpenAI(base_url=server.openai_base_url, api_key="none", max_retries=0)
        t0 = time.monotonic()
        reply = client.chat.completions.create(
            model=server.config.served_name, messages=[{"role": "user", "content": prompt}], max_tokens=32, temperature=0.7,
        )
        seconds = time.monotonic() - t0
        message = reply.choices[0].message
        text = message.content or getattr(message, "reasoning_content", None) or ""
        tokens = reply.usage.completion_tokens
        say(f"prompt: {prompt}")
        say(f"answer: {text!r}")
        say(f"        {tokens} tokens in {seconds:.2f} s = {tokens / seconds:.1f} tokens/s (random weights: the text is noise)")
    say("server stopped.")
    return {"ready_seconds": ready, "tokens": tokens, "tokens_per_second": tokens / seconds, "answer": text}
