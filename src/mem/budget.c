/* Budgets: parsing and defaults (budget.h). */
#include "mem/budget.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda.h"

h3_status h3_budget_parse(const char *text, const char *what, int64_t *bytes) {
    const char *forms = "a size like 8GiB, 24G, 512MiB or 123456 (bytes), or auto";
    if (!text || !*text) return H3_ERR(H3_ERR_INVALID, "%s takes %s; got nothing", what, forms);
    if (!strcmp(text, "auto")) {
        *bytes = 0;
        return H3_OK;
    }
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || errno || !(v >= 0) || !isfinite(v) ||
        (!isdigit((unsigned char)text[0]) && text[0] != '.'))
        return H3_ERR(H3_ERR_INVALID, "%s takes %s; got '%s'", what, forms, text);
    while (*end == ' ') end++;
    double mul = 1;
    char u = (char)toupper((unsigned char)*end);
    if (u) {
        switch (u) {
            case 'K':
                mul = 1024.0;
                break;
            case 'M':
                mul = 1024.0 * 1024;
                break;
            case 'G':
                mul = 1024.0 * 1024 * 1024;
                break;
            case 'T':
                mul = 1024.0 * 1024 * 1024 * 1024;
                break;
            case 'B':
                mul = 1;
                break;
            default:
                return H3_ERR(H3_ERR_INVALID, "%s takes %s; got '%s'", what, forms, text);
        }
        end++;
        if (u != 'B') {
            if (*end == 'i' || *end == 'I') end++;
            if (*end == 'B' || *end == 'b') end++;
        }
    }
    if (*end) return H3_ERR(H3_ERR_INVALID, "%s takes %s; got '%s'", what, forms, text);
    double b = v * mul;
    if (b > 9.0e18) return H3_ERR(H3_ERR_INVALID, "%s: '%s' is too large", what, text);
    if (b < 1) return H3_ERR(H3_ERR_INVALID, "%s must be positive (or auto); got '%s'", what, text);
    *bytes = (int64_t)b;
    return H3_OK;
}

h3_status h3_host_memory(int64_t *available, int64_t *total) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return H3_ERR(H3_ERR_IO, "cannot read /proc/meminfo to size the host budget: %s", strerror(errno));
    char line[256];
    long long av = -1, tot = -1;
    while (fgets(line, sizeof line, f)) {
        long long kb;
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) av = kb;
        if (sscanf(line, "MemTotal: %lld kB", &kb) == 1) tot = kb;
    }
    fclose(f);
    if (av < 0 || tot < 0) return H3_ERR(H3_ERR_IO, "/proc/meminfo lacks MemAvailable or MemTotal");
    if (available) *available = (int64_t)av * 1024;
    if (total) *total = (int64_t)tot * 1024;
    return H3_OK;
}

int64_t h3_budget_default_ram(void) {
    int64_t av = 0;
    if (h3_host_memory(&av, NULL) != H3_OK) {
        h3_clear_error();
        return 0;
    }
    return (int64_t)((double)av * H3_RAM_SHARE);
}

h3_status h3_budget_default_vram(int device, int64_t *bytes) {
    int64_t total = 0, free_b = 0;
    if (h3_cuda_device_count() == 0)
        return H3_ERR(H3_ERR_UNSUPPORTED,
                      "there is no CUDA device here to take a default device budget from; give "
                      "--vram-budget SIZE (e.g. 24GiB) to plan for a GPU of that size");
    H3_TRY(h3_cuda_device_info(device, NULL, 0, &total, &free_b));
    free_b += h3_cuda_arena_bytes(); /* this process's own arena, when a backend is up, is free to it */
    *bytes = free_b > 2 * H3_VRAM_MARGIN ? free_b - H3_VRAM_MARGIN : free_b / 2;
    return H3_OK;
}

const char *h3_budget_str(int64_t bytes, char *buf, int n) {
    snprintf(buf, (size_t)n, "%.2f GiB", (double)bytes / H3_GIB);
    return buf;
}
