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

unsigned h3_cuda_lowbit_attention(int device) {
    (void)device;
    return 0;
}

h3_status h3_cuda_comm_unique_id(unsigned char id[128]) {
    (void)id;
    return H3_ERR(H3_ERR_UNSUPPORTED, "this h3run was built without CUDA: several GPUs need a CUDA build");
}

h3_status h3_cuda_comm_create(h3_exec *ex, int rank, int size, const unsigned char id[128], struct h3_comm *out) {
    (void)ex, (void)rank, (void)size, (void)id, (void)out;
    return H3_ERR(H3_ERR_UNSUPPORTED, "this h3run was built without CUDA: several GPUs need a CUDA build");
}

void h3_cuda_comm_destroy(struct h3_comm *c) {
    (void)c;
}

void h3_cuda_attention_prefer_mma8(int on) {
    (void)on;
}

void h3_cuda_conv3d_prefer_im2col(int on) {
    (void)on;
}

unsigned h3_cuda_attention_ref_flags(h3_exec *ex, unsigned flags) {
    (void)ex;
    return flags & ~H3_ATTN_FP8_K192;
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

int64_t h3_cuda_arena_bytes(void) {
    return 0;
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

void h3_cuda_conv_set_math(h3_conv_kind kind, h3_conv_math math) {
    (void)kind;
    (void)math;
}

h3_conv_math h3_cuda_conv_math(h3_conv_kind kind) {
    return kind == H3_CONV_3D ? H3_CONV_TF32 : H3_CONV_EXACT;
}

/* ---- streams and events: unavailable without CUDA (the streamer emulates them on the host) ---- */

#define NO_CUDA H3_ERR(H3_ERR_UNSUPPORTED, "this h3run was built without CUDA (rebuild with nvcc on the PATH)")

h3_cuda_stream_h h3_cuda_compute_stream(h3_exec *ex) {
    (void)ex;
    return NULL;
}
h3_cuda_stream_h h3_cuda_copy_stream(h3_exec *ex) {
    (void)ex;
    return NULL;
}
h3_status h3_cuda_stream_create(h3_cuda_stream_h *out) {
    *out = NULL;
    return NO_CUDA;
}
void h3_cuda_stream_destroy(h3_cuda_stream_h s) {
    (void)s;
}
h3_status h3_cuda_stream_sync(h3_cuda_stream_h s) {
    (void)s;
    return NO_CUDA;
}
h3_status h3_cuda_event_create(h3_cuda_event_h *out, int timing) {
    (void)timing;
    *out = NULL;
    return NO_CUDA;
}
void h3_cuda_event_destroy(h3_cuda_event_h e) {
    (void)e;
}
h3_status h3_cuda_event_record(h3_cuda_event_h e, h3_cuda_stream_h s) {
    (void)e;
    (void)s;
    return NO_CUDA;
}
h3_status h3_cuda_stream_wait(h3_cuda_stream_h s, h3_cuda_event_h e) {
    (void)s;
    (void)e;
    return NO_CUDA;
}
h3_status h3_cuda_event_sync(h3_cuda_event_h e) {
    (void)e;
    return NO_CUDA;
}
int h3_cuda_event_done(h3_cuda_event_h e) {
    (void)e;
    return 1;
}
h3_status h3_cuda_event_elapsed_ms(h3_cuda_event_h a, h3_cuda_event_h b, double *ms) {
    (void)a;
    (void)b;
    *ms = 0;
    return NO_CUDA;
}
h3_status h3_cuda_copy_h2d_async(void *dst, const void *src, size_t bytes, h3_cuda_stream_h s) {
    (void)dst;
    (void)src;
    (void)bytes;
    (void)s;
    return NO_CUDA;
}
h3_status h3_cuda_host_fn(h3_cuda_stream_h s, void (*fn)(void *), void *arg) {
    (void)s;
    (void)fn;
    (void)arg;
    return NO_CUDA;
}
void h3_cuda_set_alloc_observer(h3_cuda_alloc_observer fn, void *user) {
    (void)fn;
    (void)user;
}
h3_status h3_cuda_debug_spin_sum(h3_cuda_stream_h s, const void *data, size_t words, uint64_t *sum, int us) {
    (void)s;
    (void)data;
    (void)words;
    (void)sum;
    (void)us;
    return NO_CUDA;
}

h3_status h3_cuda_qgemm_reserve(h3_exec *ex) {
    (void)ex;
    return H3_ERR(H3_ERR_UNSUPPORTED, "this build has no CUDA backend");
}

h3_status h3_cuda_quantize_fp8(h3_exec *ex, const h3_tensor *w, void *q, float *scale) {
    (void)ex;
    (void)w;
    (void)q;
    (void)scale;
    return H3_ERR(H3_ERR_UNSUPPORTED, "this build has no CUDA backend");
}

void h3_cuda_qgemm_release(h3_exec *ex) {
    (void)ex;
}

void h3_cuda_qgemm_set_mode(h3_exec *ex, int mode) {
    (void)ex;
    (void)mode;
}

int h3_cuda_fp8_act_rows(h3_exec *ex) {
    (void)ex;
    return 0;
}
