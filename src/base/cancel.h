/* The process-wide stop flag (h3_cancel_request in h3run.h) as the library checks it. */
#ifndef H3_BASE_CANCEL_H
#define H3_BASE_CANCEL_H

#include "base/status.h"

/* H3_OK, or H3_ERR_INTERRUPTED with "interrupted: stopped on request" once a stop was requested. Cheap (one
 * relaxed atomic load): ops call it before each op, long kernels between their pieces. */
h3_status h3_cancel_check(void);

#endif
