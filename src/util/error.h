/* Error reporting shared by every module.
 *
 * A failing function records one human-readable line naming what is wrong and where (file, tensor,
 * field) and returns a kite_status. The line is kept per thread and read back through kite_last_error().
 * Validation is code, never assert(): asserts vanish under NDEBUG.
 */
#ifndef KITE_UTIL_ERROR_H
#define KITE_UTIL_ERROR_H

#include "kite.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KITE_PRINTF_LIKE(fmt_index, first_arg) __attribute__((format(printf, fmt_index, first_arg)))
#else
#define KITE_PRINTF_LIKE(fmt_index, first_arg)
#endif

/* Records the message (printf format) for this thread and returns code, so callers can write
 * `return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: tensor %s: ...", path, name);` */
kite_status kite_fail(kite_status code, const char *fmt, ...) KITE_PRINTF_LIKE(2, 3);

/* Prepends "prefix: " to the current message (used to add context such as a file name on the way up). */
void kite_error_prefix(const char *fmt, ...) KITE_PRINTF_LIKE(1, 2);

/* Clears the message of this thread. */
void kite_error_clear(void);

/* Propagates a non-OK status from an expression. */
#define KITE_TRY(expr)                                                                                   \
    do {                                                                                                 \
        kite_status kite_try_status_ = (expr);                                                           \
        if (kite_try_status_ != KITE_OK) return kite_try_status_;                                        \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif
