"""The GPU lab's measuring helpers: scripts and benchmarks under lab/ import these; the package never does."""
