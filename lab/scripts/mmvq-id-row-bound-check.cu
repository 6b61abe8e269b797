// One-token MUL_MAT_ID through mul_mat_vec_q_switch_ncols_dst (the host dispatch llama.cpp's
// ggml_cuda_mul_mat_vec_q reaches, with its argument layout for MUL_MAT_ID: an activation per expert, 6 of 16 experts)
// against one mul_mat_vec_q launch of one row per block (rows_per_block = 1, no row bound check needed). Rows 64 and 66
// at a K short enough for the small-K launch (nwarps rows per block): before vendor/patches 0033, 66 rows wrote their
// last block's two extra rows into the next expert's first two (the bound check read the channel stride), so rows 0-1
// of every expert but the last came out wrong (or raced). MXFP4 at K = 1024 (66 rows; 64 rows take 0032's kernel,
// whose additions come in another order: compared to 1e-5 of the RMS) and Q8_0 at K = 512. Built like
// lab/scripts/dsv4-mmvq-bench.cu:
//
//   T=llama.cpp/ggml/src/ggml-cuda
//   nvcc -O3 -std=c++17 -use_fast_math -extended-lambda -DGGML_USE_CUDA -DNDEBUG \
//        -gencode arch=compute_80,code=[sm_80,compute_80] -I$T -I$T/.. -I$T/../../include \
//        lab/scripts/mmvq-id-row-bound-check.cu -o mmvq-id-row-bound-check
//   ./mmvq-id-row-bound-check     # exit 0: every output within 1e-5 of the RMS of the one-row-per-block launch's
#include "mmvq.cu"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "fusion-check-common.cuh"
#include "mmvq-bench-common.cuh"


template <ggml_type type> static int check(int rows, int K) {
    constexpr int n_expert = 16, n_used = 6;
    const bool mx = type == GGML_TYPE_MXFP4;
    const int bs = mx ? (int) sizeof(block_mxfp4) : (int) sizeof(block_q8_0), qk = mx ? QK_MXFP4 : QK8_0;
    const int bpr = K / qk;
    std::vector<char> hw((size_t) bpr * bs * rows * n_expert);
    fill_weights(hw, type);
    const std::vector<block_q8_1> hy = random_q8_1((size_t) (K / QK8_1) * n_used);
    const std::vector<int32_t> hids = {3, 14, 7, 0, 11, 5};
    char * w = dev(hw);
    block_q8_1 * y = dev(hy);
    int32_t * ids = dev(hids);
    const size_t nout = (size_t) rows * n_used;
    float * d_switch = (float *) dev_nan(nout * sizeof(float));
    float * d_ref = (float *) dev_nan(nout * sizeof(float));
    const ggml_cuda_mm_fusion_args_device f{};
    const int s11 = K / QK8_1;
    // ggml_cuda_mul_mat_vec_q's MUL_MAT_ID arguments: src1 (K, n_used, 1), dst (rows, n_used, 1)
    mul_mat_vec_q_switch_ncols_dst<type>(w, y, ids, f, d_switch, K, rows, /*ncols_dst*/ 1, bpr, /*stride_col_y*/ n_used * s11,
        /*stride_col_dst*/ rows * n_used, n_expert, /*nchannels_y*/ n_used, /*nchannels_dst*/ n_used, bpr * rows,
        /*stride_channel_y*/ s11, /*stride_channel_dst*/ rows, 1, 1, 0, 0, 0, /*ids_stride*/ n_used, 0);
    mul_mat_vec_q<type, 1, false><<<dim3(rows, n_used, 1), dim3(32, 4, 1)>>>(w, y, ids, f, d_ref, K,
        init_fastdiv_values(n_used), bpr, n_used * s11, rows * n_used, make_uint3(0, 0, 0), bpr * rows, s11, rows,
        init_fastdiv_values(1), 0, 0, 0, n_used);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<float> a(nout), r(nout);
    CK(cudaMemcpy(a.data(), d_switch, nout * sizeof(float), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(r.data(), d_ref, nout * sizeof(float), cudaMemcpyDeviceToHost));
    double rms = 0;
    for (float v : r) rms += (double) v * v;
    rms = std::sqrt(rms / nout);
    int bad = 0, first = -1;
    for (size_t i = 0; i < nout; ++i) {
        if (!(std::fabs(a[i] - r[i]) <= 1e-5 * rms)) {
            bad++;
            if (first < 0) first = (int) i;
        }
    }
    printf("%-6s K %5d rows %3d: %s", mx ? "MXFP4" : "Q8_0", K, rows, bad ? "WRONG" : "ok");
    if (bad) printf(" (%d of %zu outputs; first: expert slot %d row %d)", bad, nout, first / rows, first % rows);
    printf("\n");
    CK(cudaFree(w));
    CK(cudaFree(y));
    CK(cudaFree(ids));
    CK(cudaFree(d_switch));
    CK(cudaFree(d_ref));
    return bad ? 1 : 0;
}

int main() {
    int failures = 0;
    for (int rows : {64, 66}) {
        failures += check<GGML_TYPE_MXFP4>(rows, 1024);
        failures += check<GGML_TYPE_Q8_0>(rows, 512);
    }
    printf("%s\n", failures ? "FAIL" : "every one-token MUL_MAT_ID output matches the one-row-per-block launch's");
    return failures ? 1 : 0;
}
