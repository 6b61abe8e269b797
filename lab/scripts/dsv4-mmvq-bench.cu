// DeepSeek-V4's one-token matmuls on a GPU without a llama.cpp build (the Q8_0 projections, the MXFP4 routed
// experts' fused gate+up and their down projection) through mul_mat_vec_q as llama.cpp launches it with
// vendor/patches (each thread reads its weight bytes straight from global memory: a Q8_0 block's 8 bytes as four
// 16-bit loads, an MXFP4 block's as 2-3 words) and through the same per-thread dot products fed from shared memory
// that the block first fills with 16-byte cp.async copies of its rows (sm_80's asynchronous copy): "staged", the pin's
// grid; "walk" (dense Q8_0), a resident grid whose blocks walk rows and copy the next row while they compute the
// current one. Prints the microseconds per call of each (CUDA events over 300 calls after a warm-up, the weights
// rotated over copies larger than the L2, as a decode step reads them) and whether each output equals
// mul_mat_vec_q's bit for bit. Then the sibling projections of one DeepSeek-V4 layer (the one-token Q8_0 matmuls that
// read the same activation) launched one by one against one launch over all their rows, both replayed as CUDA graphs
// (what vendor/patches 0031 does). Built like
// lab/scripts/dsv4-hc-fusion-check.cu, from a tree with vendor/patches applied:
//
//   T=llama.cpp/ggml/src/ggml-cuda
//   nvcc -O3 -std=c++17 -use_fast_math -extended-lambda -DGGML_USE_CUDA -DNDEBUG \
//        -gencode arch=compute_80,code=[sm_80,compute_80] -I$T -I$T/.. -I$T/../../include \
//        lab/scripts/dsv4-mmvq-bench.cu -o dsv4-mmvq-bench
//   CUDA_CACHE_MAXSIZE=4294967296 ./dsv4-mmvq-bench     # exit 0: every candidate output equals the pin kernel's
#include "mmvq.cu"
#include "cp-async.cuh"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "fusion-check-common.cuh"
#include "mmvq-bench-common.cuh"



constexpr int NWARPS = 4, WARP = 32;

static __device__ __forceinline__ void cp_async_commit_group() { asm volatile("cp.async.commit_group;"); }
template <int n> static __device__ __forceinline__ void cp_async_wait_group() { asm volatile("cp.async.wait_group %0;" :: "n"(n)); }

// vec_dot_mxfp4_q8_1_mmvq (mmvq.cu) with plain loads instead of __ldg, so that it can read shared memory: the same
// words, the same funnel shifts, the same dp4a chain and scale
static __device__ __forceinline__ float vec_dot_mxfp4_q8_1_any(
    const void * __restrict__ vbq, const block_q8_1 * __restrict__ bq8_1, const int & kbx, const int & iqs) {
    const block_mxfp4 * bq4 = (const block_mxfp4 *) vbq + kbx;
    const int * q8 = (const int *) bq8_1->qs + iqs;
    const uintptr_t addr  = (uintptr_t) (bq4->qs + 4*iqs);
    const int     * w     = (const int *) (addr & ~(uintptr_t) 3);
    const int       shift = 8 * (int) (addr & 3);
    const int       w0    = w[0];
    const int       w1    = w[1];
    const int       w2    = shift ? w[2] : w1;
    const int       aux[VDR_MXFP4_Q8_1_MMVQ] = { (int) __funnelshift_r(w0, w1, shift), (int) __funnelshift_r(w1, w2, shift) };
    int sumi = 0;
#pragma unroll
    for (int l = 0; l < VDR_MXFP4_Q8_1_MMVQ; ++l) {
        const int2 v = get_int_from_table_16(aux[l], kvalues_mxfp4);
        sumi = ggml_cuda_dp4a(v.x, q8[l + 0], sumi);
        sumi = ggml_cuda_dp4a(v.y, q8[l + 4], sumi);
    }
    const float d = ggml_cuda_e8m0_to_fp32(bq4->e) * 0.5f * __low2float(bq8_1->ds);
    return d * sumi;
}

template <ggml_type type> static __device__ __forceinline__ float dot_any(const void * x, const block_q8_1 * y, int kbx, int kqs) {
    if constexpr (type == GGML_TYPE_MXFP4) {
        return vec_dot_mxfp4_q8_1_any(x, y, kbx, kqs);
    } else {
        return vec_dot_q8_0_q8_1(x, y, kbx, kqs);
    }
}

// ROWS rows' dot products as mul_mat_vec_q<type, 1, GATED, ROWS > 1> computes them with nwarps = 4: the same K loop per
// thread, the same shared-memory then warp reduction; x and gate point at the rows (shared memory here). Thread i of
// warp 0 returns row i's results.
template <ggml_type type, int ROWS, bool GATED>
static __device__ __forceinline__ void rows_dot(const void * x, const void * gate, const block_q8_1 * y, int blocks_per_row,
        float & out, float & out_gate) {
    constexpr int qk = ggml_cuda_type_traits<type>::qk, qi = ggml_cuda_type_traits<type>::qi, vdr = get_vdr_mmvq(type);
    constexpr int blocks_per_iter = vdr * NWARPS * WARP / qi;
    __shared__ float red[NWARPS - 1][ROWS][WARP];
    __shared__ float red_gate[GATED ? NWARPS - 1 : 1][ROWS][WARP];
    const int tid = WARP * threadIdx.y + threadIdx.x;
    float tmp[ROWS] = {0.0f}, tmp_gate[ROWS] = {0.0f};
    const int kqs = vdr * (tid % (qi / vdr));
    for (int kbx = tid / (qi / vdr); kbx < blocks_per_row; kbx += blocks_per_iter) {
        const int kby = kbx * (qk / QK8_1);
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
            tmp[i] += dot_any<type>(x, &y[kby], i * blocks_per_row + kbx, kqs);
            if constexpr (GATED) {
                tmp_gate[i] += dot_any<type>(gate, &y[kby], i * blocks_per_row + kbx, kqs);
            }
        }
    }
    if (threadIdx.y > 0) {
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
            red[threadIdx.y - 1][i][threadIdx.x] = tmp[i];
            if constexpr (GATED) red_gate[threadIdx.y - 1][i][threadIdx.x] = tmp_gate[i];
        }
    }
    __syncthreads();
    if (threadIdx.y == 0) {
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
#pragma unroll
            for (int l = 0; l < NWARPS - 1; ++l) {
                tmp[i] += red[l][i][threadIdx.x];
                if constexpr (GATED) tmp_gate[i] += red_gate[l][i][threadIdx.x];
            }
            tmp[i] = warp_reduce_sum<WARP>(tmp[i]);
            if constexpr (GATED) tmp_gate[i] = warp_reduce_sum<WARP>(tmp_gate[i]);
            if (threadIdx.x == i) {
                out = tmp[i];
                out_gate = tmp_gate[i];
            }
        }
    }
}

static __device__ __forceinline__ void copy_async(char * smem, const char * src, int bytes) {
    for (int c = 16 * (WARP * threadIdx.y + threadIdx.x); c < bytes; c += 16 * NWARPS * WARP) {
        cp_async_cg_16<0>(ggml_cuda_cvta_generic_to_shared(smem + c), src + c);
    }
}

// mul_mat_vec_q's grid (rows / ROWS, channels): each block copies its ROWS rows (and the gate's) into shared memory,
// then computes them from there. With ids, channel c reads expert ids[c] and the one activation (MoE decode).
template <ggml_type type, int ROWS, bool GATED>
static __global__ void __launch_bounds__(NWARPS * WARP, 1) mmvq_staged(const char * vx, const char * vgate,
        const block_q8_1 * vy, const int32_t * ids, float * dst, int blocks_per_row, int nrows, int stride_channel_y,
        float glu_limit) {
    extern __shared__ __align__(16) char smem[];
    const int row0 = ROWS * blockIdx.x, channel = blockIdx.y;
    const int channel_x = ids ? ids[channel] : channel;
    const int row_bytes = blocks_per_row * (type == GGML_TYPE_MXFP4 ? (int) sizeof(block_mxfp4) : (int) sizeof(block_q8_0));
    const size_t off = ((size_t) channel_x * nrows + row0) * row_bytes;
    copy_async(smem, vx + off, ROWS * row_bytes);
    if constexpr (GATED) copy_async(smem + ROWS * row_bytes, vgate + off, ROWS * row_bytes);
    cp_async_wait_all();
    __syncthreads();
    float r = 0.0f, g = 0.0f;
    rows_dot<type, ROWS, GATED>(smem, smem + ROWS * row_bytes, vy + channel * stride_channel_y, blocks_per_row, r, g);
    if (threadIdx.y == 0 && threadIdx.x < ROWS) {
        float result = r;
        if constexpr (GATED) {  // mul_mat_vec_q's epilogue with no biases: the same additions of 0.0f
            const float x_bias = 0.0f, gate_bias = 0.0f;
            result += x_bias;
            float gate_value = g;
            gate_value += gate_bias;
            result = ggml_cuda_op_swiglu_clamp_single(gate_value, result, glu_limit);
        }
        dst[(size_t) channel * nrows + row0 + threadIdx.x] = result;
    }
}

// dense Q8_0, a resident grid: block b takes rows b, b + gridDim.x, ... of all channels; the next row's copy is in
// flight while the current row is computed (two buffers)
static __global__ void __launch_bounds__(NWARPS * WARP, 1) mmvq_q8_0_walk(const char * vx, const block_q8_1 * vy,
        float * dst, int blocks_per_row, int nrows, int nchannels, int stride_channel_y) {
    extern __shared__ __align__(16) char smem[];
    const int row_bytes = blocks_per_row * (int) sizeof(block_q8_0);
    const int total = nrows * nchannels;
    int r = blockIdx.x;
    if (r >= total) {
        return;
    }
    copy_async(smem, vx + (size_t) r * row_bytes, row_bytes);
    cp_async_commit_group();
    for (int buf = 0; r < total; r += gridDim.x, buf ^= 1) {
        const int next = r + gridDim.x;
        if (next < total) {
            copy_async(smem + (buf ^ 1) * row_bytes, vx + (size_t) next * row_bytes, row_bytes);
        }
        cp_async_commit_group();
        cp_async_wait_group<1>();
        __syncthreads();
        float v = 0.0f, unused = 0.0f;
        rows_dot<GGML_TYPE_Q8_0, 1, false>(smem + buf * row_bytes, nullptr, vy + (r / nrows) * stride_channel_y, blocks_per_row, v, unused);
        if (threadIdx.y == 0 && threadIdx.x == 0) {
            dst[r] = v;
        }
        __syncthreads();  // the buffer just read is the next copy's target
    }
}

struct shape {
    const char * name;
    ggml_type type;
    int K, rows, channels;  // channels: groups (dense) or experts used (MoE)
    int n_expert;           // > 0: MUL_MAT_ID over this many experts, ids pick `channels` of them
    bool gated;             // fused gate+up with SWIGLU_CLAMP; an ungated MUL_MAT_ID takes the 4-rows-per-block launch
};

int main() {
    const shape shapes[] = {
        {"Q8_0 wq_a (4096 -> 1024)",              GGML_TYPE_Q8_0, 4096, 1024, 1, 0, false},
        {"Q8_0 wo_a (8 groups, 4096 -> 1024)",    GGML_TYPE_Q8_0, 4096, 1024, 8, 0, false},
        {"Q8_0 wo_b (8192 -> 4096)",              GGML_TYPE_Q8_0, 8192, 4096, 1, 0, false},
        {"Q8_0 shared down (2048 -> 4096)",       GGML_TYPE_Q8_0, 2048, 4096, 1, 0, false},
        {"Q8_0 output head (4096 -> 129280)",     GGML_TYPE_Q8_0, 4096, 129280, 1, 0, false},
        {"MXFP4 experts gate+up (6 of 16, 4096 -> 2048)", GGML_TYPE_MXFP4, 4096, 2048, 6, 16, true},
        {"MXFP4 experts down (6 of 16, 2048 -> 4096)",    GGML_TYPE_MXFP4, 2048, 4096, 6, 16, false},
    };
    int nsm = 0;
    CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
    int failures = 0;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("%-48s %8s %8s %8s %9s  %s\n", "shape (one token)", "pin us", "staged", "walk", "best/pin", "bit-identical; GB/s");
    for (const shape & s : shapes) {
        const bool q8 = s.type == GGML_TYPE_Q8_0;
        const int qk = q8 ? QK8_0 : QK_MXFP4, bs = q8 ? (int) sizeof(block_q8_0) : (int) sizeof(block_mxfp4);
        const int bpr = s.K / qk, row_bytes = bpr * bs, nmat = s.n_expert ? s.n_expert : s.channels;
        const size_t wbytes = (size_t) row_bytes * s.rows * nmat;
        const size_t read_bytes = (size_t) row_bytes * s.rows * s.channels * (s.gated ? 2 : 1);
        const int ncopies = (int) std::max<size_t>(2, (size_t) 400e6 / wbytes + 1);
        std::vector<char> hw(wbytes);
        std::vector<char *> w(ncopies), g(ncopies);
        fill_weights(hw, s.type);
        for (char *& p : w) p = dev(hw);
        if (s.gated) {
            fill_weights(hw, s.type);
            for (char *& p : g) p = dev(hw);
        }
        // the activation: one per channel for grouped dense (wo_a) and for the down projection, one for gate+up and dense
        const int ny = (s.n_expert && !s.gated) || (!s.n_expert && s.channels > 1) ? s.channels : 1;
        const std::vector<block_q8_1> hy = random_q8_1((size_t) (s.K / QK8_1) * ny);
        block_q8_1 * y = dev(hy);
        std::vector<int32_t> hids = {3, 14, 7, 0, 11, 5, 9, 2};
        hids.resize(std::max(1, s.channels));
        int32_t * ids = s.n_expert ? dev(hids) : nullptr;
        const int stride_y = s.K / QK8_1, stride_channel_y = ny > 1 ? stride_y : 0;
        const size_t nout = (size_t) s.rows * s.channels;
        float * out[3];
        for (float *& o : out) o = (float *) dev_nan(nout * sizeof(float));
        const float glu_limit = 7.0f;

        const uint3 one = init_fastdiv_values(1), nch_y = init_fastdiv_values(ny);
        auto pin = [&](int c, float * d) {
            ggml_cuda_mm_fusion_args_device f{};
            f.glu_op = GGML_GLU_OP_SWIGLU_CLAMP;
            f.glu_limit = glu_limit;
            f.gate = s.gated ? g[c] : nullptr;
            const dim3 block(WARP, NWARPS, 1);
            if (q8) {
                mul_mat_vec_q<GGML_TYPE_Q8_0, 1, false><<<dim3(s.rows, s.channels, 1), block>>>(
                    w[c], y, nullptr, f, d, s.K, nch_y, bpr, stride_y, s.rows, one, bpr * s.rows, stride_channel_y, s.rows,
                    one, 0, 0, 0, 0);
            } else if (s.gated) {
                mul_mat_vec_q<GGML_TYPE_MXFP4, 1, true><<<dim3(s.rows, s.channels, 1), block>>>(
                    w[c], y, ids, f, d, s.K, nch_y, bpr, stride_y, s.rows, one, bpr * s.rows, stride_channel_y, s.rows,
                    one, 0, 0, 0, 0);
            } else {
                mul_mat_vec_q<GGML_TYPE_MXFP4, 1, false, true><<<dim3(s.rows / NWARPS, s.channels, 1), block>>>(
                    w[c], y, ids, f, d, s.K, nch_y, bpr, stride_y, s.rows, one, bpr * s.rows, stride_channel_y, s.rows,
                    one, 0, 0, 0, 0);
            }
        };
        auto staged = [&](int c, float * d) {
            const dim3 block(WARP, NWARPS, 1);
            if (q8) {
                mmvq_staged<GGML_TYPE_Q8_0, 1, false><<<dim3(s.rows, s.channels), block, row_bytes>>>(
                    w[c], nullptr, y, nullptr, d, bpr, s.rows, stride_channel_y, glu_limit);
            } else if (s.gated) {
                mmvq_staged<GGML_TYPE_MXFP4, 1, true><<<dim3(s.rows, s.channels), block, 2 * row_bytes>>>(
                    w[c], g[c], y, ids, d, bpr, s.rows, stride_channel_y, glu_limit);
            } else {
                mmvq_staged<GGML_TYPE_MXFP4, NWARPS, false><<<dim3(s.rows / NWARPS, s.channels), block, NWARPS * row_bytes>>>(
                    w[c], nullptr, y, ids, d, bpr, s.rows, stride_channel_y, glu_limit);
            }
        };
        int walk_grid = 0;
        if (q8 && !s.n_expert) {
            int per_sm = 0;
            CK(cudaFuncSetAttribute(mmvq_q8_0_walk, cudaFuncAttributeMaxDynamicSharedMemorySize, 2 * row_bytes));
            CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mmvq_q8_0_walk, NWARPS * WARP, 2 * row_bytes));
            walk_grid = (int) std::min<size_t>(nout, (size_t) per_sm * nsm);
        }
        auto walk = [&](int c, float * d) {
            mmvq_q8_0_walk<<<walk_grid, dim3(WARP, NWARPS, 1), 2 * row_bytes>>>(w[c], y, d, bpr, s.rows, s.channels,
                stride_channel_y);
        };
        auto time_us = [&](auto && run, float * d) { return us_per_call([&](int i) { run(i % ncopies, d); }, e0, e1); };
        const float t_pin = time_us(pin, out[0]), t_staged = time_us(staged, out[1]);
        const float t_walk = walk_grid ? time_us(walk, out[2]) : 0.0f;
        CK(cudaGetLastError());
        pin(0, out[0]);
        staged(0, out[1]);
        if (walk_grid) walk(0, out[2]);
        CK(cudaDeviceSynchronize());
        std::vector<float> h[3];
        for (int i = 0; i < 3; ++i) {
            h[i].resize(nout);
            CK(cudaMemcpy(h[i].data(), out[i], nout * sizeof(float), cudaMemcpyDeviceToHost));
        }
        const bool same1 = memcmp(h[0].data(), h[1].data(), nout * sizeof(float)) == 0;
        const bool same2 = !walk_grid || memcmp(h[0].data(), h[2].data(), nout * sizeof(float)) == 0;
        failures += !same1 + !same2;
        const double gb = read_bytes / 1e3;
        const float best = walk_grid ? std::min(t_staged, t_walk) : t_staged;
        printf("%-48s %8.2f %8.2f %8.2f %9.3f  staged %s", s.name, t_pin, t_staged, t_walk, best / t_pin, same1 ? "yes" : "NO");
        if (walk_grid) printf(", walk %s (grid %d)", same2 ? "yes" : "NO", walk_grid);
        printf("; pin %.0f, staged %.0f", gb / t_pin, gb / t_staged);
        if (walk_grid) printf(", walk %.0f", gb / t_walk);
        printf("\n");
        for (char * p : w) CK(cudaFree(p));
        if (s.gated) for (char * p : g) CK(cudaFree(p));
        CK(cudaFree(y));
        if (ids) CK(cudaFree(ids));
        for (float * o : out) CK(cudaFree(o));
    }
    // Sibling matmuls: the one-token Q8_0 projections that read the same normed activation, launched one after the
    // other (today) against one launch over all their rows (what a sibling merge would run), both replayed as CUDA
    // graphs the way llama.cpp replays a decode step.
    struct siblings { const char * name; int K; bool multi_row; std::vector<int> rows; };
    const siblings sets[] = {
        {"raw layer: wq_a, wkv",                                       4096, false, {1024, 512}},
        {"HCA layer: wq_a, wkv, compressor kv, gate",                  4096, false, {1024, 512, 512, 512}},
        {"CSA layer: wq_a, wkv, compressor kv, gate, indexer x3",      4096, false, {1024, 512, 1024, 1024, 64, 256, 256}},
        {"CSA layer: wq_b, indexer q_b (K = 1024, 4 rows per block)",  1024, true,  {32768, 8192}},
        {"FFN: router, shared expert up, gate (not merged by 0031)",   4096, false, {16, 2048, 2048}},
    };
    printf("\n%-60s %10s %10s %8s\n", "sibling Q8_0 matmuls (graph replay)", "separate", "one launch", "ratio");
    for (const siblings & set : sets) {
        const int bpr = set.K / QK8_0, row_bytes = bpr * (int) sizeof(block_q8_0);
        int total_rows = 0;
        for (int r : set.rows) total_rows += r;
        const size_t wbytes = (size_t) row_bytes * total_rows;
        const int ncopies = (int) std::max<size_t>(2, (size_t) 400e6 / wbytes + 1);
        std::vector<char> hw(wbytes);
        fill_weights(hw, GGML_TYPE_Q8_0);
        std::vector<char *> w(ncopies);
        for (char *& p : w) p = dev(hw);
        std::vector<block_q8_1> hy(bpr);
        for (block_q8_1 & b : hy) {
            b.ds = make_half2(__float2half(frand(1e-3f, 1e-1f)), __float2half(0.0f));
            for (int i = 0; i < QK8_1; ++i) b.qs[i] = (int8_t) frand(-127.0f, 127.0f);
        }
        block_q8_1 * y = dev(hy);
        float * d = (float *) dev_nan((size_t) total_rows * sizeof(float));
        const uint3 one = init_fastdiv_values(1);
        // mul_mat_vec_q over `rows` rows as llama.cpp launches it at one token (4 rows per block on the multi-row path)
        auto rows_launch = [&](const char * x, float * o, int rows, cudaStream_t st) {
            const ggml_cuda_mm_fusion_args_device f{};
            if (set.multi_row) {
                mul_mat_vec_q<GGML_TYPE_Q8_0, 1, false, true><<<rows / NWARPS, dim3(WARP, NWARPS, 1), 0, st>>>(
                    x, y, nullptr, f, o, set.K, one, bpr, bpr, rows, one, bpr * rows, 0, rows, one, 0, 0, 0, 0);
            } else {
                mul_mat_vec_q<GGML_TYPE_Q8_0, 1, false><<<rows, dim3(WARP, NWARPS, 1), 0, st>>>(
                    x, y, nullptr, f, o, set.K, one, bpr, bpr, rows, one, bpr * rows, 0, rows, one, 0, 0, 0, 0);
            }
        };
        auto graph_us = [&](bool merged) {
            cudaStream_t st;
            CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
            std::vector<cudaGraphExec_t> execs(ncopies);
            for (int c = 0; c < ncopies; ++c) {
                cudaGraph_t gr;
                CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
                if (merged) {
                    rows_launch(w[c], d, total_rows, st);
                } else {
                    int off = 0;
                    for (int r : set.rows) {
                        rows_launch(w[c] + (size_t) off * row_bytes, d + off, r, st);
                        off += r;
                    }
                }
                CK(cudaStreamEndCapture(st, &gr));
                CK(cudaGraphInstantiate(&execs[c], gr, 0));
                CK(cudaGraphDestroy(gr));
            }
            const float us = us_per_call([&](int i) { CK(cudaGraphLaunch(execs[i % ncopies], st)); }, e0, e1, st);
            for (auto & e : execs) CK(cudaGraphExecDestroy(e));
            CK(cudaStreamDestroy(st));
            return us;
        };
        const float t_sep = graph_us(false), t_one = graph_us(true);
        printf("%-60s %10.2f %10.2f %8.3f\n", set.name, t_sep, t_one, t_one / t_sep);
        for (char * p : w) CK(cudaFree(p));
        CK(cudaFree(y));
        CK(cudaFree(d));
    }

    printf("%s\n", failures ? "FAIL: a candidate output differs from mul_mat_vec_q's" : "every candidate output equals mul_mat_vec_q's");
    return failures ? 1 : 0;
}
