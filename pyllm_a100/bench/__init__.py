"""Measuring a llama-server, one module per `pyllm bench` command: run, tune, concurrency, agents, cotenancy,
verify, draft, speculate (both for one draft: the best draft length) and profile (ncu, one decode step's kernels);
what they share: client (requests of exact lengths, streamed) and draft_exactness (greedy tokens with and without
a draft)."""
