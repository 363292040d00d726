// A program that maps part of its memory itself with the VMM API, as llama.cpp's CUDA backend
// does for its compute buffers (cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess)
// while its weights are cudaMalloc'd, built with nvcc's defaults and -lcuda. 1 GiB of
// "weights" (cudaMalloc, written once, read every step) and then a 512 MiB pool of
// "activations" (the program's own chunks of 256 MiB each), which every step rewrites eight
// times from the weights. Twenty steps, a device synchronization after each. The activations
// and the weights go into one FNV-1a digest, printed as JSON with the median step time: under
// `tiermem run` at any budget the digest must be the plain run's, bit for bit.
#include <algorithm>
#include <chrono>
#include <vector>
#include "common.cuh"

__global__ void layer(float* act, const float* w, size_t n, size_t wn) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) act[i] = act[i] * 0.5f + w[i % wn] * 0.25f;
}

int main() {
    const size_t W = 64u << 20, WBYTES = W * sizeof(float);  // 4 weight buffers of 256 MiB
    const size_t CHUNK = 256u << 20, POOL = 2 * CHUNK, A = POOL / sizeof(float);
    RT(cudaSetDevice(0));
    RT(cudaFree(0));  // the runtime's context, current: the VMM calls below use it
    float* w[4];
    for (int i = 0; i < 4; ++i) {
        RT(cudaMalloc(&w[i], WBYTES));
        iota<<<blocks(W), 256>>>(w[i], (float)i, W);
    }
    RT(cudaDeviceSynchronize());
    // The compute pool: the program's own chunks, mapped one after the other.
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUdeviceptr pool;
    CU(cuMemAddressReserve(&pool, POOL, 0, 0, 0));
    CUmemGenericAllocationHandle handles[2];
    for (int c = 0; c < 2; ++c) {
        CU(cuMemCreate(&handles[c], CHUNK, &prop, 0));
        CU(cuMemMap(pool + c * CHUNK, CHUNK, 0, handles[c], 0));
    }
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = 0;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CU(cuMemSetAccess(pool, POOL, &access, 1));
    float* act = (float*)pool;
    iota<<<blocks(A), 256>>>(act, 7.0f, A);
    std::vector<double> steps;
    for (int step = 0; step < 20; ++step) {
        auto t0 = std::chrono::steady_clock::now();
        for (int pass = 0; pass < 8; ++pass) layer<<<blocks(A), 256>>>(act, w[pass % 4], A, W);
        RT(cudaGetLastError());
        RT(cudaDeviceSynchronize());
        steps.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    uint64_t h = 1469598103934665603ull;
    std::vector<uint64_t> host(A / 2);
    RT(cudaMemcpy(host.data(), act, POOL, cudaMemcpyDeviceToHost));
    for (uint64_t x : host) { h ^= x; h *= 1099511628211ull; }
    for (int i = 0; i < 4; ++i) {
        RT(cudaMemcpy(host.data(), w[i], WBYTES, cudaMemcpyDeviceToHost));
        for (size_t k = 0; k < WBYTES / 8; ++k) { h ^= host[k]; h *= 1099511628211ull; }
    }
    std::sort(steps.begin() + 2, steps.end());
    double median = steps[2 + (steps.size() - 2) / 2];
    CU(cuMemUnmap(pool, POOL));
    for (int c = 0; c < 2; ++c) CU(cuMemRelease(handles[c]));
    CU(cuMemAddressFree(pool, POOL));
    for (int i = 0; i < 4; ++i) RT(cudaFree(w[i]));
    printf("{\"program\": \"vmm_pool\", \"digest\": \"%016llx\", \"peak_bytes\": %zu, \"step_s_median\": %.6f}\n",
           (unsigned long long)h, 4 * WBYTES + POOL, median);
    return 0;
}
