/*
 * av_core from C: an estimator and a stateful planner driven through 300 decode steps of a
 * synthetic workload, then a save/load round trip and one stateless plan.
 *
 * Every input comes from a 64-bit LCG that tests/capi/test_capi.py reimplements in Python, which
 * runs the same steps through the Python API and requires this program's output, line for
 * line and digit for digit (%.17g), to match.
 *
 * Build (scripts/check_capi.sh does this):
 *   cargo build -p av_core_capi --release
 *   cc -std=c11 -Iinclude examples/c/estimator_demo.c -Ltarget/release -lav_core_capi \
 *      -Wl,-rpath,"$PWD/target/release" -o estimator_demo
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "av_core.h"

enum { ROWS = 8, K = 4, STEPS = 300, REFIT_INTERVAL = 50, REPORT_EVERY = 100 };

/* Knuth's MMIX LCG; the high 31 bits are the output. Mirrored in tests/capi/test_capi.py. */
static uint64_t lcg_state = 20240607u;

static uint64_t next_random(void) {
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return lcg_state >> 33;
}

/* Exits with the library's message when a call fails (a demo has no recovery path). */
static void check(avc_status status, const char *what) {
    if (status != AVC_OK) {
        fprintf(stderr, "%s failed: %s: %s\n", what, avc_status_name(status), avc_last_error());
        exit(1);
    }
}

/* FNV-1a 64 of the saved state: the bytes are identical to Python's to_bytes(). */
static uint64_t fnv1a(const uint8_t *bytes, size_t len) {
    uint64_t hash = 14695981039346656037ull;
    for (size_t i = 0; i < len; i++) {
        hash = (hash ^ bytes[i]) * 1099511628211ull;
    }
    return hash;
}

static void print_coefficients(const char *label, const avc_estimator *estimator) {
    double slope;
    double intercepts[K];
    uint64_t refits, steps;
    check(avc_estimator_coefficients(estimator, &slope, intercepts, K), "coefficients");
    check(avc_estimator_counters(estimator, &refits, &steps), "counters");
    printf("%s refits %llu steps_since_refit %llu slope %.17g intercepts", label,
           (unsigned long long)refits, (unsigned long long)steps, slope);
    for (int k = 0; k < K; k++) {
        printf(" %.17g", intercepts[k]);
    }
    printf("\n");
}

int main(void) {
    uint32_t major, minor, patch;
    check(avc_version(&major, &minor, &patch), "version");
    if (avc_abi_version() != AVC_ABI_VERSION) {
        fprintf(stderr, "header ABI %d, library ABI %u\n", AVC_ABI_VERSION, avc_abi_version());
        return 1;
    }
    printf("av_core %u.%u.%u\n", major, minor, patch);

    avc_estimator_config config;
    check(avc_estimator_config_default(K, &config), "config_default");
    config.refit_interval = REFIT_INTERVAL;
    avc_estimator *estimator = NULL;
    check(avc_estimator_new(&config, &estimator), "estimator_new");

    const avc_cost_point draft_curve[] = {{1, 0.8}, {4, 0.9}, {8, 1.1}, {16, 1.4}};
    const avc_cost_point verify_curve[] = {{1, 6.0},  {8, 6.2},  {16, 6.6},
                                           {32, 7.5}, {48, 9.0}, {64, 11.0}};
    avc_cost_tables *tables = NULL;
    check(avc_cost_tables_from_curves(draft_curve, 4, verify_curve, 6, 16, 64, 32, &tables),
          "cost_tables_from_curves");
    avc_planner *planner = NULL;
    check(avc_planner_new(tables, ROWS, K, AVC_BUDGET_SOURCE_PREVIOUS, &planner), "planner_new");

    int64_t slots[ROWS];
    for (int r = 0; r < ROWS; r++) {
        slots[r] = r;
    }
    const avc_step_tokens step = {ROWS, ROWS, SIZE_MAX};

    int64_t feature_units[ROWS * K]; /* x = units / 128 */
    float features[ROWS * K];
    float probabilities[ROWS * K];
    int64_t scheduled[ROWS], admitted64[ROWS], accepted[ROWS];
    int32_t admitted[ROWS];
    long long budget_total = 0, admitted_total = 0, accepted_total = 0, refit_calls = 0;
    double expected_total = 0.0, cost_total = 0.0;

    for (int t = 1; t <= STEPS; t++) {
        /* Draft: features fall with depth; each request scheduled 1..K drafts. */
        for (int r = 0; r < ROWS; r++) {
            for (int k = 0; k < K; k++) {
                int64_t units = (int64_t)(next_random() % 2049) - 1024 - 128 * k;
                feature_units[r * K + k] = units;
                features[r * K + k] = (float)units / 128.0f; /* exact: |units| < 2^24 */
            }
            scheduled[r] = 1 + (int64_t)(next_random() % K);
        }
        check(avc_estimator_predict(estimator, features, ROWS, K, probabilities, ROWS * K),
              "predict");

        /* Plan: budget from the previous step's confidences, assignment from these. */
        avc_verification_plan plan;
        check(avc_planner_plan(planner, slots, ROWS, probabilities, ROWS, K, scheduled, ROWS,
                               &step, admitted, ROWS, &plan),
              "planner_plan");
        budget_total += (long long)plan.budget;
        expected_total += plan.expected_accepted_tokens;
        cost_total += plan.predicted_cost_ms;

        /* Verify: the target accepts position k with a probability rising in x (an integer
         * rule, so C and Python agree exactly); accepted = the leading run within admitted. */
        for (int r = 0; r < ROWS; r++) {
            int64_t run = 0;
            int broken = 0;
            for (int k = 0; k < K; k++) {
                /* P(accept) = 1/2 + x/16, clipped: 1024ths, from a non-negative dividend */
                int64_t threshold = (feature_units[r * K + k] + 8192) / 2 - 3584;
                int accept = (int64_t)(next_random() % 1024) < threshold;
                if (!accept) {
                    broken = 1;
                }
                if (!broken && k < admitted[r]) {
                    run++;
                }
            }
            admitted64[r] = admitted[r];
            accepted[r] = run;
            admitted_total += admitted[r];
            accepted_total += run;
        }

        /* Observe with the draft-time predictions as IRLS weights, as vLLM does. */
        bool refitted = false;
        check(avc_estimator_observe(estimator, features, ROWS, K, admitted64, ROWS, accepted,
                                    ROWS, probabilities, ROWS * K, &refitted),
              "observe");
        refit_calls += refitted;

        /* Churn: a finished request's slot goes to a new one. */
        for (int r = 0; r < ROWS; r++) {
            if (next_random() % 16 == 0) {
                check(avc_planner_add_request(planner, (size_t)r), "add_request");
            }
        }

        if (t % REPORT_EVERY == 0) {
            char label[32];
            snprintf(label, sizeof label, "step %d", t);
            print_coefficients(label, estimator);
        }
    }

    printf("refitted_by_observe %lld\n", refit_calls);
    printf("budget_total %lld admitted_total %lld accepted_total %lld\n", budget_total,
           admitted_total, accepted_total);
    printf("expected_tokens_total %.17g predicted_cost_ms_total %.17g\n", expected_total,
           cost_total);

    /* Save, load, and check the copy predicts the same bits. */
    size_t needed = 0;
    avc_status status = avc_estimator_save(estimator, NULL, 0, &needed);
    if (status != AVC_ERR_BUFFER_TOO_SMALL) {
        check(status == AVC_OK ? AVC_ERR_VALUE : status, "save (size query)");
    }
    uint8_t *state = malloc(needed);
    if (state == NULL) {
        return 1;
    }
    size_t written = 0;
    check(avc_estimator_save(estimator, state, needed, &written), "save");
    avc_estimator *restored = NULL;
    check(avc_estimator_load(state, written, &restored), "load");
    float again[ROWS * K];
    check(avc_estimator_predict(restored, features, ROWS, K, again, ROWS * K), "predict");
    int same = 1;
    float original[ROWS * K];
    check(avc_estimator_predict(estimator, features, ROWS, K, original, ROWS * K), "predict");
    for (int i = 0; i < ROWS * K; i++) {
        same &= again[i] == original[i];
    }
    printf("state %zu bytes fnv1a %016llx round_trip %s\n", written,
           (unsigned long long)fnv1a(state, written), same ? "identical" : "DIFFERENT");
    free(state);

    /* The stateless planner on the last step's confidences. */
    size_t budget = 0;
    check(avc_choose_draft_budget(probabilities, ROWS, K, scheduled, ROWS, &step, tables,
                                  &budget),
          "choose_draft_budget");
    check(avc_assign_draft_budget(probabilities, ROWS, K, scheduled, ROWS, budget, admitted,
                                  ROWS),
          "assign_draft_budget");
    printf("last_step budget %zu admitted", budget);
    for (int r = 0; r < ROWS; r++) {
        printf(" %d", admitted[r]);
    }
    printf("\n");
    print_coefficients("final", restored);

    check(avc_estimator_free(restored), "free");
    check(avc_planner_free(planner), "free");
    check(avc_cost_tables_free(tables), "free");
    check(avc_estimator_free(estimator), "free");
    return same ? 0 : 1;
}
