// What the C programs of the coverage matrix share: error checks that exit naming the failing
// call, an FNV-1a digest of their results, and two kernels.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda.h>
#include <cuda_runtime.h>

#define CU(call) do { CUresult r = (call); if (r != CUDA_SUCCESS) { \
    fprintf(stderr, "%s (line %d): CUDA error %d\n", #call, __LINE__, (int)r); exit(1); } } while (0)
#define RT(call) do { cudaError_t e = (call); if (e != cudaSuccess) { \
    fprintf(stderr, "%s (line %d): %s\n", #call, __LINE__, cudaGetErrorString(e)); exit(1); } } while (0)

struct Digest {
    uint64_t h = 1469598103934665603ull;
    void word(uint64_t w) { h ^= w; h *= 1099511628211ull; }
    void bytes(const void* p, size_t n) {  // by 8-byte words (n a multiple of 8)
        const uint64_t* w = (const uint64_t*)p;
        for (size_t i = 0; i < n / 8; ++i) word(w[i]);
    }
};

__global__ void iota(float* p, float base, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) p[i] = base + (float)(i % 4096);
}
__global__ void axpy(const float* a, float* b, float k, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) b[i] = a[i] * k + b[i];
}
static inline unsigned blocks(size_t n) { return (unsigned)((n + 255) / 256); }
