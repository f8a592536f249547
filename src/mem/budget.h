/* Device and host memory budgets: parsing and the defaults.
 *
 * The device budget caps every byte the engine takes on the GPU: h3_cuda_init reserves exactly that much as
 * its arena, so a budget of 8 GiB on a 141 GB H200 behaves as an 8 GiB card would. The host budget caps the
 * pinned and ordinary host memory the engine holds for weights and activations (the page cache of mapped
 * files is the kernel's and is reported, not counted).
 *
 * Defaults: device = free device memory less H3_VRAM_MARGIN (the same margin h3_cuda_init leaves when given
 * 0); host = H3_RAM_SHARE of the kernel's MemAvailable (what can be taken without swapping; the rest stays
 * for the page cache that feeds streamed reads, and for everything else on the machine).
 */
#ifndef H3_MEM_BUDGET_H
#define H3_MEM_BUDGET_H

#include <stdint.h>

#include "base/status.h"

#define H3_VRAM_MARGIN ((int64_t)512 << 20)
#define H3_RAM_SHARE   0.80
#define H3_GIB         1073741824.0

/* What a plan leaves free in a device budget: 1% or 64 MiB, whichever is larger. It covers the arena's 256-byte
 * granules and the holes a first-fit arena can leave: a plan fits when its predicted peak plus this is within the
 * budget. */
static inline int64_t h3_budget_slack(int64_t budget) {
    int64_t s = budget / 100;
    return s > ((int64_t)64 << 20) ? s : ((int64_t)64 << 20);
}

/* "8GiB", "8G", "8gb", "512MiB", "1.5G", "123456" (bytes), "auto" (0: the default). Binary units: K, M, G, T
 * are powers of 1024 with or without "iB"/"B". A bad text is H3_ERR_INVALID naming `what` ("--vram-budget")
 * and the forms that are accepted. */
h3_status h3_budget_parse(const char *text, const char *what, int64_t *bytes);

/* MemAvailable and MemTotal of /proc/meminfo (bytes). H3_ERR_IO when unreadable. */
h3_status h3_host_memory(int64_t *available, int64_t *total);
/* H3_RAM_SHARE of MemAvailable; 0 when unknown. */
int64_t h3_budget_default_ram(void);
/* Free memory of the device less H3_VRAM_MARGIN. H3_ERR_UNSUPPORTED without a device (the message says to
 * give a budget). */
h3_status h3_budget_default_vram(int device, int64_t *bytes);

/* "8.00 GiB" style text (two decimals, binary units) into buf. */
const char *h3_budget_str(int64_t bytes, char *buf, int n);

#endif
