"""Model files: GGUF shard sets (shards) and headers, local (gguf_files, gguf_header) and remote
(gguf_remote), downloads from a hub or the package index (fetch, fetch_pypi), and speculative-decoding
drafts (drafts)."""
