// A tour of the CUDA runtime API over device memory, built with nvcc's defaults: what programs do
// besides cudaMalloc and a kernel. Pitched 2D buffers (cudaMallocPitch, cudaMemcpy2D,
// cudaMemset2D), a texture object over a linear buffer, interior pointers, pointer attributes,
// streams ordered by events, host functions in a stream, stream-ordered allocations, managed
// memory beside device memory, four host threads allocating and freeing on streams of their own,
// the errors bad calls get (a double free, a foreign pointer, zero bytes, an impossible size), and
// a device reset with a buffer still allocated, then work again.
// Everything it computes and every error code it is given go into one FNV-1a digest, printed as
// JSON: under `tiermem run` at any budget it must be the plain run's, bit for bit.
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
#include <cuda_runtime.h>

#define CHECK(call) do { cudaError_t e = (call); if (e != cudaSuccess) { \
    fprintf(stderr, "%s (line %d): %s\n", #call, __LINE__, cudaGetErrorString(e)); exit(1); } } while (0)

struct Digest {
    uint64_t h = 1469598103934665603ull;
    void word(uint64_t w) { h ^= w; h *= 1099511628211ull; }
    void bytes(const void* p, size_t n) {  // by 8-byte words (n a multiple of 8): fast enough for GiBs
        const uint64_t* w = (const uint64_t*)p;
        for (size_t i = 0; i < n / 8; ++i) word(w[i]);
    }
};

__global__ void scale2d(float* p, size_t pitch, int width, int height, float k) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    if (x < width && y < height) { float* row = (float*)((char*)p + y * pitch); row[x] = row[x] * k + y; }
}
__global__ void from_texture(cudaTextureObject_t t, float* out, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = tex1Dfetch<float>(t, (int)i) * 2.0f + 1.0f;
}
__global__ void axpy(const float* a, float* b, float k, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) b[i] = a[i] * k + b[i];
}
__global__ void iota(float* p, float base, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) p[i] = base + (float)(i % 4096);
}
static unsigned blocks(size_t n) { return (unsigned)((n + 255) / 256); }
static void CUDART_CB bump(void* counter) { ++*(int*)counter; }

// A host thread's work: rounds of allocate, fill, add, copy back, free, on a stream of its own.
static void worker(int id, uint64_t* out) {
    CHECK(cudaSetDevice(0));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const size_t n = 16u << 20;  // 64 MiB
    std::vector<float> host(n);
    Digest d;
    for (int round = 0; round < 6; ++round) {
        float *x, *y;
        CHECK(cudaMalloc(&x, n * sizeof(float)));
        CHECK(cudaMalloc(&y, n * sizeof(float)));
        iota<<<blocks(n), 256, 0, s>>>(x, (float)(id * 100 + round), n);
        CHECK(cudaMemsetAsync(y, 0, n * sizeof(float), s));
        axpy<<<blocks(n), 256, 0, s>>>(x, y, 0.25f, n);
        CHECK(cudaMemcpyAsync(host.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        d.bytes(host.data(), n * sizeof(float));
        CHECK(cudaFree(x));
        CHECK(cudaFree(y));
    }
    CHECK(cudaStreamDestroy(s));
    *out = d.h;
}

int main() {
    Digest d;
    size_t free0, total0;
    CHECK(cudaMemGetInfo(&free0, &total0));
    d.word(free0 <= total0 && total0 > 0);

    // Pitched 2D: 8192 x 16384 floats (512 MiB), copied in from a host array of another pitch.
    const int width = 8192, height = 16384;
    float* image;
    size_t pitch;
    CHECK(cudaMallocPitch(&image, &pitch, width * sizeof(float), height));
    std::vector<float> rows((size_t)(width + 16) * height);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = (float)((i * 2654435761u) % 1000) / 1000.0f;
    CHECK(cudaMemcpy2D(image, pitch, rows.data(), (width + 16) * sizeof(float), width * sizeof(float), height,
                       cudaMemcpyHostToDevice));
    CHECK(cudaMemset2D((char*)image + 64 * pitch, pitch, 0, 256 * sizeof(float), 32));
    scale2d<<<dim3((width + 255) / 256, height), 256>>>(image, pitch, width, height, 0.5f);
    CHECK(cudaGetLastError());

    // Linear buffers: a texture over one, kernels on interior pointers, copies between them.
    const size_t n = 64u << 20;  // 256 MiB each
    float *a, *b, *c;
    CHECK(cudaMalloc(&a, n * sizeof(float)));
    CHECK(cudaMalloc(&b, n * sizeof(float)));
    CHECK(cudaMalloc(&c, n * sizeof(float)));
    CHECK(cudaMemset(b, 0, n * sizeof(float)));  // what cudaMalloc gives is undefined: never read it
    CHECK(cudaMemcpy2D(a, width * sizeof(float), image, pitch, width * sizeof(float), n / width, cudaMemcpyDeviceToDevice));
    cudaResourceDesc resource;
    memset(&resource, 0, sizeof resource);
    resource.resType = cudaResourceTypeLinear;
    resource.res.linear.devPtr = a;
    resource.res.linear.desc = cudaCreateChannelDesc<float>();
    resource.res.linear.sizeInBytes = (1u << 26);  // 64 MiB: within the texture's limit of 2^27 texels
    cudaTextureDesc texture;
    memset(&texture, 0, sizeof texture);
    texture.readMode = cudaReadModeElementType;
    cudaTextureObject_t t;
    CHECK(cudaCreateTextureObject(&t, &resource, &texture, nullptr));
    from_texture<<<blocks(1u << 24), 256>>>(t, b, 1u << 24);
    CHECK(cudaMemcpy(b + (1u << 24), a + 12345, ((1u << 24) - 12345) * sizeof(float), cudaMemcpyDeviceToDevice));
    axpy<<<blocks(n / 2), 256>>>(a + n / 2, b + n / 4, -1.5f, n / 2);
    CHECK(cudaGetLastError());
    CHECK(cudaDestroyTextureObject(t));

    cudaPointerAttributes attributes;
    CHECK(cudaPointerGetAttributes(&attributes, b + 1000));
    d.word(attributes.type == cudaMemoryTypeDevice && attributes.device == 0);

    // Two streams ordered by an event, a host function between, a stream-ordered allocation.
    cudaStream_t s1, s2;
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t ready;
    CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    CHECK(cudaDeviceSynchronize());
    iota<<<blocks(n), 256, 0, s1>>>(c, 7.0f, n);
    int bumped = 0;
    CHECK(cudaLaunchHostFunc(s1, bump, &bumped));
    CHECK(cudaEventRecord(ready, s1));
    CHECK(cudaStreamWaitEvent(s2, ready, 0));
    float* scratch;
    CHECK(cudaMallocAsync(&scratch, n * sizeof(float), s2));
    CHECK(cudaMemcpyAsync(scratch, c, n * sizeof(float), cudaMemcpyDeviceToDevice, s2));
    axpy<<<blocks(n), 256, 0, s2>>>(b, scratch, 3.0f, n);
    CHECK(cudaMemcpyAsync(c, scratch, n * sizeof(float), cudaMemcpyDeviceToDevice, s2));
    CHECK(cudaFreeAsync(scratch, s2));
    CHECK(cudaStreamSynchronize(s2));
    d.word(bumped);

    // Managed memory beside it: passed through, counted, never moved by tiermem.
    float* managed;
    CHECK(cudaMallocManaged(&managed, 1u << 24));
    iota<<<blocks(1u << 22), 256>>>(managed, 3.0f, 1u << 22);
    axpy<<<blocks(1u << 22), 256>>>(c + 99, managed, 0.5f, 1u << 22);
    CHECK(cudaDeviceSynchronize());
    d.bytes(managed, 1u << 24);
    CHECK(cudaFree(managed));

    // Four host threads at once, each allocating and freeing on its own stream.
    uint64_t hashes[4];
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) threads.emplace_back(worker, i, &hashes[i]);
    for (auto& thread : threads) thread.join();
    for (uint64_t h : hashes) d.word(h);

    // The errors bad calls get: each code goes into the digest, so tiermem must give the driver's.
    d.word(cudaFree((void*)0x1234));
    float* zero = (float*)0x1;
    d.word(cudaMalloc(&zero, 0));
    d.word(zero == nullptr);
    float* impossible;
    d.word(cudaMalloc(&impossible, 1ull << 50));
    d.word(cudaGetLastError());
    float* twice;
    CHECK(cudaMalloc(&twice, 1u << 20));
    CHECK(cudaFree(twice));
    d.word(cudaFree(twice));
    d.word(cudaGetLastError());

    // The results: the image, the three buffers.
    std::vector<float> back((size_t)width * height);
    CHECK(cudaMemcpy2D(back.data(), width * sizeof(float), image, pitch, width * sizeof(float), height,
                       cudaMemcpyDeviceToHost));
    d.bytes(back.data(), back.size() * sizeof(float));
    for (float* p : {a, b, c}) {
        CHECK(cudaMemcpy(back.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
        d.bytes(back.data(), n * sizeof(float));
    }
    for (float* p : {image, a, b}) CHECK(cudaFree(p));
    CHECK(cudaStreamDestroy(s1));
    CHECK(cudaStreamDestroy(s2));
    CHECK(cudaEventDestroy(ready));

    // A device reset, as CUDA's samples end and some programs do between phases, with one buffer
    // (c) never freed: the driver frees everything. Then the program starts again: four buffers
    // (1 GiB: beyond half the peak, so some start on the host and move), each made from the one
    // before, three rounds, a synchronization each; and a reset at the end.
    CHECK(cudaDeviceReset());
    float* ring[4];
    for (int i = 0; i < 4; ++i) {
        CHECK(cudaMalloc(&ring[i], n * sizeof(float)));
        iota<<<blocks(n), 256>>>(ring[i], 5.0f + i, n);
    }
    for (int round = 0; round < 3; ++round) {
        for (int i = 0; i < 4; ++i) axpy<<<blocks(n), 256>>>(ring[i], ring[(i + 1) % 4], 0.5f, n);
        CHECK(cudaDeviceSynchronize());
    }
    for (float* p : ring) {
        CHECK(cudaMemcpy(back.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
        d.bytes(back.data(), n * sizeof(float));
        CHECK(cudaFree(p));
    }
    CHECK(cudaDeviceReset());
    // The most held at once: the image and the three buffers, with the scratch or the threads'.
    const size_t peak = pitch * height + 3 * n * sizeof(float) + 4 * 2 * (64u << 20);
    printf("{\"program\": \"cuda_api_tour\", \"digest\": \"%016llx\", \"peak_bytes\": %zu}\n",
           (unsigned long long)d.h, peak);
    return 0;
}
