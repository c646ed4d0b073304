#include "util/parallel.h"

#include <stdio.h>

#include "util/error.h"

kite_status kite_parallel_for(int32_t n, kite_status (*item)(void *context, int32_t i), void *context) {
    kite_status first_error = KITE_OK;
    char message[512] = "";
#pragma omp parallel for schedule(dynamic, 1) if (n > 1)
    for (int32_t i = 0; i < n; i++) {
        const kite_status status = item(context, i);
        if (status != KITE_OK) {
#pragma omp critical(kite_parallel_for_error)
            if (first_error == KITE_OK) { /* the message lives in this thread's error slot */
                first_error = status;
                snprintf(message, sizeof message, "%s", kite_last_error());
            }
        }
    }
    return first_error == KITE_OK ? KITE_OK : kite_fail(first_error, "%s", message);
}
