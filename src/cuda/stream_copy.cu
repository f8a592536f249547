/* Streams, events, asynchronous host-to-device copies and host callbacks for the weight streamer
 * (src/mem/streamer.c), and a test kernel that reads a buffer late (tests/test_streamer.c). */
#include "cuda/cuda_internal.cuh"

extern "C" h3_cuda_stream_h h3_cuda_compute_stream(h3_exec *ex) {
    return ex && ex->cuda ? (h3_cuda_stream_h)cuda_state(ex)->compute : NULL;
}

extern "C" h3_cuda_stream_h h3_cuda_copy_stream(h3_exec *ex) {
    return ex && ex->cuda ? (h3_cuda_stream_h)cuda_state(ex)->copy : NULL;
}

extern "C" h3_status h3_cuda_stream_create(h3_cuda_stream_h *out) {
    cudaStream_t s;
    CU_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *out = (h3_cuda_stream_h)s;
    return H3_OK;
}

extern "C" void h3_cuda_stream_destroy(h3_cuda_stream_h s) {
    if (s) cudaStreamDestroy((cudaStream_t)s);
}

extern "C" h3_status h3_cuda_stream_sync(h3_cuda_stream_h s) {
    CU_TRY(cudaStreamSynchronize((cudaStream_t)s));
    return H3_OK;
}

extern "C" h3_status h3_cuda_event_create(h3_cuda_event_h *out, int timing) {
    cudaEvent_t e;
    CU_TRY(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
    *out = (h3_cuda_event_h)e;
    return H3_OK;
}

extern "C" void h3_cuda_event_destroy(h3_cuda_event_h e) {
    if (e) cudaEventDestroy((cudaEvent_t)e);
}

extern "C" h3_status h3_cuda_event_record(h3_cuda_event_h e, h3_cuda_stream_h s) {
    CU_TRY(cudaEventRecord((cudaEvent_t)e, (cudaStream_t)s));
    return H3_OK;
}

extern "C" h3_status h3_cuda_stream_wait(h3_cuda_stream_h s, h3_cuda_event_h e) {
    CU_TRY(cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)e, 0));
    return H3_OK;
}

extern "C" h3_status h3_cuda_event_sync(h3_cuda_event_h e) {
    CU_TRY(cudaEventSynchronize((cudaEvent_t)e));
    return H3_OK;
}

extern "C" int h3_cuda_event_done(h3_cuda_event_h e) {
    cudaError_t r = cudaEventQuery((cudaEvent_t)e);
    if (r == cudaSuccess) return 1;
    if (r != cudaErrorNotReady) cudaGetLastError(); /* a failure shows at the next synchronizing call */
    return 0;
}

extern "C" h3_status h3_cuda_event_elapsed_ms(h3_cuda_event_h a, h3_cuda_event_h b, double *ms) {
    float f = 0;
    CU_TRY(cudaEventElapsedTime(&f, (cudaEvent_t)a, (cudaEvent_t)b));
    *ms = f;
    return H3_OK;
}

extern "C" h3_status h3_cuda_copy_h2d_async(void *dst, const void *src, size_t bytes, h3_cuda_stream_h s) {
    if (!bytes) return H3_OK;
    CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)s));
    return H3_OK;
}

extern "C" h3_status h3_cuda_host_fn(h3_cuda_stream_h s, void (*fn)(void *), void *arg) {
    CU_TRY(cudaLaunchHostFunc((cudaStream_t)s, fn, arg));
    return H3_OK;
}

/* One block: spin ~us microseconds (so a copy that should have waited for this reader overtakes it), then
 * sum. */
__global__ void debug_spin_sum(const uint32_t *data, size_t words, unsigned long long *sum,
                               long long cycles) {
    __shared__ unsigned long long part[256];
    long long t0 = clock64();
    if (threadIdx.x == 0)
        while (clock64() - t0 < cycles) {
        }
    __syncthreads();
    unsigned long long acc = 0;
    for (size_t i = threadIdx.x; i < words; i += blockDim.x) acc += data[i];
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o /= 2) {
        if ((int)threadIdx.x < o) part[threadIdx.x] += part[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) *sum += part[0];
}

extern "C" h3_status h3_cuda_debug_spin_sum(h3_cuda_stream_h s, const void *data, size_t words, uint64_t *sum,
                                            int us) {
    int dev = 0, khz = 0;
    CU_TRY(cudaGetDevice(&dev));
    CU_TRY(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev));
    long long cycles = (long long)us * (khz > 0 ? khz : 1500000) / 1000;
    debug_spin_sum<<<1, 256, 0, (cudaStream_t)s>>>((const uint32_t *)data, words, (unsigned long long *)sum,
                                                   cycles);
    CU_LAUNCHED("debug_spin_sum");
    return H3_OK;
}
