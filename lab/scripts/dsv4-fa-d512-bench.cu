// Candidate 0039 on a GPU without a llama.cpp build: DeepSeek-V4's one-token attention (D = 512, 64 query heads over
// one f16 KV head = V, attention sinks, a mask over a partly filled cache) through the pin's mma kernel with its
// stream-k launch and fixup (what llama.cpp runs today) and through the vector kernel at D = 512 (what
// GGML_CUDA_FA_VEC_D512=1 runs), launched with the grids launch_fattn computes for them. Prints the microseconds per
// call of each (CUDA events over 200 calls after a warm-up) and both outputs' largest error against a double-precision
// CPU reference, for KV lengths of 256 to 4096 rows. Built like lab/scripts/dsv4-hc-fusion-check.cu, from a tree with
// vendor/patches and patches-next (0039: the D = 512 vector instance) applied:
//
//   T=llama.cpp/ggml/src/ggml-cuda
//   nvcc -O3 -std=c++17 -use_fast_math -extended-lambda -DGGML_USE_CUDA -DNDEBUG \
//        -gencode arch=compute_80,code=[sm_80,compute_80] -I$T -I$T/.. -I$T/../../include \
//        lab/scripts/dsv4-fa-d512-bench.cu -o dsv4-fa-d512-bench
//   CUDA_CACHE_MAXSIZE=4294967296 ./dsv4-fa-d512-bench     # exit 0: both kernels within 2e-3 of the reference
#include "fattn-mma-f16.cuh"
#include "fattn-vec.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "fusion-check-common.cuh"

constexpr int D = 512, NHEAD = 64, NCOLS2 = 8, MASK_ROWS = 16;

struct fa_args {
    const char * Q, * K, * mask, * sinks;
    float * dst;
    float2 * meta;
    int n_kv;
    float scale;
};

template <typename kernel_t>
static void launch(kernel_t kernel, dim3 grid, dim3 block, size_t smem, const fa_args & a) {
    const uint3 ne01 = init_fastdiv_values(1);
    const int nb11 = D * sizeof(half);
    kernel<<<grid, block, smem>>>(a.Q, a.K, a.K, a.mask, a.sinks, nullptr, a.dst, a.meta, a.scale, 0.0f, 1.0f, 1.0f,
        (uint32_t) NHEAD, 0.0f, D, ne01, NHEAD, 1, D * (int) sizeof(float), D * (int) sizeof(float), D * NHEAD * (int) sizeof(float),
        D, a.n_kv, 1, 1, nb11, nb11 * a.n_kv, (int64_t) nb11 * a.n_kv, nb11, nb11 * a.n_kv, (int64_t) nb11 * a.n_kv,
        MASK_ROWS, 1, 1, a.n_kv * (int) sizeof(half), a.n_kv * MASK_ROWS * (int) sizeof(half), (int64_t) a.n_kv * MASK_ROWS * sizeof(half));
}

// flash_attn_ext_f16<512, 512, 1, 8> as ggml_cuda_flash_attn_ext_mma_f16_case and launch_fattn (stream-k) launch it
struct mma_launch {
    fattn_kernel_t kernel = flash_attn_ext_f16<D, D, 1, NCOLS2, false, false, false>;
    dim3 grid, block;
    size_t smem = 0;
    int nblocks = 0, ntiles_dst = NHEAD / NCOLS2;
    float2 * meta = nullptr;

    explicit mma_launch(int n_kv) {
        const int cc = ggml_cuda_info().devices[0].cc, ncols = NCOLS2;
        const int nthreads = ggml_cuda_fattn_mma_get_nthreads(D, D, ncols, cc), nbatch_fa = ggml_cuda_fattn_mma_get_nbatch_fa(D, D, ncols, cc);
        const int nbatch_K2 = ggml_cuda_fattn_mma_get_nbatch_K2(D, D, ncols, cc), nbatch_V2 = ggml_cuda_fattn_mma_get_nbatch_V2(D, D, ncols, cc);
        const int nbatch_combine = ggml_cuda_fattn_mma_get_nbatch_combine(D, D, ncols, cc);
        const bool Q_in_reg = ggml_cuda_fattn_mma_get_Q_in_reg(D, D, ncols, cc);
        const int nstages = ggml_cuda_fattn_mma_get_nstages(D, D, 1, NCOLS2, cc), cols_per_warp = std::min(ncols, get_cols_per_warp(cc));
        const bool swizzled = ggml_cuda_fattn_mma_get_swizzled(D, D, 1, NCOLS2, cc);
        const int stride_K = ggml_cuda_fattn_mma_get_stride_tile(nbatch_K2, swizzled), stride_V = ggml_cuda_fattn_mma_get_stride_tile(nbatch_V2, swizzled);
        const size_t kv1 = nbatch_fa * std::max(stride_K, stride_V) * sizeof(half2), kv2 = nbatch_fa * (stride_K + stride_V) * sizeof(half2);
        const size_t q = ncols * (D/2 + 4) * sizeof(half2), m = 1 * (nbatch_fa/2 + 4) * sizeof(half2);
        const size_t comb = (nthreads/32) * cols_per_warp * (nbatch_combine + 4) * sizeof(half2), kv = nstages <= 1 ? kv1 : kv2;
        smem = std::max(comb, Q_in_reg ? std::max(q, kv + m) : q + kv + m);
        CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        block = dim3(32, nthreads / 32, 1);
        int per_sm = 1, nsm = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, nthreads, smem));
        CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
        const int ntiles_KV = (n_kv + nbatch_fa - 1) / nbatch_fa, raw = std::min(per_sm * nsm, ntiles_KV * ntiles_dst);
        const int rounded = raw / ntiles_dst * ntiles_dst;
        nblocks = rounded > 0 && 100 * (raw - rounded) / raw <= 5 ? rounded : raw;  // launch_fattn's stream-k count
        grid = dim3(nblocks, 1, 1);
        CK(cudaMalloc(&meta, (size_t) nblocks * ncols * (2 + D/2) * sizeof(float2)));
        printf("  mma: %d threads, %zu B shared, nbatch_fa %d, %d blocks for %d output tiles (%d per SM fit)\n",
               nthreads, smem, nbatch_fa, nblocks, ntiles_dst, per_sm);
    }
    void run(fa_args a) const {
        a.meta = meta;
        launch(kernel, grid, block, smem, a);
        if (nblocks % ntiles_dst == 0 && nblocks > ntiles_dst) {
            flash_attn_stream_k_fixup_uniform<D, 1, NCOLS2><<<dim3(ntiles_dst, 1, NCOLS2), D>>>(a.dst, meta, 1, NHEAD, 1, nblocks,
                NHEAD, nblocks / ntiles_dst, init_fastdiv_values(ntiles_dst), init_fastdiv_values(ntiles_dst), init_fastdiv_values(1));
        } else if (ntiles_dst % nblocks != 0) {
            printf("  (a general fixup would be needed: not benchmarked)\n");
        }
    }
};

template <typename F> static float time_us(F f) {
    for (int i = 0; i < 20; ++i) f();
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
    CK(cudaEventRecord(a));
    for (int i = 0; i < 200; ++i) f();
    CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
    float ms = 0; CK(cudaEventElapsedTime(&ms, a, b));
    return 1000.0f * ms / 200;
}

int main() {
    int failures = 0;
    for (const int n_kv : {256, 512, 1024, 4096}) {
        const int n_valid = n_kv - 37;  // a partly filled cache: the tail masked
        std::vector<float> hq(D * NHEAD), hsink(NHEAD);
        std::vector<half> hk((size_t) D * n_kv), hmask((size_t) n_kv * MASK_ROWS);
        for (float & v : hq) v = frand(-1.0f, 1.0f);
        for (half & v : hk) v = __float2half(frand(-1.0f, 1.0f));
        for (float & v : hsink) v = frand(-1.0f, 3.0f);
        for (int r = 0; r < MASK_ROWS; ++r)
            for (int j = 0; j < n_kv; ++j) hmask[(size_t) r * n_kv + j] = __float2half(j < n_valid ? 0.0f : -INFINITY);
        const float scale = 1.0f / sqrtf((float) D);
        // reference: out[h][d] = sum_j p_j v_j[d], p from q_h.k_j*scale + mask, the sink in the denominator only
        std::vector<double> ref((size_t) D * NHEAD);
        for (int h = 0; h < NHEAD; ++h) {
            std::vector<double> s(n_valid);
            double mx = hsink[h];
            for (int j = 0; j < n_valid; ++j) {
                double acc = 0;
                for (int d = 0; d < D; ++d) acc += (double) hq[h * D + d] * __half2float(hk[(size_t) j * D + d]);
                s[j] = acc * scale;
                mx = std::max(mx, s[j]);
            }
            double den = std::exp(hsink[h] - mx);
            for (int j = 0; j < n_valid; ++j) { s[j] = std::exp(s[j] - mx); den += s[j]; }
            for (int d = 0; d < D; ++d) {
                double acc = 0;
                for (int j = 0; j < n_valid; ++j) acc += s[j] * __half2float(hk[(size_t) j * D + d]);
                ref[(size_t) h * D + d] = acc / den;
            }
        }
        fa_args a = {(const char *) dev(hq), (const char *) dev(hk), (const char *) dev(hmask), (const char *) dev(hsink),
                     (float *) dev_nan(D * NHEAD * sizeof(float)), nullptr, n_kv, scale};
        printf("n_kv %d (%d valid), 64 heads, D 512:\n", n_kv, n_valid);
        auto check = [&](const char * what, float us) {
            std::vector<float> out(D * NHEAD);
            CK(cudaMemcpy(out.data(), a.dst, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
            double err = 0;
            for (size_t i = 0; i < out.size(); ++i) err = std::max(err, std::fabs(out[i] - ref[i]));
            const bool ok = std::isfinite(err) && err < 2e-3;
            failures += !ok;
            printf("  %-40s %8.2f us per call, largest error %.2e %s\n", what, us, err, ok ? "" : "TOO LARGE");
            CK(cudaMemset(a.dst, 0xff, out.size() * sizeof(float)));
        };
        const mma_launch mma(n_kv);
        const float t_mma = time_us([&] { mma.run(a); });
        check("mma flash_attn_ext_f16 + stream-k fixup", t_mma);
        const dim3 vgrid(1, 1, NHEAD), vblock(32, 4, 1);  // launch_fattn for the vector kernel: one block per head
        const float t_vec = time_us([&] { launch(flash_attn_ext_vec<D, 1, GGML_TYPE_F16, GGML_TYPE_F16, false>, vgrid, vblock, 0, a); });
        check("vector flash_attn_ext_vec<512> (0039)", t_vec);
        printf("  vector / mma: %.2f\n", t_vec / t_mma);
        CK(cudaGetLastError());
    }
    printf("%s\n", failures ? "SOME OUTPUT OFF THE REFERENCE" : "both kernels match the reference");
    return failures ? 1 : 0;
}
