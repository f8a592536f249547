#include "base/cancel.h"

#include <stdatomic.h>

/* Lock-free (checked below), so storing it from a signal handler is safe. */
static atomic_int g_cancel;

_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "the stop flag must be lock-free to be set from a signal handler");

void h3_cancel_request(void) {
    atomic_store_explicit(&g_cancel, 1, memory_order_relaxed);
}

void h3_cancel_reset(void) {
    atomic_store_explicit(&g_cancel, 0, memory_order_relaxed);
}

int h3_cancel_requested(void) {
    return atomic_load_explicit(&g_cancel, memory_order_relaxed);
}

h3_status h3_cancel_check(void) {
    if (!atomic_load_explicit(&g_cancel, memory_order_relaxed)) return H3_OK;
    return H3_ERR(H3_ERR_INTERRUPTED, "interrupted: stopped on request");
}
