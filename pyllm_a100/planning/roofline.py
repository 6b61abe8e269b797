"""How fast decoding can be at best: weight bytes read per token against memory bandwidth.

At batch size 1 every generated token reads each dense weight once and, in a MoE layer,
only the routed experts it is sent to (``expert_used_count`` of ``expert_count``). The
token embedding is a lookup (one row). With ``--split-mode layer`` the GPUs take turns,
so the ceiling is set by one GPU's bandwidth, not their sum.

A forward of k tokens (a speculative verify, k sequences decoding together) reads each dense
weight once for all of them, but every expert that at least one of the k tokens is routed to:
with u of n experts per token, routed independently and uniformly, n (1 - (1 - u/n)^k) of them
(:meth:`WeightsPerToken.read_ratio`). With 256 experts and 6 per token, 8 tokens reach ~44
experts, so the experts' share grows ~7x. Real routing is correlated between neighbouring
tokens and reaches fewer: for a trained model this is an upper estimate of what a k-token
forward reads; for the synthetic files (random routers) it is the expectation. Either way it is
what the forward costs against one token if both stream at the same bandwidth.
"""

from __future__ import annotations

import dataclasses

from ..models.gguf_files import ModelFiles


@dataclasses.dataclass(frozen=True)
class WeightsPerToken:
    total_bytes: int  # every tensor in the model
    active_bytes: int  # what one decoded token reads
    expert_bytes: int  # routed experts, all of them
    experts_used: int
    experts: int

    def read_ratio(self, tokens: int) -> float:
        """Weight bytes a forward of ``tokens`` tokens reads against one token's (module docstring)."""
        per_expert = self.expert_bytes / self.experts if self.experts else 0.0
        dense = self.active_bytes - per_expert * self.experts_used
        return (dense + per_expert * distinct_experts(self.experts, self.experts_used, tokens)) / self.active_bytes

    def ceiling_tokens_per_second(self, bandwidth: float) -> float:
        """Decode tokens/s if every active byte streamed at ``bandwidth`` bytes/s and nothing else cost time."""
        return bandwidth / self.active_bytes


def distinct_experts(experts: int, used: int, tokens: int) -> float:
    """Expected number of distinct experts ``tokens`` tokens are routed to, ``used`` of ``experts`` each, independently
    and uniformly: n (1 - (1 - u/n)^k)."""
    return experts * (1 - (1 - used / experts) ** tokens) if experts else 0.0


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
