"""The switches of lab/scripts/gpu-decode's bench columns (``BUILD+SWITCH[+SWITCH...]``, issue 23).

Each names the environment that turns one of our CUDA patches off (or an opt-in one on) inside the same binary, so
one build measures both sides in the same run; lab/scripts/gpu-token-check takes the same names.
"""

from __future__ import annotations

# name: (environment, what it does)
SWITCHES: dict[str, tuple[dict[str, str], str]] = {
    "GRAPH_OPT": ({"GGML_CUDA_GRAPH_OPT": "1"}, "the pin's multi-stream graph optimisation"),
    "UNFUSED": ({"LLAMA_DSV4_UNFUSED_COMPRESS": "1"}, "0013 off: the compressor's pooling as the pin's op chain"),
    "POOLSPLIT": ({"GGML_CUDA_DSV4_POOL_SPLIT": "1"}, "0017's split-window pooling (opt-in, not exact)"),
    "HC": ({"GGML_CUDA_DSV4_HC_FUSION": "1"}, "0022's hyper-connection fusions on"),
    "NOHC": ({"GGML_CUDA_DSV4_HC_FUSION": "0"}, "0022's hyper-connection fusions off"),
    "NOROWS": ({"GGML_CUDA_DISABLE_GET_ROWS_FUSION": "1"}, "0023 and 0027 off"),
    "NONORMQ8": ({"GGML_CUDA_DISABLE_NORM_Q8_1": "1"}, "0026 off: the norm writes no q8_1 copy"),
    "SLOTS1": ({"GGML_CUDA_MMVQ_SRC1_SLOTS": "1"}, "0028 off: one src1 cache slot"),
    "MOEROWS": ({"GGML_CUDA_MMVQ_MOE_MULTI_ROW_ALL": "1"}, "0029 on: the multi-row MUL_MAT_ID launch for every row"),
    **{f"DENSEROWS{n}": ({"GGML_CUDA_MMVQ_DENSE_MULTI_ROW": str(n)},
                         "0030 off" if n == 0 else f"0030 for dense rows of up to {n} K iterations") for n in (0, 2, 4, 8)},
    "GLUALIAS": ({"GGML_CUDA_MMVQ_GLU_OVER_SRC1": "1"}, "0031 on: gate+up+GLU fused over the dead activation"),
    "NOROPEFUSE": ({"GGML_CUDA_DISABLE_ROPE_OFFS_FUSION": "1"}, "0032 off: norm and rope as two kernels"),
    "POOLSERIAL": ({"GGML_CUDA_DSV4_POOL_SERIAL": "1"}, "0033 off: 0013's serial pooling kernel"),
    "OCCUPANCY": ({"GGML_CUDA_MMVQ_OCCUPANCY": "1"}, "0034 on: one-token dense MMVQ at 10 blocks per SM (48 registers)"),
    "NORMQ8SERIAL": ({"GGML_CUDA_NORM_Q8_SERIAL": "1"}, "0035 off: 0026's column-by-column norm + q8_1 kernel"),
    "MXFP4SPLIT": ({"GGML_CUDA_MMVQ_MXFP4_PAIR": "0"}, "0036 off: the MXFP4 up and gate dot products as two calls"),
    **{f"FATILES{n}": ({"GGML_CUDA_FA_KV_TILES_PER_BLOCK": str(n)},
                       f"0037 on: each flash-attention block takes up to {n} KV tiles (not bit-identical)") for n in (2, 8)},
    "HCCOMBSERIAL": ({"GGML_CUDA_DSV4_HC_COMB_SERIAL": "1"}, "0038 off: 0022's hc_post/FFN-half launches (Sinkhorn first)"),
    "VECD512": ({"GGML_CUDA_FA_VEC_D512": "1"}, "0039 on: one-token D=512 attention on the vector kernel (not bit-identical)"),
    "NOSIBLINGS": ({"GGML_CUDA_MMVQ_SIBLINGS": "0"}, "0040 off: one-token matmuls of one activation launched one by one"),
    **{f"SIBLINGS{n}": ({"GGML_CUDA_MMVQ_SIBLINGS": str(n)}, what) for n, what in (
        (2, "0041: sibling runs cut only where the next node reads their last matmul"),
        (3, "0041: as SIBLINGS2, and GLU pairs join the other matmuls of their activation"))},
    "NOMXFP4ROWS": ({"GGML_CUDA_MMVQ_MXFP4_WARP_ROWS": "0"}, "0042 off: one-token MXFP4 rows on mul_mat_vec_q"),
    "SLOTLRU": ({"LLAMA_SERVER_SLOT_LRU": "1"}, "0044 off: llama-server picks an idle slot by LRU alone (the pin's rule)"),
}
ENV_COLUMNS: dict[str, dict[str, str]] = {name: env for name, (env, _) in SWITCHES.items()}
