/* Stand-in for the CUDA backend in builds without CUDA. */
#include "base/status.h"
#include "cuda/cuda.h"

int h3_cuda_compiled(void) {
    return 0;
}

int h3_cuda_device_count(void) {
    return 0;
}

h3_status h3_cuda_device_info(int device, char *name, size_t name_len, int64_t *total_bytes, int64_t *free_bytes) {
    (void)device;
    (void)name;
    (void)name_len;
    (void)total_bytes;
    (void)free_bytes;
    return H3_ERR(H3_ERR_UNSUPPORTED, "this h3run was built without CUDA (rebuild with nvcc on the PATH)");
}

h3_status h3_cuda_init(h3_exec *ex, int device, int64_t budget) {
    (void)ex;
    (void)device;
    (void)budget;
    return H3_ERR(H3_ERR_UNSUPPORTED, "this h3run was built without CUDA (rebuild with nvcc on the PATH)");
}

void h3_cuda_shutdown(h3_exec *ex) {
    (void)ex;
}

void h3_cuda_mem_stats(h3_exec *ex, int64_t *used, int64_t *peak, int64_t *capacity) {
    (void)ex;
    if (used) *used = 0;
    if (peak) *peak = 0;
    if (capacity) *capacity = 0;
}

void h3_cuda_reset_peak(h3_exec *ex) {
    (void)ex;
}
