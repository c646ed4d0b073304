/* The benchmark's run with the gate's reference named: what kite_bench_run does, for the tests that must see the
 * gate compare a CPU target (which kite_bench_run takes as the oracle itself) or fail on wrong weights. */
#ifndef KITE_BENCH_BENCH_INTERNAL_H
#define KITE_BENCH_BENCH_INTERNAL_H

#include "kite.h"

/* kite_bench_run with every row gated against the CPU backend on reference's weights (the same shape as model's);
 * reference NULL: no gate, the rows are marked as the oracle's. kite_bench_run passes the model itself, or NULL
 * on the CPU backend. */
kite_status bench_run_with_reference(kite_model *model, const kite_model *reference, const kite_bench_params *params,
                                     kite_bench_row_callback on_row, void *user_data);

#endif
