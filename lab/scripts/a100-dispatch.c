// A100 dispatch on a newer GPU (issue 41): an LD_PRELOAD shim that makes the CUDA runtime report an A100-SXM4's
// properties, so llama.cpp's HOST-side dispatch (kernel choice by compute capability, MMQ/MMVQ/flash-attention limits,
// stream-k and tile sizes by SM count and shared memory) takes an A100's paths. The device code is the sm_80 build's
// already (PTX JIT on an H200); this only changes what the host decides.
//
//   gcc -shared -fPIC -O2 -I/usr/local/cuda/include -o a100-dispatch.so lab/scripts/a100-dispatch.c -ldl
//   LD_PRELOAD=$PWD/a100-dispatch.so llama-bench ...     # lab/bench/dispatch.py builds and sets it (--dispatch a100)
//
// What the pinned tree reads (ggml/src/ggml-cuda, read for this shim):
//   ggml-cuda.cu ggml_cuda_init(): cudaGetDeviceProperties -> cc = 100*major + 10*minor, nsm = multiProcessorCount,
//     smpb = sharedMemPerBlock, smpbo = sharedMemPerBlockOptin, warp_size, totalGlobalMem (default tensor split);
//     cudaDeviceGetAttribute(cudaDevAttrCooperativeLaunch); the log line "Device N: NAME, compute capability M.m, VMM: ..."
//     that lab/bench/dispatch.py reads back as proof. Every later dispatch reads ggml_cuda_info() (cc, nsm, smpbo).
//   fattn-common.cuh: cudaOccupancyMaxActiveBlocksPerMultiprocessor x nsm sizes the flash-attention grid; an H200 SM
//     holds 228 KiB of shared memory, an A100's 164 KiB, so the occupancy calls are clamped to an A100's shared memory
//     (registers, threads and blocks per SM are the same on sm_80 and sm_90). A100_DISPATCH_OCCUPANCY=0 leaves them alone.
//   Driver API: only cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) (VMM pool), the
//     same answer on both; it is NOT wrapped: cuBLAS and the runtime itself must keep seeing the real sm_90 to load
//     their own SASS (they reach the driver through cuGetProcAddress, not through this shim, and cuBLAS carries its
//     own static runtime, so the wrappers below do not reach it either).
// Overwritten: major 8, minor 0, multiProcessorCount 108, sharedMemPerBlockOptin 166912, sharedMemPerMultiprocessor
// 167936, l2CacheSize 41943040 (40 MiB), and the same cudaDevAttr* values. Name, memory and clocks stay the real ones.
//
// ABI: CUDA 13 exports cudaGetDeviceProperties with CUDA 13's struct; CUDA 12 headers map that name to
// cudaGetDeviceProperties_v2 (CUDA 12's struct). Both symbols are exported here; the one that matches the headers this
// file was built with is overwritten (and only when libcudart's major version is the headers' too), the other is
// passed through with a one-line note. Build the shim with the toolkit the program was built with.
// Prints one line to stderr per device the first time it answers for it:
//   a100-dispatch: device 0 reported as cc 8.0, 108 SMs, 166912 B opt-in smem/block, 167936 B smem/SM, 40 MiB L2
//   (really cc 9.0, 132 SMs, 232448 B, 233472 B, 60 MiB)
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#ifdef cudaGetDeviceProperties  // CUDA 12 headers: #define cudaGetDeviceProperties cudaGetDeviceProperties_v2
#undef cudaGetDeviceProperties
#endif

#define A100_MAJOR 8
#define A100_MINOR 0
#define A100_SMS 108
#define A100_SMEM_OPTIN 166912        // 163 KiB per block, opt-in
#define A100_SMEM_PER_SM 167936       // 164 KiB per SM
#define A100_L2 41943040              // 40 MiB
#define A100_SMEM_RESERVED 1024       // per block, sm_80 (and sm_90)
#define A100_SMEM_GRANULE 128

typedef cudaError_t (*props_fn)(struct cudaDeviceProp *, int);
typedef cudaError_t (*attr_fn)(int *, enum cudaDeviceAttr, int);
typedef cudaError_t (*occ_fn)(int *, const void *, int, size_t);
typedef cudaError_t (*occ_flags_fn)(int *, const void *, int, size_t, unsigned int);
typedef cudaError_t (*func_attr_fn)(struct cudaFuncAttributes *, const void *);
typedef cudaError_t (*version_fn)(int *);

static void *next_symbol(const char *name) {
    void *p = dlsym(RTLD_NEXT, name);
    if (!p) {
        fprintf(stderr, "a100-dispatch: %s not found after the shim (is libcudart linked dynamically?)\n", name);
    }
    return p;
}

static unsigned long long announced;  // one bit per device: its line is printed
static int notes;                     // one bit per note printed

static void note_once(int bit, const char *text) {
    if (!(__atomic_fetch_or(&notes, 1 << bit, __ATOMIC_RELAXED) & (1 << bit))) {
        fprintf(stderr, "a100-dispatch: %s\n", text);
    }
}

// 1 when libcudart's major version is the one of the headers this file was built with (the struct layouts agree).
static int runtime_matches_headers(void) {
    static int cached = -1;
    if (cached < 0) {
        version_fn get = (version_fn) dlsym(RTLD_NEXT, "cudaRuntimeGetVersion");
        int v = 0;
        cached = get && get(&v) == cudaSuccess && v / 1000 == CUDART_VERSION / 1000;
        if (!cached) {
            char line[200];
            snprintf(line, sizeof line, "libcudart %d.%d is not the CUDA %d the shim was built with: properties "
                     "passed through unchanged (build it with the program's toolkit)", v / 1000, v % 1000 / 10,
                     CUDART_VERSION / 1000);
            note_once(0, line);
        }
    }
    return cached;
}

static void announce(int device, const struct cudaDeviceProp *real) {
    if (device < 0 || device >= 64) {
        return;
    }
    unsigned long long bit = 1ULL << device;
    if (__atomic_fetch_or(&announced, bit, __ATOMIC_RELAXED) & bit) {
        return;
    }
    if (real) {
        fprintf(stderr, "a100-dispatch: device %d reported as cc %d.%d, %d SMs, %d B opt-in smem/block, %d B smem/SM, "
                "%d MiB L2 (really cc %d.%d, %d SMs, %zu B, %zu B, %d MiB)\n", device, A100_MAJOR, A100_MINOR, A100_SMS,
                A100_SMEM_OPTIN, A100_SMEM_PER_SM, A100_L2 >> 20, real->major, real->minor, real->multiProcessorCount,
                real->sharedMemPerBlockOptin, real->sharedMemPerMultiprocessor, real->l2CacheSize >> 20);
    } else {
        fprintf(stderr, "a100-dispatch: device %d reported as cc %d.%d, %d SMs, %d B opt-in smem/block, %d B smem/SM, "
                "%d MiB L2 (attributes)\n", device, A100_MAJOR, A100_MINOR, A100_SMS, A100_SMEM_OPTIN, A100_SMEM_PER_SM,
                A100_L2 >> 20);
    }
}

static void overwrite(struct cudaDeviceProp *prop, int device) {
    struct cudaDeviceProp real = *prop;
    prop->major = A100_MAJOR;
    prop->minor = A100_MINOR;
    prop->multiProcessorCount = A100_SMS;
    prop->sharedMemPerBlockOptin = A100_SMEM_OPTIN;
    prop->sharedMemPerMultiprocessor = A100_SMEM_PER_SM;
    prop->l2CacheSize = A100_L2;
    announce(device, &real);
}

static cudaError_t properties(const char *name, struct cudaDeviceProp *prop, int device, int same_abi) {
    static props_fn real[2];
    int i = strcmp(name, "cudaGetDeviceProperties") != 0;
    if (!real[i] && !(real[i] = (props_fn) next_symbol(name))) {
        return cudaErrorUnknown;
    }
    cudaError_t err = real[i](prop, device);
    if (err != cudaSuccess || !prop) {
        return err;
    }
    if (!same_abi) {
        note_once(1 + i, i ? "cudaGetDeviceProperties_v2 (CUDA 12's struct) passed through: this shim was built with "
                             "CUDA 13 headers; build it with CUDA 12's for a CUDA 12 program"
                           : "cudaGetDeviceProperties (CUDA 11's struct) passed through: this shim was built with CUDA 12 "
                             "headers, whose programs call cudaGetDeviceProperties_v2");
        return err;
    }
    if (runtime_matches_headers()) {
        overwrite(prop, device);
    }
    return err;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    return properties("cudaGetDeviceProperties", prop, device, CUDART_VERSION >= 13000);
}

cudaError_t cudaGetDeviceProperties_v2(struct cudaDeviceProp *prop, int device) {
    return properties("cudaGetDeviceProperties_v2", prop, device, CUDART_VERSION < 13000);
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
    static attr_fn real;
    if (!real && !(real = (attr_fn) next_symbol("cudaDeviceGetAttribute"))) {
        return cudaErrorUnknown;
    }
    cudaError_t err = real(value, attr, device);
    if (err != cudaSuccess || !value) {
        return err;
    }
    int before = *value;
    switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = A100_MAJOR; break;
    case cudaDevAttrComputeCapabilityMinor: *value = A100_MINOR; break;
    case cudaDevAttrMultiProcessorCount: *value = A100_SMS; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = A100_SMEM_OPTIN; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = A100_SMEM_PER_SM; break;
    case cudaDevAttrL2CacheSize: *value = A100_L2; break;
    default: break;
    }
    if (*value != before) {
        announce(device, NULL);
    }
    return err;
}

// An A100's blocks per SM for this kernel: the real answer (registers, threads and blocks per SM are the same limits
// on sm_80 and sm_90) clamped by an A100 SM's shared memory.
static void clamp_to_a100(int *blocks, const void *func, size_t dynamic_smem) {
    static func_attr_fn attrs;
    const char *env = getenv("A100_DISPATCH_OCCUPANCY");
    if (!blocks || *blocks <= 0 || (env && strcmp(env, "0") == 0)) {
        return;
    }
    if (!attrs && !(attrs = (func_attr_fn) next_symbol("cudaFuncGetAttributes"))) {
        return;
    }
    struct cudaFuncAttributes fa;
    memset(&fa, 0, sizeof fa);
    if (attrs(&fa, func) != cudaSuccess) {
        return;
    }
    size_t per_block = fa.sharedSizeBytes + dynamic_smem;
    if (per_block == 0) {
        return;
    }
    per_block += A100_SMEM_RESERVED;
    per_block = (per_block + A100_SMEM_GRANULE - 1) / A100_SMEM_GRANULE * A100_SMEM_GRANULE;
    int limit = (int) (A100_SMEM_PER_SM / per_block);
    if (limit < *blocks) {
        *blocks = limit;
    }
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, const void *func, int block_size,
                                                           size_t dynamic_smem) {
    static occ_fn real;
    if (!real && !(real = (occ_fn) next_symbol("cudaOccupancyMaxActiveBlocksPerMultiprocessor"))) {
        return cudaErrorUnknown;
    }
    cudaError_t err = real(blocks, func, block_size, dynamic_smem);
    if (err == cudaSuccess) {
        clamp_to_a100(blocks, func, dynamic_smem);
    }
    return err;
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *blocks, const void *func, int block_size,
                                                                    size_t dynamic_smem, unsigned int flags) {
    static occ_flags_fn real;
    if (!real && !(real = (occ_flags_fn) next_symbol("cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags"))) {
        return cudaErrorUnknown;
    }
    cudaError_t err = real(blocks, func, block_size, dynamic_smem, flags);
    if (err == cudaSuccess) {
        clamp_to_a100(blocks, func, dynamic_smem);
    }
    return err;
}
