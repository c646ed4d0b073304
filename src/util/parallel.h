/* A loop over independent items on the OpenMP threads, with kite's error reporting: the first failure's
 * status and message reach the caller (each thread records its messages in its own slot, error.h). */
#ifndef KITE_UTIL_PARALLEL_H
#define KITE_UTIL_PARALLEL_H

#include <stdint.h>

#include "kite.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Runs item(context, i) for every i in [0, n), in parallel when n > 1 (one item per scheduling step: items
 * may differ in cost). Every item runs even after one fails. Returns KITE_OK, or the status of the first item
 * to fail (first in time) with its message recorded for the caller. */
kite_status kite_parallel_for(int32_t n, kite_status (*item)(void *context, int32_t i), void *context);

#ifdef __cplusplus
}
#endif

#endif
