/* A non-finite logits row ends its request, and only it, with an error on every path of the CPU backend (the
 * cases: tests/common/nonfinite_cases.h). */
#include "nonfinite_cases.h"

static void test_nan_final_norm(void) { nonfinite_check_nan_final_norm(KITE_BACKEND_CPU, "cpu"); }

static void test_inf_in_a_prompt_embedding(void) { nonfinite_check_inf_in_a_prompt_embedding(KITE_BACKEND_CPU, "cpu"); }

static void test_inf_in_a_generated_embedding(void) { nonfinite_check_inf_in_a_generated_embedding(KITE_BACKEND_CPU); }

int main(void) {
    TEST_RUN(test_nan_final_norm);
    TEST_RUN(test_inf_in_a_prompt_embedding);
    TEST_RUN(test_inf_in_a_generated_embedding);
    return test_finish();
}
