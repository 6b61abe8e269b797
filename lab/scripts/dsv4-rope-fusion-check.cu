// Patch 0029's RMS_NORM [-> MUL] -> ROPE-with-offset [-> SET_ROWS] kernel against the kernels it replaces, bit for bit,
// on a GPU: rms_norm_f32 (the pin's launch, with and without the weight) then rope_norm (forward, as the ROPE or the
// fused ROPE + VIEW + SET_ROWS launch it), on the same random rows. DeepSeek-V4 shapes: q (64 heads of 512, 448
// channels unrotated, 1 and 7 tokens), kv and the attention compressor (512, weight, F16 cache rows), the indexer's
// compressor (128, weight, F32 rows), plus a YaRN case (ext_factor != 0) and a row of 2048 (the 1024-thread kernel).
// Then patch 0030's RMS_NORM + MUL + q8_1 kernel with its columns in registers against 0025's, rows of 512 to 8192.
// Built like lab/scripts/dsv4-hc-fusion-check.cu (its header), from a tree with vendor/patches (0001-0030) applied:
//
//   T=llama.cpp/ggml/src/ggml-cuda
//   nvcc -O3 -std=c++17 -use_fast_math -extended-lambda -DGGML_USE_CUDA -DNDEBUG \
//        -gencode arch=compute_80,code=[sm_80,compute_80] -I$T -I$T/.. -I$T/../../include \
//        lab/scripts/dsv4-rope-fusion-check.cu -o dsv4-rope-fusion-check
//   CUDA_CACHE_MAXSIZE=4294967296 ./dsv4-rope-fusion-check     # exit 0: every fused output equals the unfused one
#include "norm.cu"
#include "rope.cu"

#include <cstdio>
#include <cstring>
#include <vector>

#include "fusion-check-common.cuh"

struct rope_case {
    const char * name;
    int ncols, ne01, ne02, n_dims, n_offs;
    bool weight, f16, set_rows;
    float freq_scale, ext_factor;
};

static int failures = 0;

template <bool do_multiply, typename D>
static void run(const rope_case & c) {
    const int nrows = c.ne01 * c.ne02, n = c.ncols * nrows, cache_rows = 3 * c.ne02 + 5;
    std::vector<float> hx(n), hw(c.ncols);
    for (float & v : hx) v = frand(-3.0f, 3.0f);
    for (float & v : hw) v = frand(0.5f, 1.5f);
    std::vector<int32_t> hpos(c.ne02);
    std::vector<int64_t> hidx(c.ne02);
    for (int t = 0; t < c.ne02; ++t) { hpos[t] = 37 * t + 1000 + (int) frand(0, 30000); hidx[t] = 3 * t + 2; }
    float * x = dev(hx), * w = dev(hw);
    int32_t * pos = dev(hpos);
    int64_t * idx = dev(hidx);
    const size_t out_elems = c.set_rows ? (size_t) cache_rows * c.ncols * c.ne01 : (size_t) n;
    D * out_unfused = (D *) dev_nan(out_elems * sizeof(D)), * out_fused = (D *) dev_nan(out_elems * sizeof(D));
    float * normed = (float *) dev_nan(n * sizeof(float));
    const float eps = 1e-6f, freq_base = 10000.0f, attn_factor = 1.0f;
    const rope_corr_dims corr = {{ 5.0f, 27.0f }};
    const int s1 = c.ncols, s2 = c.ncols * c.ne01, s3 = s2 * c.ne02;
    const int set_rows_stride = c.set_rows ? c.ncols * c.ne01 : 0;
    const int64_t * row_indices = c.set_rows ? idx : nullptr;
    // unfused: the pin's launches (rms_norm_mul_f32_cuda takes the weight-less case to rms_norm_f32_cuda)
    rms_norm_mul_f32_cuda(x, do_multiply ? w : nullptr, nullptr, normed, c.ncols, c.ne01, c.ne02, 1,
                          c.ncols, (int64_t) c.ncols * c.ne01, (int64_t) n, 0, 0, 0, c.ncols, 1, 1, 1,
                          0, 0, 0, 0, 0, 0, 0, eps, 0);
    rope_norm_cuda<true, float, D>(normed, out_unfused, c.ncols, c.ne01, c.ne02, c.ncols, c.ncols * c.ne01, n, s1, s2, s3,
                                   c.n_dims, c.n_offs, nrows, pos, c.freq_scale, freq_base, c.ext_factor, attn_factor, corr,
                                   nullptr, row_indices, set_rows_stride, false, 0);
    rms_norm_rope_norm_offs_cuda<do_multiply, false, D>(x, do_multiply ? w : nullptr, out_fused, c.ncols, nrows, eps, c.ne01,
                                   c.ne02, s1, s2, s3, c.n_dims, c.n_offs, pos, c.freq_scale, freq_base, c.ext_factor,
                                   attn_factor, corr, nullptr, row_indices, set_rows_stride, 0);
    CK(cudaDeviceSynchronize());
    std::vector<D> a(out_elems), b(out_elems);
    CK(cudaMemcpy(a.data(), out_unfused, out_elems * sizeof(D), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b.data(), out_fused, out_elems * sizeof(D), cudaMemcpyDeviceToHost));
    size_t diff = 0, first = 0, written = 0;
    for (size_t i = 0; i < out_elems; ++i) {
        const bool unwritten = sizeof(D) == 4 ? *(const uint32_t *) &a[i] == 0xffffffffu : *(const uint16_t *) &a[i] == 0xffffu;
        written += !unwritten;
        if (memcmp(&a[i], &b[i], sizeof(D)) != 0 && diff++ == 0) first = i;
    }
    printf("%-44s %6zu values %s", c.name, written, diff ? "DIFFER" : "bit-identical");
    if (diff) {
        printf(": %zu, first at %zu", diff, first);
        failures++;
    }
    if (written != (size_t) n) {
        printf("  (expected %d written values)", n);
        failures++;
    }
    printf("\n");
    CK(cudaFree(x)); CK(cudaFree(w)); CK(cudaFree(pos)); CK(cudaFree(idx));
    CK(cudaFree(out_unfused)); CK(cudaFree(out_fused)); CK(cudaFree(normed));
}

// Patch 0030's rms_norm_mul_q8_1_regs_f32 (columns in registers, launched by the op's own rms_norm_mul_q8_1_regs_launch)
// against 0025's rms_norm_mul_q8_1_f32 (column by column): the normed output and its q8_1 copy, bit for bit.
static void run_norm_q8(const char * name, int ncols, int nrows, int w_rows) {
    const int n = ncols * nrows, nq = n / QK8_1, bs = ncols < 1024 ? 256 : 1024, np = rms_norm_mul_q8_1_nper(ncols, bs);
    std::vector<float> hx(n), hw((size_t) ncols * w_rows);
    for (float & v : hx) v = frand(-3.0f, 3.0f);
    for (int i = 0; i < 97 && i < n; ++i) hx[(size_t) i * 131 % n] = 0.0f;  // zeros, and below one all-zero q8_1 block
    for (int i = 0; i < QK8_1; ++i) hx[QK8_1 + i] = 0.0f;
    for (float & v : hw) v = frand(0.5f, 1.5f);
    float * x = dev(hx), * w = dev(hw);
    float * dst_a = (float *) dev_nan(n * sizeof(float)), * dst_b = (float *) dev_nan(n * sizeof(float));
    block_q8_1 * q_a = (block_q8_1 *) dev_nan(nq * sizeof(block_q8_1)), * q_b = (block_q8_1 *) dev_nan(nq * sizeof(block_q8_1));
    auto serial = [&](auto kernel) {
        kernel<<<nrows, bs, 32 * sizeof(float)>>>(x, dst_a, q_a, ncols, ncols, 1e-6f, w, ncols, init_fastdiv_values(ncols),
                                                 init_fastdiv_values(w_rows));
    };
    bs == 256 ? serial(rms_norm_mul_q8_1_f32<256>) : serial(rms_norm_mul_q8_1_f32<1024>);
    if (!rms_norm_mul_q8_1_regs_launch(x, dst_b, q_b, ncols, nrows, ncols, 1e-6f, w, ncols, init_fastdiv_values(ncols),
                                       init_fastdiv_values(w_rows), 0)) {
        printf("%-44s no registers kernel for %d columns (nper %d)\n", name, ncols, np);
        failures++;
        return;
    }
    CK(cudaDeviceSynchronize());
    std::vector<float> a(n), b(n);
    std::vector<block_q8_1> qa(nq), qb(nq);
    CK(cudaMemcpy(a.data(), dst_a, n * sizeof(float), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b.data(), dst_b, n * sizeof(float), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(qa.data(), q_a, nq * sizeof(block_q8_1), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(qb.data(), q_b, nq * sizeof(block_q8_1), cudaMemcpyDeviceToHost));
    const size_t diff = (memcmp(a.data(), b.data(), n * sizeof(float)) != 0) + (memcmp(qa.data(), qb.data(), nq * sizeof(block_q8_1)) != 0);
    size_t unwritten = 0;
    for (float v : a) unwritten += *(const uint32_t *) &v == 0xffffffffu;
    printf("%-44s %6d values %s (%d threads, %d per thread)\n", name, n, diff ? "DIFFER" : "bit-identical", bs, np);
    failures += diff != 0 || unwritten != 0;
    if (unwritten) printf("  %zu values unwritten\n", unwritten);
    CK(cudaFree(x)); CK(cudaFree(w)); CK(cudaFree(dst_a)); CK(cudaFree(dst_b)); CK(cudaFree(q_a)); CK(cudaFree(q_b));
}

int main() {
    const rope_case cases[] = {
        { "q: 64 x 512, 1 token, no weight",              512, 64, 1, 64, 448, false, false, false, 1.0f,  0.0f },
        { "q: 64 x 512, 7 tokens, no weight",             512, 64, 7, 64, 448, false, false, false, 1.0f,  0.0f },
        { "kv: 512, 1 token, weight, F16 cache rows",     512,  1, 1, 64, 448, true,  true,  true,  1.0f,  0.0f },
        { "kv: 512, 9 tokens, weight, F16 cache rows",    512,  1, 9, 64, 448, true,  true,  true,  1.0f,  0.0f },
        { "compressor: 512, YaRN, weight, F16 rows",      512,  1, 2, 64, 448, true,  true,  true,  0.25f, 1.0f },
        { "indexer compressor: 128, weight, F32 rows",    128,  1, 3, 64,  64, true,  false, true,  1.0f,  0.0f },
        { "q: YaRN, 8 x 512, 3 tokens, no weight",        512,  8, 3, 64, 448, false, false, false, 0.25f, 1.0f },
        { "wide: 2048 (1024 threads), weight, F32",      2048,  2, 2, 64, 1984, true, false, false, 1.0f,  0.0f },
    };
    for (const rope_case & c : cases) {
        if (c.weight) {
            c.f16 ? run<true, half>(c) : run<true, float>(c);
        } else {
            c.f16 ? run<false, half>(c) : run<false, float>(c);
        }
    }
    run_norm_q8("norm+q8_1: 4096, 1 token",                 4096, 1, 1);
    run_norm_q8("norm+q8_1: 4096, 7 tokens",                4096, 7, 1);
    run_norm_q8("norm+q8_1: 1024 (q_a), 1 token",           1024, 1, 1);
    run_norm_q8("norm+q8_1: 512, 3 tokens, a weight per row", 512, 3, 3);
    run_norm_q8("norm+q8_1: 2048, 2 tokens",                2048, 2, 1);
    run_norm_q8("norm+q8_1: 3072 (a partial last column)",  3072, 1, 1);
    run_norm_q8("norm+q8_1: 7168 (DeepSeek-V3), 1 token",   7168, 1, 1);
    run_norm_q8("norm+q8_1: 8192, 8 tokens",                8192, 8, 1);
    printf("%s\n", failures ? "FAILED" : "all bit-identical");
    return failures ? 1 : 0;
}
