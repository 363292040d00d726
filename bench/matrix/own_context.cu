// A program that makes CUDA contexts of its own, as PyCUDA, cuda-python's examples and the CUDA
// samples' driver-API programs do (cuCtxCreate, not the runtime's primary context), built with
// nvcc's defaults and -lcuda. The runtime's kernels run in whichever context is current.
//  1. In a context of its own: rounds of work over 1 GiB, synchronizing the context each round;
//     then 512 MiB allocated and written but never freed, and the context destroyed.
//  2. Two contexts alive at once: a slow kernel left running in one while the other works and
//     synchronizes, then the first synchronized.
// Every result and whether the destroyed context's memory came back (the free
// memory cuMemGetInfo reports in a new context, against the first's) go into one FNV-1a digest,
// printed as JSON: under `tiermem run` at any budget it must be the plain run's, bit for bit.
#include <vector>
#include "common.cuh"

// Many passes over its buffer: a kernel that is still running when another context synchronizes.
__global__ void slow(float* p, int passes, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) { float v = p[i]; for (int k = 0; k < passes; ++k) v = v * 0.999f + 0.5f; p[i] = v; }
}

static const size_t N = 64u << 20;  // floats per buffer: 256 MiB
static const size_t BYTES = N * sizeof(float);

static CUcontext create(CUdevice dev) {
    CUcontext ctx;
#if CUDA_VERSION >= 13000
    CU(cuCtxCreate(&ctx, NULL, 0, dev));
#else
    CU(cuCtxCreate(&ctx, 0, dev));
#endif
    return ctx;
}

static float* alloc(float base) {
    CUdeviceptr p;
    CU(cuMemAlloc(&p, BYTES));
    iota<<<blocks(N), 256>>>((float*)p, base, N);
    RT(cudaGetLastError());
    return (float*)p;
}

static void digest_of(Digest& d, const float* p, std::vector<float>& host) {
    CU(cuMemcpyDtoH(host.data(), (CUdeviceptr)p, BYTES));
    d.bytes(host.data(), BYTES);
}

int main() {
    CU(cuInit(0));
    CUdevice dev;
    CU(cuDeviceGet(&dev, 0));
    std::vector<float> host(N);
    Digest d;

    // 1. A context of its own: 1 GiB worked on in rounds, then 512 MiB left allocated.
    CUcontext first = create(dev);
    size_t free_first, total;
    CU(cuMemGetInfo(&free_first, &total));
    float* a[4];
    for (int i = 0; i < 4; ++i) a[i] = alloc((float)i);
    for (int round = 0; round < 6; ++round) {
        for (int i = 0; i < 4; ++i) axpy<<<blocks(N), 256>>>(a[(i + 1) % 4], a[i], 0.5f, N);
        RT(cudaGetLastError());
        CU(cuCtxSynchronize());
    }
    for (int i = 0; i < 4; ++i) digest_of(d, a[i], host);
    for (int i = 0; i < 4; ++i) CU(cuMemFree((CUdeviceptr)a[i]));
    float* leaked[2] = {alloc(10.0f), alloc(11.0f)};
    CU(cuCtxSynchronize());
    digest_of(d, leaked[1], host);
    CU(cuCtxDestroy(first));  // frees the leaked buffers, as the driver does

    // 2. Two contexts at once: a slow kernel left running in one while the other works.
    CUcontext second = create(dev);
    size_t free_again;
    CU(cuMemGetInfo(&free_again, &total));
    d.word(free_again + (64u << 20) >= free_first);  // the destroyed context's memory came back
    CUcontext third = create(dev);  // current now, `second` below it
    float* x[2] = {alloc(20.0f), alloc(21.0f)};
    for (int i = 0; i < 2; ++i) slow<<<blocks(N), 256>>>(x[i], 200, N);
    RT(cudaGetLastError());
    CUcontext popped;
    CU(cuCtxPopCurrent(&popped));  // `second` current, `third`'s kernels still running
    d.word(popped == third);
    CU(cuCtxPushCurrent(second));
    float* y[4];
    for (int i = 0; i < 4; ++i) y[i] = alloc(30.0f + i);
    for (int round = 0; round < 4; ++round) {
        for (int i = 0; i < 4; ++i) axpy<<<blocks(N), 256>>>(y[(i + 3) % 4], y[i], 0.25f, N);
        RT(cudaGetLastError());
        CU(cuCtxSynchronize());
    }
    for (int i = 0; i < 4; ++i) digest_of(d, y[i], host);
    CU(cuCtxPopCurrent(&popped));
    CU(cuCtxPushCurrent(third));
    CU(cuCtxSynchronize());
    for (int i = 0; i < 2; ++i) digest_of(d, x[i], host);
    for (int i = 0; i < 2; ++i) CU(cuMemFree((CUdeviceptr)x[i]));
    CU(cuCtxDestroy(third));
    CU(cuCtxSetCurrent(second));
    for (int i = 0; i < 4; ++i) CU(cuMemFree((CUdeviceptr)y[i]));
    CU(cuCtxDestroy(second));
    printf("{\"program\": \"own_context\", \"digest\": \"%016llx\", \"peak_bytes\": %zu}\n",
           (unsigned long long)d.h, 6 * BYTES);
    return 0;
}
