/* What every communicator shares (comm.h). */
#include "parallel/comm.h"

#include <math.h>

int tp_argmax_beats(tp_argmax_candidate a, tp_argmax_candidate b) {
    const int a_nan = isnan(a.value), b_nan = isnan(b.value);
    if (a_nan || b_nan) return a_nan && (!b_nan || a.index < b.index);
    return a.value > b.value || (a.value == b.value && a.index < b.index);
}
