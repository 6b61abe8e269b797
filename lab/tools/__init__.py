"""CPU-side lab programs: python -m lab.tools.NAME (render_compat, reliability, gguf_keep_layers)."""
