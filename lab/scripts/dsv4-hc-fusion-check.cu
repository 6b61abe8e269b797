// Patch 0021's fused DeepSeek-V4 hyper-connection kernels (with 0024's faster norm + mixes kernel), 0025's RMS_NORM +
// MUL + q8_1 copy, 0033's compressor pooling with its window read ahead and 0038's launches of the hc_post and FFN-half
// kernels (0033 and 0038 are old numbers: lab/patches/cuda-dsv4-compress-pool-window-read-ahead.patch and
// cuda-dsv4-hc-comb-beside-the-loads.patch) against the kernels they replace, bit for bit, on a GPU.
//
// Each fused kernel claims to form every value with the unfused kernels' float operations in their order. This program
// runs both sides on the same random inputs (V4 shapes: n_embd 4096, 4 streams, 24 mixes; 1 and 64 tokens) and counts
// the outputs whose bits differ. It includes the kernels' own sources (their static __global__ functions), so it is
// built from a llama.cpp tree with vendor/patches applied, with the flags of ggml-cuda's build:
//
//   T=llama.cpp/ggml/src/ggml-cuda
//   nvcc -O3 -std=c++17 -use_fast_math -extended-lambda -DGGML_USE_CUDA -DNDEBUG \
//        -gencode arch=compute_80,code=[sm_80,compute_80] -I$T -I$T/.. -I$T/../../include \
//        `# and -I for cublas_v2.h if the toolkit has no cuBLAS headers` \
//        lab/scripts/dsv4-hc-fusion-check.cu -o dsv4-hc-fusion-check
//   CUDA_CACHE_MAXSIZE=4294967296 ./dsv4-hc-fusion-check      # exit 0: every fused output equals the unfused one
//
// (The included files' host-side ops reference ggml functions that this program never calls: the stubs in
// lab/scripts/fusion-check-common.cuh abort; it also holds the helpers both checks use.)
#include "norm.cu"
#include "quantize.cu"
#include "mmvf.cu"
#include "unary.cu"
#include "dsv4-hc.cu"

#include <cstdio>
#include <cstring>
#include <vector>

#include "fusion-check-common.cuh"

static constexpr int64_t N_EMBD = 4096, HC = 4, MIX = (2 + HC) * HC;
static constexpr float   EPS = 1e-6f;
static constexpr int     N_ITER = 20;

static float * dev_zero(size_t n) { return (float *) dev_nan(n * sizeof(float)); }  // "zero": nothing written yet
static std::vector<float> host(const float * d, size_t n) {
    std::vector<float> h(n);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}
static std::vector<float> rand_vec(size_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (float & x : v) x = frand(lo, hi);
    return v;
}

static int failures = 0;
static void compare(const char * what, const float * a, const float * b, size_t n) {
    const std::vector<float> ha = host(a, n), hb = host(b, n);
    size_t diff = 0, first = n;
    for (size_t i = 0; i < n; ++i) {
        if (memcmp(&ha[i], &hb[i], sizeof(float)) != 0) {
            if (diff++ == 0) first = i;
        }
    }
    printf("%-58s %s", what, diff ? "DIFFER" : "bit-identical");
    if (diff) {
        printf(": %zu of %zu, first at %zu (%.9g vs %.9g)", diff, n, first, ha[first], hb[first]);
        failures++;
    }
    printf("\n");
}

static mul_add_sigmoid_scale_src src_of(const float * data, std::array<int64_t, 4> ne, std::array<int64_t, 4> s) {
    mul_add_sigmoid_scale_src r;
    r.data = data;
    for (int d = 0; d < 4; ++d) { r.ne[d] = ne[d]; r.s[d] = s[d]; }
    return r;
}

// the unfused gate (patch 0005's kernel): dst [HC, nt] contiguous from mixes[k*HC + h, t]
static void gate_unfused(const float * mixes, const float * scale, const float * base, int k, float s, float b, int64_t nt, float * dst) {
    mul_add_sigmoid_scale_f32<<<1, 256>>>(src_of(mixes + k * HC, {HC, nt, 1, 1}, {1, MIX, MIX * nt, MIX * nt}),
                                          src_of(scale + k, {1, 1, 1, 1}, {1, 1, 1, 1}),
                                          src_of(base + k * HC, {HC, 1, 1, 1}, {1, HC, HC, HC}), dst, HC, nt, 1, 1, s, b);
}
static ggml_cuda_dsv4_hc_gate gate_fused(const float * mixes, const float * scale, const float * base, int k, float s, float b) {
    return { mixes + k * HC, 1, MIX, scale + k, base + k * HC, 1, s, b };
}

static __global__ void add_f32(const float * a, const float * b, float * c, int64_t n) {  // k_bin_bcast's op_add
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

// 0025: rms_norm_f32<block, true> (RMS_NORM + MUL) then quantize_q8_1 vs rms_norm_mul_q8_1_f32 (both outputs)
template <int block>
static void check_norm_q8_1(int ncols, int nrows) {
    const float * x = dev(rand_vec(ncols * nrows, -2.0f, 2.0f)), * w = dev(rand_vec(ncols, 0.5f, 1.5f));
    float * ref = dev_zero(ncols * nrows), * fused = dev_zero(ncols * nrows);
    const size_t q_floats = nrows * (ncols / QK8_1) * sizeof(block_q8_1) / sizeof(float);
    float * q_ref = dev_zero(q_floats), * q_fused = dev_zero(q_floats);
    const uint3 z = make_uint3(0, 0, 0), one = init_fastdiv_values(1), cols = init_fastdiv_values(ncols);
    rms_norm_f32<block, true, false, false><<<nrows, block, 32 * sizeof(float)>>>(x, ref, ncols, ncols, ncols * nrows,
        ncols * nrows, EPS, w, 0, 0, 0, cols, one, one, one, nullptr, 0, 0, 0, z, z, z, z, 1.0f);
    quantize_q8_1<<<dim3(ncols / CUDA_QUANTIZE_BLOCK_SIZE, nrows, 1), CUDA_QUANTIZE_BLOCK_SIZE>>>(ref, q_ref, ncols,
        ncols, ncols * nrows, ncols * nrows, ncols, nrows, init_fastdiv_values(1));
    rms_norm_mul_q8_1_f32<block><<<nrows, block, 32 * sizeof(float)>>>(x, fused, (block_q8_1 *) q_fused, ncols, ncols, EPS,
        w, 0, cols, one);
    char what[96];
    snprintf(what, sizeof(what), "norm+q8_1: rms_norm*w, %d x %d (block %d)", ncols, nrows, block);
    compare(what, ref, fused, ncols * nrows);
    snprintf(what, sizeof(what), "norm+q8_1: its q8_1 copy, %d x %d (block %d)", ncols, nrows, block);
    compare(what, q_ref, q_fused, q_floats);  // q8_1 blocks are 36 bytes: whole floats
}

// 0033: dsv4_compress_pool_f32 (one thread per channel walking its window) vs dsv4_compress_pool_ahead_f32 (the same
// walk with the window's loads issued ahead), on state rows (base), this ubatch's rows (cur) and indices that include
// rows outside both (a score of -inf, as the appended zero row)
template <bool overlap>
static void check_pool(int ratio, int64_t D, int64_t n_blocks, int64_t n_base, int64_t n_cur) {
    const int64_t W = overlap ? 2 * D : D;  // a row holds both halves of the overlapping window
    const float * base_kv = dev(rand_vec(n_base * W, -2.0f, 2.0f)), * cur_kv = dev(rand_vec(n_cur * W, -2.0f, 2.0f));
    const float * base_sc = dev(rand_vec(n_base * W, -6.0f, 6.0f)), * cur_sc = dev(rand_vec(n_cur * W, -6.0f, 6.0f));
    const int n_idx = (overlap ? 2 : 1) * ratio * n_blocks;
    std::vector<int32_t> h_idx(n_idx);
    for (int i = 0; i < n_idx; ++i) {
        h_idx[i] = (int32_t) (frand(0.0f, 1.0f) * (n_base + n_cur + 2)) - 1;  // -1 .. n_base + n_cur: some out of range
    }
    int32_t * idx = dev(h_idx);
    float * ref = dev_zero(D * n_blocks), * ahead = dev_zero(D * n_blocks);
    dsv4_compress_pool_f32<overlap><<<dim3(n_blocks, (D + 127) / 128, 1), 128>>>(base_kv, cur_kv, base_sc, cur_sc, idx, ref,
        ratio, D, n_blocks, n_base, n_cur, W, W, W, W, D);
    dsv4_compress_pool_ahead_f32<overlap><<<dim3(n_blocks, (D + WARP_SIZE - 1) / WARP_SIZE, 1), WARP_SIZE>>>(base_kv, cur_kv,
        base_sc, cur_sc, idx, ahead, ratio, D, n_blocks, n_base, n_cur, W, W, W, W, D);
    char what[96];
    snprintf(what, sizeof(what), "pool: ratio %d%s, %lld channels, %lld blocks", ratio, overlap ? " overlap" : "",
             (long long) D, (long long) n_blocks);
    compare(what, ref, ahead, D * n_blocks);
}

int main() {
    printf("== compressor pooling, window read ahead (0033)\n");
    check_pool<false>(128, 512, 1, 128, 1);   // HCA at decode: the state's 128 rows, one new row
    check_pool<false>(128, 512, 3, 300, 64);  // HCA in a prompt
    check_pool<true>(4, 512, 1, 8, 1);        // CSA (overlapping windows), attention and ...
    check_pool<true>(4, 128, 5, 8, 20);       // ... the indexer's compressor, several blocks
    check_pool<false>(4, 100, 2, 4, 3);       // a channel count that is not a multiple of 32

    printf("== RMS_NORM + MUL + q8_1 copy\n");
    check_norm_q8_1<1024>(N_EMBD, 1);
    check_norm_q8_1<1024>(N_EMBD, 4);
    check_norm_q8_1<1024>(1024, 1);
    check_norm_q8_1<256>(512, 1);
    check_norm_q8_1<256>(512, 8);

    const int64_t nts[] = { 1, 64 };
    const std::vector<float> h_fn = rand_vec(HC * N_EMBD * MIX, -0.01f, 0.01f);
    const float * fn    = dev(h_fn);
    const float * scale = dev(rand_vec(3, -0.5f, 0.5f));
    const float * base  = dev(rand_vec(MIX, -0.25f, 0.25f));

    for (int64_t nt : nts) {
        printf("== %lld token(s)\n", (long long) nt);
        const float * x        = dev(rand_vec(N_EMBD * HC * nt, -1.5f, 1.5f));  // the streams [n_embd, hc, nt]
        const float * layer    = dev(rand_vec(N_EMBD * nt, -1.0f, 1.0f));       // attention output [n_embd, nt]
        const float * ffn_a    = dev(rand_vec(N_EMBD * nt, -1.0f, 1.0f));       // moe_out
        const float * ffn_b    = dev(rand_vec(N_EMBD * nt, -1.0f, 1.0f));       // shared expert
        float * mixes = dev_zero(MIX * nt);

        if (nt == 1) {  // norm: rms_norm_f32<1024> then mul_mat_vec_f<float, float, 1, 256> vs rms_norm_mul_mat_vec_f32
            float * normed = dev_zero(HC * N_EMBD);
            float * mixes_fused = dev_zero(MIX);
            const uint3 z = make_uint3(0, 0, 0);
            rms_norm_f32<1024, false, false, false><<<1, 1024, 32 * sizeof(float)>>>(x, normed, HC * N_EMBD, HC * N_EMBD, HC * N_EMBD, HC * N_EMBD, EPS,
                nullptr, 0, 0, 0, z, z, z, z, nullptr, 0, 0, 0, z, z, z, z, 1.0f);
            const uint3 one = init_fastdiv_values(1);
            mul_mat_vec_f<float, float, 1, 256, false, false><<<dim3(MIX, 1, 1), 256, WARP_SIZE * sizeof(float)>>>(
                fn, normed, nullptr, ggml_cuda_mm_fusion_args_device{}, mixes, HC * N_EMBD / 2, one, HC * N_EMBD, HC * N_EMBD / 2, MIX,
                one, 0, 0, 0, one, 0, 0, 0, 0);
            rms_norm_mul_mat_vec_f32<<<MIX, 1024>>>(x, fn, mixes_fused, HC * N_EMBD, HC * N_EMBD, EPS);
            compare("norm: flat rms_norm + mixes matmul", mixes, mixes_fused, MIX);
            float * mixes_prefetch = dev_zero(MIX);  // 0024's 256-thread kernel for this width
            rms_norm_mul_mat_vec_f32_prefetch<32><<<MIX, 256>>>(x, fn, mixes_prefetch, HC * N_EMBD, HC * N_EMBD, EPS);
            compare("norm: the same, 256 threads with the loads first", mixes, mixes_prefetch, MIX);
        } else {        // at 64 tokens the matmul is not fused: random mixes of the same scale
            CK(cudaMemcpy(mixes, rand_vec(MIX * nt, -2.0f, 2.0f).data(), MIX * nt * sizeof(float), cudaMemcpyHostToDevice));
        }

        // pre: gate (0005) + dsv4_hc_pre_f32<false> vs dsv4_hc_pre_gate_f32
        float * pre_w = dev_zero(HC * nt), * pre_ref = dev_zero(N_EMBD * nt), * pre_fused = dev_zero(N_EMBD * nt);
        gate_unfused(mixes, scale, base, 0, 1.0f, EPS, nt, pre_w);
        const int64_t blocks_pre = (N_EMBD * nt + 255) / 256;
        dsv4_hc_pre_f32<false><<<blocks_pre, 256>>>(x, pre_w, pre_ref, N_EMBD, HC, nt, 1, N_EMBD, N_EMBD * HC, 1, HC, HC * nt, 1, N_EMBD, 1.0f);
        dsv4_hc_pre_gate_f32<<<blocks_pre, 256>>>(x, gate_fused(mixes, scale, base, 0, 1.0f, EPS), pre_fused, N_EMBD, HC, nt,
                                                  1, N_EMBD, N_EMBD * HC, 1, N_EMBD, 1.0f);
        compare("pre: gate + hc_pre", pre_ref, pre_fused, N_EMBD * nt);

        // the post gate and the comb, unfused, for the references below
        float * post_w = dev_zero(HC * nt), * comb = dev_zero(HC * HC * nt);
        gate_unfused(mixes, scale, base, 1, 2.0f, 0.0f, nt, post_w);
        dsv4_hc_comb_f32<<<(nt + 255) / 256, 256>>>(mixes, scale, base, comb, nt, 1, MIX, 1, 1, 1, HC, HC * HC, EPS, N_ITER);
        const int64_t blocks_post = (N_EMBD * HC * nt + 255) / 256;
        float * post_ref = dev_zero(N_EMBD * HC * nt);
        dsv4_hc_post_f32<true><<<blocks_post, 256>>>(layer, x, post_w, comb, post_ref, N_EMBD, HC, nt, 1, N_EMBD,
            1, N_EMBD, N_EMBD * HC, 1, HC, 1, HC, HC * HC, 1, N_EMBD, N_EMBD * HC);

        if (nt == 1) {
            // post: gate + comb + hc_post vs dsv4_hc_post_gate_comb_f32
            float * post_fused = dev_zero(N_EMBD * HC), * post_preload = dev_zero(N_EMBD * HC);
            dsv4_hc_post_gate_comb_f32<false><<<blocks_post, 256>>>(layer, x, gate_fused(mixes, scale, base, 1, 2.0f, 0.0f),
                mixes, scale, base, 1, MIX, 1, 1, EPS, N_ITER, post_fused, N_EMBD, 1, 1, N_EMBD, 1, N_EMBD);
            compare("post: gate + comb + hc_post", post_ref, post_fused, N_EMBD * HC);
            dsv4_hc_post_gate_comb_f32<true><<<blocks_post, 256>>>(layer, x, gate_fused(mixes, scale, base, 1, 2.0f, 0.0f),
                mixes, scale, base, 1, MIX, 1, 1, EPS, N_ITER, post_preload, N_EMBD, 1, 1, N_EMBD, 1, N_EMBD);
            compare("post: the same with 0038's loads first", post_ref, post_preload, N_EMBD * HC);

            // ffn: post gate, comb, pre gate, hc_pre in one kernel (post and comb written too)
            float * ffn_post = dev_zero(HC), * ffn_comb = dev_zero(HC * HC), * ffn_pre = dev_zero(N_EMBD);
            dsv4_hc_pre_gate_post_comb_f32<<<(N_EMBD + 255) / 256, 256>>>(x, gate_fused(mixes, scale, base, 0, 1.0f, EPS),
                gate_fused(mixes, scale, base, 1, 2.0f, 0.0f), mixes, scale, base, 1, MIX, 1, 1, EPS, N_ITER,
                ffn_post, ffn_comb, 1, HC, ffn_pre, N_EMBD, 1, N_EMBD, 1, 1.0f);
            compare("ffn: the post gate it writes", post_w, ffn_post, HC);
            compare("ffn: the comb it writes", comb, ffn_comb, HC * HC);
            compare("ffn: hc_pre", pre_ref, ffn_pre, N_EMBD);
            // 0038's launch: one block more, which only writes the post gate and the comb
            float * ffn2_post = dev_zero(HC), * ffn2_comb = dev_zero(HC * HC), * ffn2_pre = dev_zero(N_EMBD);
            dsv4_hc_pre_gate_post_comb_f32<<<(N_EMBD + 255) / 256 + 1, 256>>>(x, gate_fused(mixes, scale, base, 0, 1.0f, EPS),
                gate_fused(mixes, scale, base, 1, 2.0f, 0.0f), mixes, scale, base, 1, MIX, 1, 1, EPS, N_ITER,
                ffn2_post, ffn2_comb, 1, HC, ffn2_pre, N_EMBD, 1, N_EMBD, 1, 1.0f);
            compare("ffn, comb in its own block: the post gate", post_w, ffn2_post, HC);
            compare("ffn, comb in its own block: the comb", comb, ffn2_comb, HC * HC);
            compare("ffn, comb in its own block: hc_pre", pre_ref, ffn2_pre, N_EMBD);
        }

        // add: ADD then hc_post vs dsv4_hc_post_add_f32
        float * sum = dev_zero(N_EMBD * nt), * add_ref = dev_zero(N_EMBD * HC * nt), * add_fused = dev_zero(N_EMBD * HC * nt);
        add_f32<<<(N_EMBD * nt + 255) / 256, 256>>>(ffn_a, ffn_b, sum, N_EMBD * nt);
        dsv4_hc_post_f32<true><<<blocks_post, 256>>>(sum, x, post_w, comb, add_ref, N_EMBD, HC, nt, 1, N_EMBD,
            1, N_EMBD, N_EMBD * HC, 1, HC, 1, HC, HC * HC, 1, N_EMBD, N_EMBD * HC);
        dsv4_hc_post_add_f32<<<blocks_post, 256>>>(ffn_a, ffn_b, x, post_w, comb, add_fused, N_EMBD, HC, nt, 1, N_EMBD, 1, N_EMBD,
            1, N_EMBD, N_EMBD * HC, 1, HC, 1, HC, HC * HC, 1, N_EMBD, N_EMBD * HC);
        compare("add: ADD + hc_post", add_ref, add_fused, N_EMBD * HC * nt);
    }
    CK(cudaDeviceSynchronize());
    printf("%s\n", failures ? "SOME FUSED KERNELS DIFFER" : "every fused output is bit-identical to the unfused one");
    return failures ? 1 : 0;
}
