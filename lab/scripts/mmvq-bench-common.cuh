// Shared by the standalone MMVQ programs (lab/scripts/dsv4-mmvq-bench.cu, dsv4-mxfp4-bench.cu, mmvq-id-row-bound-check.cu),
// included after mmvq.cu and fusion-check-common.cuh: the rest of ggml's host side that mmvq.cu refers to, random
// weights and activations, and the timing loop.
#pragma once

#include <cstring>
#include <vector>

extern "C" {
bool ggml_is_quantized(enum ggml_type) { not_here("ggml_is_quantized"); }
int64_t ggml_blck_size(enum ggml_type t) { return t == GGML_TYPE_MXFP4 ? QK_MXFP4 : QK8_0; }  // the types used here
}

// Random Q8_0 or MXFP4 blocks filling h (deterministic: frand).
static void fill_weights(std::vector<char> & h, ggml_type type) {
    if (type == GGML_TYPE_Q8_0) {
        for (size_t b = 0; b < h.size() / sizeof(block_q8_0); ++b) {
            block_q8_0 blk;
            blk.d = __float2half(frand(1e-3f, 1e-2f));
            for (int i = 0; i < QK8_0; ++i) blk.qs[i] = (int8_t) frand(-127.0f, 127.0f);
            memcpy(h.data() + b * sizeof(blk), &blk, sizeof(blk));
        }
    } else {
        for (size_t b = 0; b < h.size() / sizeof(block_mxfp4); ++b) {
            block_mxfp4 blk;
            blk.e = (uint8_t) (120 + (int) frand(0.0f, 10.0f));
            for (int i = 0; i < QK_MXFP4 / 2; ++i) blk.qs[i] = (uint8_t) frand(0.0f, 255.99f);
            memcpy(h.data() + b * sizeof(blk), &blk, sizeof(blk));
        }
    }
}

// n random q8_1 blocks: an activation as quantize_q8_1 leaves it (scale, sum, 32 int8)
static std::vector<block_q8_1> random_q8_1(size_t n) {
    std::vector<block_q8_1> y(n);
    for (block_q8_1 & b : y) {
        b.ds = make_half2(__float2half(frand(1e-3f, 1e-1f)), __float2half(frand(-10.0f, 10.0f)));
        for (int i = 0; i < QK8_1; ++i) b.qs[i] = (int8_t) frand(-127.0f, 127.0f);
    }
    return y;
}

// Microseconds per call of launch(i), i the call's number (it picks the weight copy): 20 calls to warm up, 300 timed.
template <typename F> static float us_per_call(F && launch, cudaEvent_t e0, cudaEvent_t e1, cudaStream_t st = 0) {
    for (int i = 0; i < 20; ++i) launch(i);
    CK(cudaEventRecord(e0, st));
    const int n = 300;
    for (int i = 0; i < n; ++i) launch(i);
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return 1000.0f * ms / n;
}
