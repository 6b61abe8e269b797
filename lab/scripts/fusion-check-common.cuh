// What lab/scripts/dsv4-*-fusion-check.cu and dsv4-fa-d512-bench.cu share: the ggml and ggml-cuda functions that the kernel
// sources they include refer to from their host-side ops (the programs launch the kernels directly, so these abort if
// ever called, except the two
// that the pin's ggml_cuda_kernel_launch asks: the device and its compute capability), CUDA error checks, a
// deterministic random source and device buffers. Include after the kernel sources.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

[[noreturn]] static void not_here(const char * f) { fprintf(stderr, "%s is not part of this check\n", f); abort(); }
extern "C" {
void ggml_abort(const char *, int, const char *, ...) { not_here("ggml_abort"); }
int64_t ggml_nelements(const struct ggml_tensor *) { not_here("ggml_nelements"); }
int64_t ggml_nrows(const struct ggml_tensor *) { not_here("ggml_nrows"); }
size_t ggml_type_size(enum ggml_type) { not_here("ggml_type_size"); }
const char * ggml_type_name(enum ggml_type) { not_here("ggml_type_name"); }
size_t ggml_element_size(const struct ggml_tensor *) { not_here("ggml_element_size"); }
bool ggml_is_contiguous(const struct ggml_tensor *) { not_here("ggml_is_contiguous"); }
bool ggml_is_contiguous_1(const struct ggml_tensor *) { not_here("ggml_is_contiguous_1"); }
bool ggml_is_contiguous_rows(const struct ggml_tensor *) { not_here("ggml_is_contiguous_rows"); }
bool ggml_are_same_shape(const struct ggml_tensor *, const struct ggml_tensor *) { not_here("ggml_are_same_shape"); }
bool ggml_are_same_stride(const struct ggml_tensor *, const struct ggml_tensor *) { not_here("ggml_are_same_stride"); }
bool ggml_is_empty(const struct ggml_tensor *) { not_here("ggml_is_empty"); }
enum ggml_unary_op ggml_get_unary_op(const struct ggml_tensor *) { not_here("ggml_get_unary_op"); }
void ggml_rope_yarn_corr_dims(int, int, float, float, float, float[2]) { not_here("ggml_rope_yarn_corr_dims"); }
}
void ggml_cuda_error(const char * stmt, const char * func, const char * file, int line, const char * msg) {
    fprintf(stderr, "CUDA error: %s (%s in %s at %s:%d)\n", msg, stmt, func, file, line);
    exit(2);
}
void ggml_cuda_set_device(int) { not_here("ggml_cuda_set_device"); }
int ggml_cuda_get_device() { int d = 0; cudaGetDevice(&d); return d; }
const ggml_cuda_device_info & ggml_cuda_info() {
    static ggml_cuda_device_info info = [] {
        ggml_cuda_device_info i = {};
        i.device_count = 1;
        int major = 0, minor = 0;
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
        i.devices[0].cc = 100 * major + 10 * minor;
        i.devices[0].warp_size = 32;  // what the host dispatch of mmvq.cu sizes its blocks by
        return i;
    }();
    return info;
}

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); exit(2); } } while (0)

static uint64_t rng_state = 42;
static float frand(float lo, float hi) {  // deterministic LCG
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (float) ((rng_state >> 40) & 0xffffff) / (float) 0xffffff;
}

template <typename T> static T * dev(const std::vector<T> & h) {  // a device copy of h
    T * d;
    CK(cudaMalloc(&d, h.size() * sizeof(T)));
    CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

static void * dev_nan(size_t bytes) {
    void * d;
    CK(cudaMalloc(&d, bytes));
    CK(cudaMemset(d, 0xff, bytes));  // NaN bits: an output left unwritten shows as a difference
    return d;
}
