/* The CUDA backend's entry points, callable from C whether or not the build has CUDA (no_cuda.c stands in). */
#ifndef H3_CUDA_CUDA_H
#define H3_CUDA_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "tensor/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when this build has the CUDA backend compiled in. */
int h3_cuda_compiled(void);
/* Number of usable CUDA devices (0 without a driver, a device, or CUDA in the build). Never fails. */
int h3_cuda_device_count(void);
/* Name and memory of a device. */
h3_status h3_cuda_device_info(int device, char *name, size_t name_len, int64_t *total_bytes, int64_t *free_bytes);
/* Selects the device, reserves the device budget (budget bytes; 0 = the free memory less a 512 MiB margin) as
 * one arena from which every device tensor and workspace is carved, creates the streams and BLAS handles in
 * ex->cuda, and registers the device and pinned allocators and the device backend with the op API.
 * H3_ERR_UNSUPPORTED with a clear message when there is no device. One device per process. */
h3_status h3_cuda_init(h3_exec *ex, int device, int64_t budget);
void h3_cuda_shutdown(h3_exec *ex);
/* Bytes of the arena in use now, the most in use since the last reset, and the arena's size. */
void h3_cuda_mem_stats(h3_exec *ex, int64_t *used, int64_t *peak, int64_t *capacity);
void h3_cuda_reset_peak(h3_exec *ex);

#ifdef __cplusplus
}
#endif
#endif
