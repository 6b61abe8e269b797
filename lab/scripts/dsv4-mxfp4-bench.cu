// DeepSeek-V4's routed experts at one token (MXFP4 MUL_MAT_ID: the fused gate+up with SWIGLU_CLAMP, 6 of 16 experts,
// 4096 -> 2048, and the down projection, 2048 -> 4096) through mul_mat_vec_q as vendor/patches launches it, against
// one-warp-per-row kernels that spend fewer instructions per weight byte. In mul_mat_vec_q two threads share a
// 17-byte block (8 quant bytes each), and each thread rebuilds 64-bit addresses, decodes the block's scale and turns
// each int of 8 nibbles into two ints of int8 with 8 PRMT, 4 LOP3 and 2 SHF (get_int_from_table_16 masks every
// __byte_perm selector with 0x7777 and de-interleaves low and high nibbles at the end): ~4.8 instructions per weight
// in the gated loop, about half of them on the integer ALU pipe, which sm_80 issues at half rate. Here a warp owns a
// row, each lane owns whole blocks (lane + 32 i: one aligned base address and constant offsets), loads a block as five
// aligned words, and:
//   table: the same 16-entry table lookup, but the activation's int8 are permuted once per block (shared by gate and
//          up) into the order the raw nibbles come in, so no de-interleave;
//   sign:  PTX prmt's sign mode (a selector nibble's bit 3 replicates the selected byte's sign, 0 for the positive
//          magnitudes 0..12): P = prmt(mags, q) keeps the positive weights, N = prmt(mags, q ^ 0x88888888) the
//          negative ones' magnitudes, dot = dp4a(P, y) - dp4a(N, y): 4 PRMT, 1 LOP3, 2 SHF per 8 weights;
//   bound: no lookup at all (the nibbles as int8; wrong results): how fast the loop could get with a free lookup;
//   loads: only the loads (xor of the words): this access pattern's bandwidth.
// Prints microseconds per call (CUDA events over 300 calls after a warm-up, weights rotated over copies larger than
// the L2), GB/s of weights read, and the largest difference from mul_mat_vec_q's outputs relative to their RMS (the
// sums are added in another order, so not bit-identical). Built like lab/scripts/dsv4-mmvq-bench.cu:
//
//   T=llama.cpp/ggml/src/ggml-cuda
//   nvcc -O3 -std=c++17 -use_fast_math -extended-lambda -DGGML_USE_CUDA -DNDEBUG \
//        -gencode arch=compute_80,code=[sm_80,compute_80] -I$T -I$T/.. -I$T/../../include \
//        lab/scripts/dsv4-mxfp4-bench.cu -o dsv4-mxfp4-bench
//   CUDA_CACHE_MAXSIZE=4294967296 ./dsv4-mxfp4-bench    # exit 0: table and sign agree with mul_mat_vec_q
#include "mmvq.cu"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "fusion-check-common.cuh"
#include "mmvq-bench-common.cuh"


constexpr int NWARPS = 4, WARP = 32;
enum { TABLE = 0, SIGN = 1, BOUND = 2, LOADS = 3 };

static __device__ __forceinline__ uint32_t prmt_sign(uint32_t a, uint32_t b, uint32_t sel) {  // PTX prmt, default mode
    uint32_t r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}

// One lane's dot product of one MXFP4 block (at p) with one q8_1 block whose 8 ints YI are permuted to the nibble
// order [j, j+16, j+1, j+17] (YI[2k]) and [j+2, j+18, j+3, j+19] (YI[2k+1]), j = 4k. Returns the int sum and the scale.
template <int VAR>
static __device__ __forceinline__ int block_dot(const char * p, const int (&YI)[8], uint8_t & e) {
    const uintptr_t a = (uintptr_t) p;
    const uint32_t * w = (const uint32_t *) (a & ~(uintptr_t) 3);
    const uint32_t s = 8 * (uint32_t) (a & 3);
    uint32_t wd[5];
#pragma unroll
    for (int i = 0; i < 5; ++i) wd[i] = __ldg(w + i);
    e = (uint8_t) __funnelshift_r(wd[0], wd[1], s);
    int sumi = 0, sumn = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const uint32_t q = __funnelshift_rc(wd[k], wd[k + 1], s + 8);
        if constexpr (VAR == TABLE) {
            const uint32_t * t = (const uint32_t *) kvalues_mxfp4;
            const uint32_t sel = 0x32103210 | ((q & 0x88888888) >> 1);
            const uint32_t v0 = __byte_perm(__byte_perm(t[0], t[1], q), __byte_perm(t[2], t[3], q), sel);
            const uint32_t v1 = __byte_perm(__byte_perm(t[0], t[1], q >> 16), __byte_perm(t[2], t[3], q >> 16), sel >> 16);
            sumi = ggml_cuda_dp4a((int) v0, YI[2 * k + 0], sumi);
            sumi = ggml_cuda_dp4a((int) v1, YI[2 * k + 1], sumi);
        } else if constexpr (VAR == SIGN) {
            constexpr uint32_t m0 = 0x03020100, m1 = 0x0C080604;  // |kvalues_mxfp4| for codes 0..7
            const uint32_t qn = q ^ 0x88888888;
            sumi = ggml_cuda_dp4a((int) prmt_sign(m0, m1, q), YI[2 * k + 0], sumi);
            sumn = ggml_cuda_dp4a((int) prmt_sign(m0, m1, qn), YI[2 * k + 0], sumn);
            sumi = ggml_cuda_dp4a((int) prmt_sign(m0, m1, q >> 16), YI[2 * k + 1], sumi);
            sumn = ggml_cuda_dp4a((int) prmt_sign(m0, m1, qn >> 16), YI[2 * k + 1], sumn);
        } else if constexpr (VAR == BOUND) {
            sumi = ggml_cuda_dp4a((int) (q & 0x0F0F0F0F), YI[2 * k + 0], sumi);
            sumi = ggml_cuda_dp4a((int) ((q >> 4) & 0x0F0F0F0F), YI[2 * k + 1], sumi);
        } else {
            sumi ^= (int) q;
        }
    }
    return sumi - sumn;
}

// Grid (rows / 4, experts used), block (32, 4): warp w computes row 4 * blockIdx.x + w of expert ids[blockIdx.y];
// lane l takes blocks l, l + 32, ... NBLK: blocks per row (K / 32). GATED: x is up, gate the gate, one activation;
// otherwise activation c for channel c.
template <int VAR, bool GATED, int NBLK>
static __global__ void __launch_bounds__(NWARPS * WARP, 1) mxfp4_warp_rows(const char * __restrict__ vx,
        const char * __restrict__ vgate, const block_q8_1 * __restrict__ y, const int32_t * __restrict__ ids,
        float * __restrict__ dst, int nrows, int stride_channel_y, float glu_limit) {
    static_assert(NBLK % WARP == 0, "whole blocks per lane");
    constexpr int row_bytes = NBLK * (int) sizeof(block_mxfp4);
    const int row = NWARPS * blockIdx.x + threadIdx.y, channel = blockIdx.y;
    const size_t off = ((size_t) ids[channel] * nrows + row) * row_bytes + sizeof(block_mxfp4) * threadIdx.x;
    const block_q8_1 * yl = y + (size_t) channel * stride_channel_y + threadIdx.x;
    float acc = 0.0f, acc_g = 0.0f;
#pragma unroll
    for (int it = 0; it < NBLK / WARP; ++it) {
        const block_q8_1 * yb = yl + WARP * it;
        const int * yq = (const int *) yb->qs;
        int Y[8], YI[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) Y[k] = __ldg(yq + k);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            YI[2 * k + 0] = (int) __byte_perm(Y[k], Y[k + 4], 0x5140);
            YI[2 * k + 1] = (int) __byte_perm(Y[k], Y[k + 4], 0x7362);
        }
        const float dy = __low2float(yb->ds);
        const size_t boff = off + (size_t) (WARP * it) * sizeof(block_mxfp4);
        uint8_t e;
        const int sx = block_dot<VAR>(vx + boff, YI, e);
        acc += ggml_cuda_e8m0_to_fp32(e) * 0.5f * dy * (float) sx;
        if constexpr (GATED) {
            const int sg = block_dot<VAR>(vgate + boff, YI, e);
            acc_g += ggml_cuda_e8m0_to_fp32(e) * 0.5f * dy * (float) sg;
        }
    }
    acc = warp_reduce_sum<WARP>(acc);
    if constexpr (GATED) acc_g = warp_reduce_sum<WARP>(acc_g);
    if (threadIdx.x == 0) {
        dst[(size_t) channel * nrows + row] = GATED ? ggml_cuda_op_swiglu_clamp_single(acc_g, acc, glu_limit) : acc;
    }
}

template <bool GATED, int NBLK> static int run_shape(const char * name, int rows, cudaEvent_t e0, cudaEvent_t e1) {
    constexpr int K = NBLK * QK_MXFP4, n_expert = 16, channels = 6;
    const int row_bytes = NBLK * (int) sizeof(block_mxfp4);
    const size_t wbytes = (size_t) row_bytes * rows * n_expert;
    const size_t read_bytes = (size_t) row_bytes * rows * channels * (GATED ? 2 : 1);
    const int ncopies = (int) std::max<size_t>(2, (size_t) 400e6 / wbytes + 1);
    std::vector<char> hw(wbytes);
    std::vector<char *> w(ncopies), g(ncopies);
    fill_weights(hw, GGML_TYPE_MXFP4);
    for (char *& p : w) p = dev(hw);
    if (GATED) {
        fill_weights(hw, GGML_TYPE_MXFP4);
        for (char *& p : g) p = dev(hw);
    }
    const int ny = GATED ? 1 : channels;
    const std::vector<block_q8_1> hy = random_q8_1((size_t) (K / QK8_1) * ny);
    block_q8_1 * y = dev(hy);
    std::vector<int32_t> hids = {3, 14, 7, 0, 11, 5};
    int32_t * ids = dev(hids);
    const int stride_y = K / QK8_1, stride_channel_y = ny > 1 ? stride_y : 0;
    const size_t nout = (size_t) rows * channels;
    const float glu_limit = 7.0f;
    const uint3 one = init_fastdiv_values(1), nch_y = init_fastdiv_values(ny);
    const dim3 block(WARP, NWARPS, 1);

    auto pin = [&](int c, float * d) {
        ggml_cuda_mm_fusion_args_device f{};
        f.glu_op = GGML_GLU_OP_SWIGLU_CLAMP;
        f.glu_limit = glu_limit;
        f.gate = GATED ? g[c] : nullptr;
        if (GATED) {
            mul_mat_vec_q<GGML_TYPE_MXFP4, 1, true><<<dim3(rows, channels, 1), block>>>(
                w[c], y, ids, f, d, K, nch_y, NBLK, stride_y, rows, one, NBLK * rows, stride_channel_y, rows,
                one, 0, 0, 0, 0);
        } else {
            mul_mat_vec_q<GGML_TYPE_MXFP4, 1, false, true><<<dim3(rows / NWARPS, channels, 1), block>>>(
                w[c], y, ids, f, d, K, nch_y, NBLK, stride_y, rows, one, NBLK * rows, stride_channel_y, rows,
                one, 0, 0, 0, 0);
        }
    };
    auto variant = [&](auto var) {
        constexpr int V = decltype(var)::value;
        return [&](int c, float * d) {
            mxfp4_warp_rows<V, GATED, NBLK><<<dim3(rows / NWARPS, channels), block>>>(
                w[c], GATED ? g[c] : nullptr, y, ids, d, rows, stride_channel_y, glu_limit);
        };
    };
    std::vector<float> ref(nout), out(nout);
    float * d = (float *) dev_nan(nout * sizeof(float));
    auto time_us = [&](auto && run) { return us_per_call([&](int i) { run(i % ncopies, d); }, e0, e1); };
    auto result = [&](auto && run, std::vector<float> & h) {
        run(0, d);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(h.data(), d, nout * sizeof(float), cudaMemcpyDeviceToHost));
    };
    const float t_pin = time_us(pin);
    result(pin, ref);
    double rms = 0;
    for (float v : ref) rms += (double) v * v;
    rms = std::sqrt(rms / nout);
    const double gb = read_bytes / 1e3;
    printf("%-46s %-8s %8.2f us %6.0f GB/s\n", name, "pin", t_pin, gb / t_pin);
    int failures = 0;
    const char * names[] = {"table", "sign", "bound", "loads"};
    auto one_variant = [&](auto var) {
        constexpr int V = decltype(var)::value;
        auto run = variant(var);
        const float t = time_us(run);
        result(run, out);
        double maxdiff = 0;
        for (size_t i = 0; i < nout; ++i) maxdiff = std::max(maxdiff, (double) std::fabs(out[i] - ref[i]));
        const bool checked = V == TABLE || V == SIGN;
        const bool ok = !checked || maxdiff <= 1e-4 * rms;
        failures += !ok;
        printf("%-46s %-8s %8.2f us %6.0f GB/s  %.3f of pin", "", names[V], t, gb / t, t / t_pin);
        if (checked) printf("; max |diff| / rms %.2e %s", maxdiff / rms, ok ? "ok" : "TOO LARGE");
        printf("\n");
    };
    one_variant(std::integral_constant<int, TABLE>{});
    one_variant(std::integral_constant<int, SIGN>{});
    one_variant(std::integral_constant<int, BOUND>{});
    one_variant(std::integral_constant<int, LOADS>{});
    for (char * p : w) CK(cudaFree(p));
    if (GATED) for (char * p : g) CK(cudaFree(p));
    CK(cudaFree(y));
    CK(cudaFree(ids));
    CK(cudaFree(d));
    return failures;
}

int main() {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    int failures = 0;
    failures += run_shape<true, 128>("MXFP4 experts gate+up (6 of 16, 4096 -> 2048)", 2048, e0, e1);
    failures += run_shape<false, 64>("MXFP4 experts down (6 of 16, 2048 -> 4096)", 4096, e0, e1);
    printf("%s\n", failures ? "FAIL: a variant's outputs differ from mul_mat_vec_q's" : "table and sign agree with mul_mat_vec_q");
    return failures ? 1 : 0;
}
