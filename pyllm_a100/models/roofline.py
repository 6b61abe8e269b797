"""How fast decoding can be at best: weight bytes read per token against memory bandwidth.

At batch size 1 every generated token reads each dense weight once and, in a MoE layer,
only the routed experts it is sent to (``expert_used_count`` of ``expert_count``). The
token embedding is a lookup (one row). With ``--split-mode layer`` the GPUs take turns,
so the ceiling is set by one GPU's bandwidth, not their sum.
"""

from __future__ import annotations

import dataclasses

from .gguf_files import ModelFiles


@dataclasses.dataclass(frozen=True)
class WeightsPerToken:
    total_bytes: int  # every tensor in the model
    active_bytes: int  # what one decoded token reads
    expert_bytes: int  # routed experts, all of them
    experts_used: int
    experts: int

    def ceiling_tokens_per_second(self, bandwidth: float) -> float:
        """Decode tokens/s if every active byte streamed at ``bandwidth`` bytes/s and nothing else cost time."""
        return bandwidth / self.active_bytes


def weights_per_token(files: ModelFiles) -> WeightsPerToken:
    """From the headers ``resolve_model`` already read (every shard's tensors and the metadata)."""
    arch, metadata = files.architecture, files.metadata
    experts = int(metadata.get(f"{arch}.expert_count") or 0)
    used = int(metadata.get(f"{arch}.expert_used_count") or 0)
    n_vocab = files.n_vocab
    active = expert_total = 0
    for name, size in files.tensor_bytes.items():
        if "_exps." in name and experts:
            expert_total += size
            active += size * used // experts
        elif name == "token_embd.weight" and n_vocab:
            active += size // n_vocab
        else:
            active += size
    return WeightsPerToken(sum(files.tensor_bytes.values()), active, expert_total, used, experts)
