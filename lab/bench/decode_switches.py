"""The switches of python -m lab.runs.gpu_decode's bench columns (``BUILD+SWITCH[+SWITCH...]``, issue 23).

Each names the environment that turns a measured patch on or off inside the same binary, so one build measures both
sides in the same run; python -m lab.runs.gpu_token_check takes the same names. The shipped series has no such switch any
more (vendor/patches: the default path only, but LLAMA_SERVER_SLOT_LRU, which users may want): these are the pin's own
and those of the measured patches in lab/patches. To measure a shipped patch on and off, build the series
up to it and without it (gpu-decode --levels).
"""

from __future__ import annotations

# name: (environment, what it does); patch numbers are the old series' (lab/patches/README.md gives each one's slug),
# but 0034's
SWITCHES: dict[str, tuple[dict[str, str], str]] = {
    "GRAPH_OPT": ({"GGML_CUDA_GRAPH_OPT": "1"}, "the pin's multi-stream graph optimisation"),
    "POOLSPLIT": ({"GGML_CUDA_DSV4_POOL_SPLIT": "1"}, "0017's split-window pooling (opt-in, not exact)"),
    "MOEROWS": ({"GGML_CUDA_MMVQ_MOE_MULTI_ROW_ALL": "1"}, "0029 on: the multi-row MUL_MAT_ID launch for every row"),
    "GLUALIAS": ({"GGML_CUDA_MMVQ_GLU_OVER_SRC1": "1"}, "0031 on: gate+up+GLU fused over the dead activation"),
    "POOLSERIAL": ({"GGML_CUDA_DSV4_POOL_SERIAL": "1"}, "0033 off: 0013's serial pooling kernel"),
    "OCCUPANCY": ({"GGML_CUDA_MMVQ_OCCUPANCY": "1"}, "0034 on: one-token dense MMVQ at 10 blocks per SM (48 registers)"),
    "MXFP4SPLIT": ({"GGML_CUDA_MMVQ_MXFP4_PAIR": "0"}, "0036 off: the MXFP4 up and gate dot products as two calls"),
    **{f"FATILES{n}": ({"GGML_CUDA_FA_KV_TILES_PER_BLOCK": str(n)},
                       f"0037 on: each flash-attention block takes up to {n} KV tiles (not bit-identical)") for n in (2, 8)},
    "HCCOMBSERIAL": ({"GGML_CUDA_DSV4_HC_COMB_SERIAL": "1"}, "0038 off: 0022's hc_post/FFN-half launches (Sinkhorn first)"),
    "VECD512": ({"GGML_CUDA_FA_VEC_D512": "1"}, "0039 on: one-token D=512 attention on the vector kernel (not bit-identical)"),
    **{f"SIBLINGS{n}": ({"GGML_CUDA_MMVQ_SIBLINGS": str(n)}, what) for n, what in (
        (2, "0041: sibling runs cut only where the next node reads their last matmul"),
        (3, "0041: as SIBLINGS2, and GLU pairs join the other matmuls of their activation"))},
    "SLOTLRU": ({"LLAMA_SERVER_SLOT_LRU": "1"}, "0034 off: llama-server picks an idle slot by LRU alone (the pin's rule)"),
}
ENV_COLUMNS: dict[str, dict[str, str]] = {name: env for name, (env, _) in SWITCHES.items()}
