"""Model files: GGUF shard sets and headers (local and remote), downloads from a hub or the package
index (fetch, fetch_pypi), speculative-decoding drafts, and what a model needs (memplan, roofline)."""
