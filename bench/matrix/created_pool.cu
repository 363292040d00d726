// A program that makes a memory pool of its own and allocates from it in stream order, as
// RAPIDS' cuda_async_memory_resource does (cudaMemPoolCreate: pinned memory of the GPU, a
// release threshold of everything), built with nvcc's defaults. Rounds of work over 1.5 GiB of
// buffers allocated from the pool (cudaMallocFromPoolAsync) and, with the pool made the
// device's current one, by cudaMallocAsync; buffers freed and allocated again in stream order
// between rounds; then a pool with shareable handles (POSIX file descriptors), whose memory is
// the driver's under tiermem. Every result goes into one FNV-1a digest, printed as JSON: under
// `tiermem run` at any budget it must be the plain run's, bit for bit.
#include <vector>
#include <cstring>
#include "common.cuh"

static const size_t N = 64u << 20;  // floats per buffer: 256 MiB
static const size_t BYTES = N * sizeof(float);

static cudaMemPool_t make_pool(cudaMemAllocationHandleType handles) {
    cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = handles;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    cudaMemPool_t pool;
    RT(cudaMemPoolCreate(&pool, &props));
    uint64_t keep = UINT64_MAX;  // keep freed memory across synchronizations, as RMM does
    RT(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    return pool;
}

static void digest_of(Digest& d, const float* p, std::vector<float>& host, cudaStream_t s) {
    RT(cudaMemcpyAsync(host.data(), p, BYTES, cudaMemcpyDeviceToHost, s));
    RT(cudaStreamSynchronize(s));
    d.bytes(host.data(), BYTES);
}

int main() {
    RT(cudaSetDevice(0));
    cudaStream_t s;
    RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::vector<float> host(N);
    Digest d;
    cudaMemPool_t pool = make_pool(cudaMemHandleTypeNone);
    float* buf[6];
    for (int i = 0; i < 4; ++i) {
        RT(cudaMallocFromPoolAsync((void**)&buf[i], BYTES, pool, s));
        iota<<<blocks(N), 256, 0, s>>>(buf[i], (float)i, N);
    }
    RT(cudaDeviceSetMemPool(0, pool));  // cudaMallocAsync now allocates from it
    for (int i = 4; i < 6; ++i) {
        RT(cudaMallocAsync((void**)&buf[i], BYTES, s));
        iota<<<blocks(N), 256, 0, s>>>(buf[i], (float)i, N);
    }
    for (int round = 0; round < 6; ++round) {
        for (int i = 0; i < 6; ++i) axpy<<<blocks(N), 256, 0, s>>>(buf[(i + 1) % 6], buf[i], 0.5f, N);
        RT(cudaGetLastError());
        // One buffer freed and made again in stream order each round: the pool's reuse.
        int again = round % 6;
        digest_of(d, buf[again], host, s);
        RT(cudaFreeAsync(buf[again], s));
        RT(cudaMallocFromPoolAsync((void**)&buf[again], BYTES, pool, s));
        iota<<<blocks(N), 256, 0, s>>>(buf[again], (float)(10 + round), N);
        RT(cudaStreamSynchronize(s));
    }
    for (int i = 0; i < 6; ++i) digest_of(d, buf[i], host, s);
    for (int i = 0; i < 6; ++i) RT(cudaFreeAsync(buf[i], s));
    RT(cudaStreamSynchronize(s));
    RT(cudaMemPoolTrimTo(pool, 0));

    // A pool with shareable handles: the driver's own memory, under tiermem too.
    cudaMemPool_t shareable = make_pool(cudaMemHandleTypePosixFileDescriptor);
    float* x;
    RT(cudaMallocFromPoolAsync((void**)&x, BYTES, shareable, s));
    iota<<<blocks(N), 256, 0, s>>>(x, 99.0f, N);
    axpy<<<blocks(N), 256, 0, s>>>(x, x, 0.25f, N);
    digest_of(d, x, host, s);
    RT(cudaFreeAsync(x, s));
    RT(cudaStreamSynchronize(s));
    cudaMemPool_t default_pool;
    RT(cudaDeviceGetDefaultMemPool(&default_pool, 0));
    RT(cudaDeviceSetMemPool(0, default_pool));
    RT(cudaMemPoolDestroy(shareable));
    RT(cudaMemPoolDestroy(pool));
    printf("{\"program\": \"created_pool\", \"digest\": \"%016llx\", \"peak_bytes\": %zu}\n",
           (unsigned long long)d.h, 6 * BYTES);
    return 0;
}
