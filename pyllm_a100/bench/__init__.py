"""Measuring a running llama-server: throughput and tune, concurrency, speculative decoding, the
serving soak, memory against the plan, and the speculative exactness check."""
