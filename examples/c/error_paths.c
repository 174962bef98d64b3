/*
 * C-level tests of the av_core ABI's error paths: NULL handles, NULL arrays with a non-zero
 * length, mismatched lengths, NaN and infinite inputs, invalid counts, too-small buffers,
 * corrupt saved state, overlapping buffers, double free and wrong-kind handles, thread-local
 * error messages, and "a rejected call changes nothing". Plus one law through the ABI:
 * concurrent observers give the serial bytes; and the drafting-depth decision against
 * hand-computed cases (hopeless drafts with expensive drafting: depth 0; confident drafts with
 * free drafting: full depth); and the feature and JSON cost tables against hand-computed values.
 *
 * scripts/check_capi.sh compiles it against the static library and runs it under
 * valgrind --error-exitcode=1 --leak-check=full, so leaks and invalid accesses fail too.
 * Every case is defined behaviour: the double-free case relies on the library's registry of
 * live handles, which refuses a freed pointer without reading it.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv */

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "av_core.h"

static int failures = 0;
static int checks = 0;

#define CHECK(cond, ...)                                                                       \
    do {                                                                                       \
        checks++;                                                                              \
        if (!(cond)) {                                                                         \
            failures++;                                                                        \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                   \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fprintf(stderr, "\n");                                                             \
        }                                                                                      \
    } while (0)

/* The call returns `expected` and, if that is an error, the message contains `needle`. */
#define EXPECT(call, expected, needle)                                                         \
    do {                                                                                       \
        avc_status status_ = (call);                                                           \
        const char *message_ = avc_last_error();                                               \
        CHECK(status_ == (expected), "%s returned %s, expected %s (last error: %s)", #call,   \
              avc_status_name(status_), avc_status_name(expected), message_);                  \
        if ((expected) != AVC_OK && status_ == (expected)) {                                   \
            CHECK(strstr(message_, (needle)) != NULL, "%s: message \"%s\" lacks \"%s\"",      \
                  #call, message_, (needle));                                                  \
        }                                                                                      \
    } while (0)

#define OK(call) EXPECT(call, AVC_OK, "")

enum { K = 3, ROWS = 2 };

static avc_estimator *new_estimator(uint64_t refit_interval) {
    avc_estimator_config config;
    avc_estimator *estimator = NULL;
    OK(avc_estimator_config_default(K, &config));
    config.refit_interval = refit_interval;
    OK(avc_estimator_new(&config, &estimator));
    return estimator;
}

/* An estimator on vLLM's update (one refit per round of refit_interval observes). */
static avc_estimator *new_vllm_estimator(uint64_t refit_interval) {
    avc_estimator_config config;
    avc_estimator_update update;
    avc_estimator *estimator = NULL;
    OK(avc_estimator_config_default(K, &config));
    OK(avc_estimator_update_default(&update));
    config.refit_interval = refit_interval;
    update.update = AVC_UPDATE_VLLM;
    OK(avc_estimator_new_with_update(&config, &update, &estimator));
    return estimator;
}

/* An estimator on av_core's map update (the default, spelled out). */
static avc_estimator *new_map_estimator(uint64_t refit_interval) {
    avc_estimator_config config;
    avc_estimator_update update;
    avc_estimator *estimator = NULL;
    OK(avc_estimator_config_default(K, &config));
    OK(avc_estimator_update_default(&update));
    config.refit_interval = refit_interval;
    update.update = AVC_UPDATE_MAP;
    OK(avc_estimator_new_with_update(&config, &update, &estimator));
    return estimator;
}

/* The estimator's saved bytes (caller frees), to compare states exactly. */
static uint8_t *saved(const avc_estimator *estimator, size_t *len) {
    size_t needed = 0;
    EXPECT(avc_estimator_save(estimator, NULL, 0, &needed), AVC_ERR_BUFFER_TOO_SMALL, "buf");
    uint8_t *bytes = malloc(needed);
    if (bytes == NULL) {
        abort();
    }
    OK(avc_estimator_save(estimator, bytes, needed, len));
    CHECK(*len == needed, "saved %zu bytes, size query said %zu", *len, needed);
    return bytes;
}

static int same_state(const avc_estimator *a, const avc_estimator *b) {
    size_t len_a = 0, len_b = 0;
    uint8_t *bytes_a = saved(a, &len_a);
    uint8_t *bytes_b = saved(b, &len_b);
    int same = len_a == len_b && memcmp(bytes_a, bytes_b, len_a) == 0;
    free(bytes_a);
    free(bytes_b);
    return same;
}

static const float features[ROWS * K] = {1.0f, 0.5f, -2.0f, 3.0f, 2.0f, 1.0f};
static const int64_t admitted[ROWS] = {3, 2};
static const int64_t accepted[ROWS] = {1, 2};

static void test_estimator_arguments(void) {
    avc_estimator *estimator = new_vllm_estimator(100);
    avc_estimator *before = new_vllm_estimator(100);
    float out[ROWS * K];
    float nan_features[ROWS * K];
    memcpy(nan_features, features, sizeof features);
    nan_features[4] = NAN;

    /* NULL handle. */
    EXPECT(avc_estimator_predict(NULL, features, ROWS, K, out, ROWS * K), AVC_ERR_NULL,
           "estimator: must not be NULL");
    EXPECT(avc_estimator_observe(NULL, features, ROWS, K, admitted, ROWS, accepted, ROWS, NULL, 0,
                                 NULL),
           AVC_ERR_NULL, "estimator");
    EXPECT(avc_estimator_refit(NULL), AVC_ERR_NULL, "estimator");
    EXPECT(avc_estimator_counters(NULL, NULL, NULL), AVC_ERR_NULL, "estimator");
    size_t len = 0;
    EXPECT(avc_estimator_save(NULL, NULL, 0, &len), AVC_ERR_NULL, "estimator");

    /* NULL arrays with a non-zero length; NULL with length 0 is an empty array. */
    EXPECT(avc_estimator_predict(estimator, NULL, ROWS, K, out, ROWS * K), AVC_ERR_NULL,
           "features: is NULL but its length is 6");
    EXPECT(avc_estimator_predict(estimator, features, ROWS, K, NULL, ROWS * K), AVC_ERR_NULL,
           "probabilities");
    OK(avc_estimator_predict(estimator, NULL, 0, K, NULL, 0));
    EXPECT(avc_estimator_observe(estimator, features, ROWS, K, NULL, ROWS, accepted, ROWS, NULL,
                                 0, NULL),
           AVC_ERR_NULL, "num_admitted");
    EXPECT(avc_estimator_observe(estimator, features, ROWS, K, admitted, ROWS, NULL, ROWS, NULL,
                                 0, NULL),
           AVC_ERR_NULL, "num_accepted");
    EXPECT(avc_estimator_observe(estimator, features, ROWS, K, admitted, ROWS, accepted, ROWS,
                                 NULL, ROWS * K, NULL),
           AVC_ERR_NULL, "predictions");
    double slope;
    double intercepts[K];
    EXPECT(avc_estimator_coefficients(estimator, NULL, intercepts, K), AVC_ERR_NULL,
           "slope_out");
    EXPECT(avc_estimator_coefficients(estimator, &slope, NULL, K), AVC_ERR_NULL, "intercepts");

    /* Mismatched lengths and shapes. */
    EXPECT(avc_estimator_predict(estimator, features, 3, 2, out, ROWS * K), AVC_ERR_VALUE,
           "features: expected shape [R, 3], got [3, 2]");
    EXPECT(avc_estimator_predict(estimator, features, ROWS, K, out, ROWS * K - 1), AVC_ERR_VALUE,
           "probabilities_len");
    EXPECT(avc_estimator_observe(estimator, features, ROWS, K, admitted, 1, accepted, ROWS, NULL,
                                 0, NULL),
           AVC_ERR_VALUE, "num_admitted: has 1 entries, features have 2 rows");
    EXPECT(avc_estimator_observe(estimator, features, ROWS, K, admitted, ROWS, accepted, 1, NULL,
                                 0, NULL),
           AVC_ERR_VALUE, "num_accepted");
    float predictions[ROWS * K] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
    EXPECT(avc_estimator_observe(estimator, features, ROWS, K, admitted, ROWS, accepted, ROWS,
                                 predictions, ROWS * K - 1, NULL),
           AVC_ERR_VALUE, "predictions");
    EXPECT(avc_estimator_coefficients(estimator, &slope, intercepts, K - 1), AVC_ERR_VALUE,
           "intercepts_len: must equal num_positions = 3, got 2");

    /* NaN and infinite inputs. */
    EXPECT(avc_estimator_predict(estimator, nan_features, ROWS, K, out, ROWS * K), AVC_ERR_VALUE,
           "features: must be finite, got NaN at flat index 4");
    nan_features[4] = INFINITY;
    EXPECT(avc_estimator_observe(estimator, nan_features, ROWS, K, admitted, ROWS, accepted, ROWS,
                                 NULL, 0, NULL),
           AVC_ERR_VALUE, "features: must be finite, got inf");
    predictions[2] = NAN;
    EXPECT(avc_estimator_observe(estimator, features, ROWS, K, admitted, ROWS, accepted, ROWS,
                                 predictions, ROWS * K, NULL),
           AVC_ERR_VALUE, "predictions: must be finite and in [0, 1]");

    /* Invalid counts. */
    const int64_t too_many_accepted[ROWS] = {1, 3};
    const int64_t negative[ROWS] = {-1, 0};
    const int64_t beyond_k[ROWS] = {4, 0};
    EXPECT(avc_estimator_observe(estimator, features, ROWS, K, admitted, ROWS, too_many_accepted,
                                 ROWS, NULL, 0, NULL),
           AVC_ERR_VALUE, "num_accepted");
    EXPECT(avc_estimator_observe(estimator, features, ROWS, K, negative, ROWS, accepted, ROWS,
                                 NULL, 0, NULL),
           AVC_ERR_VALUE, "num_admitted: must be non-negative, got -1");
    EXPECT(avc_estimator_observe(estimator, features, ROWS, K, beyond_k, ROWS, accepted, ROWS,
                                 NULL, 0, NULL),
           AVC_ERR_VALUE, "num_admitted: must be at most num_positions = 3");

    /* Output overlapping an input. */
    float in_place[ROWS * K];
    memcpy(in_place, features, sizeof features);
    EXPECT(avc_estimator_predict(estimator, in_place, ROWS, K, in_place, ROWS * K), AVC_ERR_VALUE,
           "probabilities: overlaps features");
    CHECK(memcmp(in_place, features, sizeof features) == 0, "a rejected predict wrote output");

    /* None of the rejected calls changed the estimator. */
    CHECK(same_state(estimator, before), "a rejected call changed the state");

    /* A rejected call leaves output buffers alone. */
    for (int i = 0; i < ROWS * K; i++) {
        out[i] = -7.0f;
    }
    nan_features[4] = NAN;
    EXPECT(avc_estimator_predict(estimator, nan_features, ROWS, K, out, ROWS * K), AVC_ERR_VALUE,
           "features");
    for (int i = 0; i < ROWS * K; i++) {
        CHECK(out[i] == -7.0f, "out[%d] = %g after a rejected predict", i, out[i]);
    }

    /* The same valid call then succeeds, and refitted_out is optional. */
    bool refitted = true;
    OK(avc_estimator_observe(estimator, features, ROWS, K, admitted, ROWS, accepted, ROWS, NULL, 0,
                             &refitted));
    CHECK(!refitted, "refitted after one of 100 steps");
    OK(avc_estimator_observe(estimator, features, ROWS, K, admitted, ROWS, accepted, ROWS,
                             (const float[]){0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f}, ROWS * K, NULL));
    uint64_t refits = 9, steps = 9;
    OK(avc_estimator_counters(estimator, &refits, &steps));
    CHECK(refits == 0 && steps == 2, "counters %llu %llu", (unsigned long long)refits,
          (unsigned long long)steps);
    OK(avc_estimator_refit(estimator));
    OK(avc_estimator_counters(estimator, &refits, &steps));
    CHECK(refits == 1 && steps == 0, "counters after refit %llu %llu",
          (unsigned long long)refits, (unsigned long long)steps);

    OK(avc_estimator_free(before));
    OK(avc_estimator_free(estimator));
}

/* av_core's map update (the default) fits after the 1st, 2nd, 4th, ... observe of a round. */
static void test_map_update(void) {
    avc_estimator *estimator = new_map_estimator(100);
    bool refitted = false;
    OK(avc_estimator_observe(estimator, features, ROWS, K, admitted, ROWS, accepted, ROWS, NULL, 0,
                             &refitted));
    CHECK(refitted, "no fit after a round's first step");
    OK(avc_estimator_observe(estimator, features, ROWS, K, admitted, ROWS, accepted, ROWS, NULL, 0,
                             &refitted));
    CHECK(refitted, "no fit after a round's second step");
    OK(avc_estimator_observe(estimator, features, ROWS, K, admitted, ROWS, accepted, ROWS, NULL, 0,
                             &refitted));
    CHECK(!refitted, "a fit after a round's third step");
    uint64_t refits = 9, steps = 9;
    OK(avc_estimator_counters(estimator, &refits, &steps));
    CHECK(refits == 2 && steps == 3, "counters %llu %llu", (unsigned long long)refits,
          (unsigned long long)steps);
    OK(avc_estimator_refit(estimator));
    OK(avc_estimator_counters(estimator, &refits, &steps));
    CHECK(refits == 3 && steps == 0, "counters after refit %llu %llu",
          (unsigned long long)refits, (unsigned long long)steps);

    avc_estimator_update update, back;
    OK(avc_estimator_get_update(estimator, &update));
    CHECK(update.update == AVC_UPDATE_MAP && update.bins == 64, "map update %d, %zu bins",
          (int)update.update, update.bins);
    /* The default is the map update, which avc_estimator_new also uses. */
    OK(avc_estimator_update_default(&back));
    CHECK(back.update == AVC_UPDATE_MAP && back.bins == 64, "default update %d, %zu bins",
          (int)back.update, back.bins);
    avc_estimator *plain = new_estimator(100);
    OK(avc_estimator_get_update(plain, &back));
    CHECK(back.update == AVC_UPDATE_MAP, "avc_estimator_new gave update %d", (int)back.update);
    OK(avc_estimator_free(plain));
    EXPECT(avc_estimator_update_default(NULL), AVC_ERR_NULL, "update_out");
    EXPECT(avc_estimator_get_update(estimator, NULL), AVC_ERR_NULL, "update_out");
    EXPECT(avc_estimator_get_update(NULL, &back), AVC_ERR_NULL, "estimator");

    avc_estimator_config config;
    avc_estimator *other = (avc_estimator *)&config; /* must be overwritten with NULL */
    OK(avc_estimator_config_default(K, &config));
    EXPECT(avc_estimator_new_with_update(&config, NULL, &other), AVC_ERR_NULL, "update");
    CHECK(other == NULL, "a failed new_with_update left a handle");
    update.update = 9;
    EXPECT(avc_estimator_new_with_update(&config, &update, &other), AVC_ERR_VALUE,
           "update: must be AVC_UPDATE_MAP (0) or AVC_UPDATE_VLLM (1), got 9");
    update.update = AVC_UPDATE_MAP;
    update.prior_trend_sd = -1.0;
    EXPECT(avc_estimator_new_with_update(&config, &update, &other), AVC_ERR_VALUE,
           "prior_trend_sd");
    update.prior_trend_sd = 0.0; /* shrinkage toward the mean alone */
    OK(avc_estimator_new_with_update(&config, &update, &other));
    OK(avc_estimator_get_update(other, &back));
    CHECK(back.prior_trend_sd == 0.0 && back.update == AVC_UPDATE_MAP, "update did not round-trip");
    OK(avc_estimator_free(other));
    OK(avc_estimator_free(estimator));
}

static void test_config(void) {
    avc_estimator_config config;
    avc_estimator *estimator = (avc_estimator *)&config; /* must be overwritten with NULL */
    EXPECT(avc_estimator_config_default(K, NULL), AVC_ERR_NULL, "config_out");
    OK(avc_estimator_config_default(0, &config));
    EXPECT(avc_estimator_new(&config, &estimator), AVC_ERR_VALUE,
           "num_positions: must be between 1 and 64, got 0");
    CHECK(estimator == NULL, "estimator_out not NULL after a failure");
    OK(avc_estimator_config_default(K, &config));
    config.damping = NAN;
    EXPECT(avc_estimator_new(&config, &estimator), AVC_ERR_VALUE, "damping: must be finite");
    config.damping = 50;
    /* refit_interval 0 is manual: observes only count steps, refits happen when asked. */
    config.refit_interval = 0;
    OK(avc_estimator_new(&config, &estimator));
    uint64_t refits = 9, steps = 9;
    for (int i = 0; i < 3; i++) {
        OK(avc_estimator_observe(estimator, features, ROWS, K, admitted, ROWS, accepted, ROWS, NULL,
                                 0, NULL));
    }
    OK(avc_estimator_counters(estimator, &refits, &steps));
    CHECK(refits == 0 && steps == 3, "manual: %llu refits, %llu steps", (unsigned long long)refits,
          (unsigned long long)steps);
    OK(avc_estimator_refit(estimator));
    OK(avc_estimator_counters(estimator, &refits, &steps));
    CHECK(refits == 1 && steps == 0, "manual refit: %llu refits", (unsigned long long)refits);
    avc_estimator_config manual;
    OK(avc_estimator_get_config(estimator, &manual));
    CHECK(manual.refit_interval == 0, "manual config read back as %llu",
          (unsigned long long)manual.refit_interval);
    /* set_regularization: a bad value is refused by name and changes nothing. */
    EXPECT(avc_estimator_set_regularization(NULL, 0.1, 1.0), AVC_ERR_NULL, "estimator");
    EXPECT(avc_estimator_set_regularization(estimator, -1.0, 1.0), AVC_ERR_VALUE,
           "l2: must be non-negative");
    EXPECT(avc_estimator_set_regularization(estimator, 0.1, NAN), AVC_ERR_VALUE,
           "damping: must be finite");
    OK(avc_estimator_get_config(estimator, &manual));
    CHECK(manual.l2 == config.l2 && manual.damping == 50, "a refused setter changed the config");
    OK(avc_estimator_set_regularization(estimator, 0.25, 7.0));
    OK(avc_estimator_get_config(estimator, &manual));
    CHECK(manual.l2 == 0.25 && manual.damping == 7.0, "set_regularization not applied");
    OK(avc_estimator_free(estimator));
    estimator = (avc_estimator *)&config;
    EXPECT(avc_estimator_new(NULL, &estimator), AVC_ERR_NULL, "config");
    EXPECT(avc_estimator_new(&config, NULL), AVC_ERR_NULL, "estimator_out");

    config.refit_interval = 7;
    OK(avc_estimator_new(&config, &estimator));
    avc_estimator_config back;
    OK(avc_estimator_get_config(estimator, &back));
    CHECK(back.num_positions == K && back.refit_interval == 7 && back.damping == 50 &&
              back.l2 == config.l2 && back.init_slope == config.init_slope &&
              back.init_intercept == config.init_intercept &&
              back.max_log_odds == config.max_log_odds && back.max_step == config.max_step &&
              back.max_slope == config.max_slope && back.max_intercept == config.max_intercept &&
              back.memory == config.memory && back.drift_z == config.drift_z,
          "config did not round-trip");
    OK(avc_estimator_free(estimator));
}

static void test_save_load(void) {
    avc_estimator *estimator = new_estimator(100);
    OK(avc_estimator_observe(estimator, features, ROWS, K, admitted, ROWS, accepted, ROWS, NULL, 0,
                             NULL));
    size_t needed = 0;
    EXPECT(avc_estimator_save(estimator, NULL, 0, &needed), AVC_ERR_BUFFER_TOO_SMALL,
           "buf: cap = 0 bytes");
    CHECK(needed > 24, "state size %zu", needed);
    EXPECT(avc_estimator_save(estimator, NULL, 0, NULL), AVC_ERR_NULL, "len_out");
    EXPECT(avc_estimator_save(estimator, NULL, 5, &needed), AVC_ERR_NULL, "buf");

    /* A short buffer is reported and left untouched. */
    uint8_t *bytes = malloc(needed);
    if (bytes == NULL) {
        abort();
    }
    memset(bytes, 0xAB, needed);
    size_t len = 0;
    EXPECT(avc_estimator_save(estimator, bytes, needed - 1, &len), AVC_ERR_BUFFER_TOO_SMALL,
           "the state needs");
    CHECK(len == needed, "len_out %zu, needed %zu", len, needed);
    int untouched = 1;
    for (size_t i = 0; i < needed; i++) {
        untouched &= bytes[i] == 0xAB;
    }
    CHECK(untouched, "a too-small save wrote to buf");
    OK(avc_estimator_save(estimator, bytes, needed, &len));

    avc_estimator *restored = (avc_estimator *)bytes;
    EXPECT(avc_estimator_load(NULL, needed, &restored), AVC_ERR_NULL, "data");
    CHECK(restored == NULL, "estimator_out not NULL after a failure");
    EXPECT(avc_estimator_load(bytes, needed, NULL), AVC_ERR_NULL, "estimator_out");
    EXPECT(avc_estimator_load(bytes, 0, &restored), AVC_ERR_VALUE, "data: not an av_core");
    EXPECT(avc_estimator_load(bytes, needed - 1, &restored), AVC_ERR_VALUE, "data: length");
    bytes[needed / 2] ^= 0x10;
    EXPECT(avc_estimator_load(bytes, needed, &restored), AVC_ERR_VALUE, "data: checksum");
    bytes[needed / 2] ^= 0x10;
    OK(avc_estimator_load(bytes, needed, &restored));
    CHECK(restored != NULL && same_state(estimator, restored), "load did not restore the state");

    free(bytes);
    OK(avc_estimator_free(restored));
    OK(avc_estimator_free(estimator));
}

/* The bytes of a cost-tables or planner save (caller frees), after checking the size query. */
static uint8_t *saved_tables(const avc_cost_tables *tables, size_t *len) {
    size_t needed = 0;
    EXPECT(avc_cost_tables_save(tables, NULL, 0, &needed), AVC_ERR_BUFFER_TOO_SMALL, "buf");
    uint8_t *bytes = malloc(needed);
    if (bytes == NULL) {
        abort();
    }
    OK(avc_cost_tables_save(tables, bytes, needed, len));
    CHECK(*len == needed, "saved %zu bytes, size query said %zu", *len, needed);
    return bytes;
}

static uint8_t *saved_planner(const avc_planner *planner, size_t *len) {
    size_t needed = 0;
    EXPECT(avc_planner_save(planner, NULL, 0, &needed), AVC_ERR_BUFFER_TOO_SMALL, "buf");
    uint8_t *bytes = malloc(needed);
    if (bytes == NULL) {
        abort();
    }
    OK(avc_planner_save(planner, bytes, needed, len));
    CHECK(*len == needed, "saved %zu bytes, size query said %zu", *len, needed);
    return bytes;
}

/* avc_cost_tables_save/_load and avc_planner_save/_load: the size convention, a short buffer
 * left untouched, refused data (empty, truncated, corrupt, another kind's state) leaving the
 * output NULL, and a restored planner that plans every later step exactly as the original. */
static void test_planner_and_tables_save_load(void) {
    const double draft_ms[] = {0.5, 0.6, 0.7, 0.8};
    const double verify_ms[] = {5, 5, 5, 5, 5, 5, 5, 5, 5, 6, 7, 8, 9};
    const double depth_ms[] = {0.0, 0.4, 0.8, 1.2};
    avc_cost_tables *plain = NULL, *tables = NULL;
    OK(avc_cost_tables_new(draft_ms, 4, verify_ms, 13, &plain));
    OK(avc_cost_tables_with_draft_depth(plain, depth_ms, 4, &tables));
    OK(avc_cost_tables_free(plain));

    size_t len = 0, needed = 0;
    EXPECT(avc_cost_tables_save(NULL, NULL, 0, &len), AVC_ERR_NULL, "tables");
    EXPECT(avc_cost_tables_save(tables, NULL, 0, NULL), AVC_ERR_NULL, "len_out");
    EXPECT(avc_cost_tables_save(tables, NULL, 5, &len), AVC_ERR_NULL, "buf");
    EXPECT(avc_cost_tables_save(tables, NULL, 0, &needed), AVC_ERR_BUFFER_TOO_SMALL,
           "buf: cap = 0 bytes");
    uint8_t *bytes = malloc(needed);
    if (bytes == NULL) {
        abort();
    }
    memset(bytes, 0xAB, needed);
    EXPECT(avc_cost_tables_save(tables, bytes, needed - 1, &len), AVC_ERR_BUFFER_TOO_SMALL,
           "the state needs");
    CHECK(len == needed, "len_out %zu, needed %zu", len, needed);
    int untouched = 1;
    for (size_t i = 0; i < needed; i++) {
        untouched &= bytes[i] == 0xAB;
    }
    CHECK(untouched, "a too-small save wrote to buf");
    OK(avc_cost_tables_save(tables, bytes, needed, &len));
    CHECK(memcmp(bytes, "AVCORE\0C", 8) == 0, "cost tables frame magic");

    avc_cost_tables *restored = tables; /* any non-NULL value */
    EXPECT(avc_cost_tables_load(NULL, needed, &restored), AVC_ERR_NULL, "data");
    CHECK(restored == NULL, "tables_out not NULL after a failure");
    EXPECT(avc_cost_tables_load(bytes, needed, NULL), AVC_ERR_NULL, "tables_out");
    EXPECT(avc_cost_tables_load(bytes, 0, &restored), AVC_ERR_VALUE, "data: not av_core");
    EXPECT(avc_cost_tables_load(bytes, needed - 1, &restored), AVC_ERR_VALUE, "data: length");
    bytes[needed / 2] ^= 0x10;
    restored = tables;
    EXPECT(avc_cost_tables_load(bytes, needed, &restored), AVC_ERR_VALUE, "data: checksum");
    CHECK(restored == NULL, "tables_out not NULL after a failure");
    bytes[needed / 2] ^= 0x10;
    OK(avc_cost_tables_load(bytes, needed, &restored));
    size_t again_len = 0;
    uint8_t *again = saved_tables(restored, &again_len);
    CHECK(again_len == needed && memcmp(again, bytes, needed) == 0,
          "restored tables save different bytes");
    double draft_a[4], draft_b[4], verify_a[13], verify_b[13], depth_a[4], depth_b[4];
    OK(avc_cost_tables_copy(tables, draft_a, 4, verify_a, 13));
    OK(avc_cost_tables_copy(restored, draft_b, 4, verify_b, 13));
    OK(avc_cost_tables_draft_depth(tables, depth_a, 4, &len));
    OK(avc_cost_tables_draft_depth(restored, depth_b, 4, &len));
    CHECK(memcmp(draft_a, draft_b, sizeof draft_a) == 0 &&
              memcmp(verify_a, verify_b, sizeof verify_a) == 0 &&
              memcmp(depth_a, depth_b, sizeof depth_a) == 0,
          "restored tables differ");
    free(again);
    OK(avc_cost_tables_free(restored));

    /* A planner with exploration on (the saved step count drives its draws). */
    avc_planner *planner = NULL;
    OK(avc_planner_new(tables, 4, K, AVC_BUDGET_SOURCE_PREVIOUS, &planner));
    OK(avc_planner_set_exploration(planner, 0.4, 9));
    const int64_t slots[ROWS] = {0, 2};
    const int64_t scheduled[ROWS] = {3, 2};
    const avc_step_tokens step = {ROWS, ROWS, SIZE_MAX};
    const float first[ROWS * K] = {0.9f, 0.8f, 0.5f, 0.7f, 0.2f, 0.1f};
    int32_t admitted_out[ROWS];
    avc_verification_plan plan;
    OK(avc_planner_plan(planner, slots, ROWS, first, ROWS, K, scheduled, ROWS, &step,
                        admitted_out, ROWS, &plan));

    /* A cost-tables state is not a planner state, and the reverse. */
    avc_planner *loaded = planner; /* any non-NULL value */
    EXPECT(avc_planner_load(bytes, needed, &loaded), AVC_ERR_VALUE,
           "data: not an av_core planner state (bad magic bytes: av_core cost tables)");
    CHECK(loaded == NULL, "planner_out not NULL after a failure");
    free(bytes);
    EXPECT(avc_planner_save(NULL, NULL, 0, &len), AVC_ERR_NULL, "planner");
    EXPECT(avc_planner_save(planner, NULL, 0, NULL), AVC_ERR_NULL, "len_out");
    bytes = saved_planner(planner, &needed);
    CHECK(memcmp(bytes, "AVCORE\0P", 8) == 0, "planner frame magic");
    EXPECT(avc_planner_save(planner, bytes, needed - 1, &len), AVC_ERR_BUFFER_TOO_SMALL,
           "the state needs");
    EXPECT(avc_cost_tables_load(bytes, needed, &restored), AVC_ERR_VALUE,
           "data: not av_core cost tables (bad magic bytes: an av_core planner state)");
    EXPECT(avc_planner_load(bytes, needed, NULL), AVC_ERR_NULL, "planner_out");
    EXPECT(avc_planner_load(bytes, needed - 1, &loaded), AVC_ERR_VALUE, "data: length");
    bytes[needed - 1] ^= 0x01;
    EXPECT(avc_planner_load(bytes, needed, &loaded), AVC_ERR_VALUE, "data: checksum");
    CHECK(loaded == NULL, "planner_out not NULL after a failure");
    bytes[needed - 1] ^= 0x01;
    OK(avc_planner_load(bytes, needed, &loaded));
    free(bytes);

    /* The clone continues exactly like the original: same plans, same remembered state. */
    const float later[3][ROWS * K] = {{0.3f, 0.9f, 0.6f, 0.95f, 0.85f, 0.4f},
                                      {0.05f, 0.5f, 0.99f, 0.6f, 0.6f, 0.6f},
                                      {0.7f, 0.1f, 0.8f, 0.2f, 0.9f, 0.3f}};
    const int64_t later_slots[ROWS] = {1, 2};
    const int64_t full[ROWS] = {3, 3};
    for (int s = 0; s < 3; s++) {
        int32_t admitted_a[ROWS], admitted_b[ROWS], depths_a[ROWS], depths_b[ROWS];
        avc_verification_plan plan_a, plan_b;
        avc_depth_plan depth_a_plan, depth_b_plan;
        OK(avc_planner_plan(planner, later_slots, ROWS, later[s], ROWS, K, full, ROWS, &step,
                            admitted_a, ROWS, &plan_a));
        OK(avc_planner_plan(loaded, later_slots, ROWS, later[s], ROWS, K, full, ROWS, &step,
                            admitted_b, ROWS, &plan_b));
        CHECK(plan_a.budget == plan_b.budget && admitted_a[0] == admitted_b[0] &&
                  admitted_a[1] == admitted_b[1] &&
                  plan_a.expected_accepted_tokens == plan_b.expected_accepted_tokens,
              "step %d: restored planner planned differently (budget %zu vs %zu)", s,
              plan_a.budget, plan_b.budget);
        OK(avc_planner_choose_draft_depth(planner, later_slots, ROWS, full, ROWS, &step,
                                          AVC_DEPTH_MODE_BATCH, depths_a, ROWS,
                                          &depth_a_plan));
        OK(avc_planner_choose_draft_depth(loaded, later_slots, ROWS, full, ROWS, &step,
                                          AVC_DEPTH_MODE_BATCH, depths_b, ROWS,
                                          &depth_b_plan));
        CHECK(depths_a[0] == depths_b[0] && depths_a[1] == depths_b[1],
              "step %d: restored planner chose other depths", s);
    }
    size_t len_a = 0, len_b = 0;
    uint8_t *bytes_a = saved_planner(planner, &len_a);
    uint8_t *bytes_b = saved_planner(loaded, &len_b);
    CHECK(len_a == len_b && memcmp(bytes_a, bytes_b, len_a) == 0,
          "original and restored planner states diverged");
    free(bytes_a);
    free(bytes_b);
    OK(avc_planner_free(loaded));
    OK(avc_planner_free(planner));
    OK(avc_cost_tables_free(tables));
}

static void test_handles(void) {
    /* NULL free is a no-op. */
    OK(avc_estimator_free(NULL));
    OK(avc_cost_tables_free(NULL));
    OK(avc_planner_free(NULL));

    /* Double free is refused without touching the freed memory (a registry lookup). */
    avc_estimator *estimator = new_estimator(100);
    OK(avc_estimator_free(estimator));
    EXPECT(avc_estimator_free(estimator), AVC_ERR_INVALID_HANDLE,
           "estimator: is not a live avc_estimator (already freed, or never created)");

    /* A live handle of another kind is refused by free and by the tag check. */
    const double draft_ms[] = {0.0, 1.0};
    const double verify_ms[] = {1.0, 2.0, 3.0};
    avc_cost_tables *tables = NULL;
    OK(avc_cost_tables_new(draft_ms, 2, verify_ms, 3, &tables));
    EXPECT(avc_estimator_free((avc_estimator *)tables), AVC_ERR_INVALID_HANDLE,
           "a handle of a different kind");
    EXPECT(avc_planner_add_request((avc_planner *)tables, 0), AVC_ERR_INVALID_HANDLE,
           "planner: is not a live avc_planner");
    float out[K];
    EXPECT(avc_estimator_predict((const avc_estimator *)tables, features, 1, K, out, K),
           AVC_ERR_INVALID_HANDLE, "estimator: is not a live avc_estimator");
    OK(avc_cost_tables_free(tables));
    EXPECT(avc_cost_tables_free(tables), AVC_ERR_INVALID_HANDLE, "tables");
}

static void test_cost_tables(void) {
    const double draft_ms[] = {0.0, 1.0, 1.5};
    const double verify_ms[] = {1.0, 2.0, 3.0, 4.0};
    double bad[] = {0.0, NAN, 1.0};
    avc_cost_tables *tables = NULL;
    EXPECT(avc_cost_tables_new(NULL, 3, verify_ms, 4, &tables), AVC_ERR_NULL, "draft_ms");
    EXPECT(avc_cost_tables_new(draft_ms, 3, verify_ms, 0, &tables), AVC_ERR_VALUE,
           "verify_ms: is empty");
    EXPECT(avc_cost_tables_new(bad, 3, verify_ms, 4, &tables), AVC_ERR_VALUE,
           "draft_ms: [1] = NaN");
    EXPECT(avc_cost_tables_new(draft_ms, 3, bad, 3, &tables), AVC_ERR_VALUE, "verify_ms: [0]");
    CHECK(tables == NULL, "tables_out not NULL after a failure");

    const avc_cost_point curve[] = {{1, 1.0}, {4, 2.0}};
    const avc_cost_point unsorted[] = {{4, 1.0}, {1, 2.0}};
    const avc_cost_point nan_cost[] = {{1, NAN}};
    EXPECT(avc_cost_tables_from_curves(curve, 2, unsorted, 2, 4, 8, 0, &tables), AVC_ERR_VALUE,
           "verify_curve");
    EXPECT(avc_cost_tables_from_curves(NULL, 2, curve, 2, 4, 8, 0, &tables), AVC_ERR_NULL,
           "draft_curve");
    EXPECT(avc_cost_tables_from_samples(nan_cost, 1, curve, 2, 4, 8, 0, &tables), AVC_ERR_VALUE,
           "draft_samples");
    OK(avc_cost_tables_from_samples(unsorted, 2, curve, 2, 4, 8, 0, &tables));

    size_t reqs = 0, tokens = 0;
    OK(avc_cost_tables_sizes(tables, &reqs, &tokens));
    CHECK(reqs == 4 && tokens == 8, "sizes %zu %zu", reqs, tokens);
    double draft_copy[5], verify_copy[9];
    EXPECT(avc_cost_tables_copy(tables, draft_copy, 4, verify_copy, 9), AVC_ERR_VALUE,
           "draft_len: must be 5");
    OK(avc_cost_tables_copy(tables, draft_copy, 5, verify_copy, 9));
    CHECK(verify_copy[0] >= 1e-6 && verify_copy[8] >= verify_copy[0], "verify table %g..%g",
          verify_copy[0], verify_copy[8]);
    OK(avc_cost_tables_free(tables));
}

static void test_planner(void) {
    const double draft_ms[] = {0.5, 0.6, 0.7, 0.8};
    const double verify_ms[] = {5, 5, 5, 5, 5, 5, 5, 5, 5, 6, 7, 8, 9};
    avc_cost_tables *tables = NULL;
    OK(avc_cost_tables_new(draft_ms, 4, verify_ms, 13, &tables));
    const float confidences[ROWS * K] = {0.9f, 0.8f, 0.5f, 0.7f, 0.2f, 0.1f};
    float nan_confidences[ROWS * K];
    memcpy(nan_confidences, confidences, sizeof confidences);
    nan_confidences[1] = NAN;
    const int64_t scheduled[ROWS] = {3, 3};
    const int64_t slots[ROWS] = {0, 1};
    avc_step_tokens step = {ROWS, ROWS, SIZE_MAX};
    size_t budget = 0;

    EXPECT(avc_choose_draft_budget(confidences, ROWS, K, scheduled, ROWS, &step, NULL, &budget),
           AVC_ERR_NULL, "tables");
    EXPECT(avc_choose_draft_budget(confidences, ROWS, K, scheduled, ROWS, NULL, tables, &budget),
           AVC_ERR_NULL, "step");
    EXPECT(avc_choose_draft_budget(confidences, ROWS, K, scheduled, ROWS, &step, tables, NULL),
           AVC_ERR_NULL, "budget_out");
    EXPECT(avc_choose_draft_budget(nan_confidences, ROWS, K, scheduled, ROWS, &step, tables,
                                   &budget),
           AVC_ERR_VALUE, "confidences: [0, 1] = NaN");
    EXPECT(avc_choose_draft_budget(confidences, ROWS, K, scheduled, 1, &step, tables, &budget),
           AVC_ERR_VALUE, "scheduled_drafts: has length 1");
    step.num_sampling_requests = 3;
    EXPECT(avc_choose_draft_budget(confidences, ROWS, K, scheduled, ROWS, &step, tables, &budget),
           AVC_ERR_VALUE, "num_sampling_requests");
    step.num_sampling_requests = ROWS;
    step.num_non_draft_tokens = 10;
    EXPECT(avc_choose_draft_budget(confidences, ROWS, K, scheduled, ROWS, &step, tables, &budget),
           AVC_ERR_VALUE, "num_non_draft_tokens");
    step.num_non_draft_tokens = ROWS;
    OK(avc_choose_draft_budget(confidences, ROWS, K, scheduled, ROWS, &step, tables, &budget));

    int32_t assigned[ROWS] = {-1, -1};
    EXPECT(avc_assign_draft_budget(confidences, ROWS, K, scheduled, ROWS, budget, assigned, 1),
           AVC_ERR_VALUE, "admitted");
    EXPECT(avc_assign_draft_budget(confidences, ROWS, K, scheduled, ROWS, budget, NULL, ROWS),
           AVC_ERR_NULL, "admitted");
    CHECK(assigned[0] == -1 && assigned[1] == -1, "rejected assign wrote admitted");
    OK(avc_assign_draft_budget(confidences, ROWS, K, scheduled, ROWS, budget, assigned, ROWS));
    CHECK(assigned[0] + assigned[1] == (int32_t)budget, "assigned %d + %d != budget %zu",
          assigned[0], assigned[1], budget);

    avc_verification_plan plan;
    int32_t admitted_plan[ROWS];
    OK(avc_plan_verification(confidences, ROWS, K, NULL, 0, scheduled, ROWS, &step, tables,
                             admitted_plan, ROWS, &plan));
    CHECK(plan.budget == budget, "plan budget %zu, chosen %zu", plan.budget, budget);
    EXPECT(avc_plan_verification(confidences, ROWS, K, confidences, ROWS * K - 1, scheduled, ROWS,
                                 &step, tables, admitted_plan, ROWS, &plan),
           AVC_ERR_VALUE, "budget_confidences");

    avc_planner *planner = (avc_planner *)&plan;
    EXPECT(avc_planner_new(tables, 4, K, 7, &planner), AVC_ERR_VALUE, "budget_source");
    CHECK(planner == NULL, "planner_out not NULL after a failure");
    EXPECT(avc_planner_new(tables, 4, 0, AVC_BUDGET_SOURCE_PREVIOUS, &planner), AVC_ERR_VALUE,
           "num_positions");
    OK(avc_planner_new(tables, 4, K, AVC_BUDGET_SOURCE_PREVIOUS, &planner));
    /* The planner keeps its own copy of the tables. */
    OK(avc_cost_tables_free(tables));

    int32_t admitted_out[ROWS];
    const int64_t duplicate[ROWS] = {1, 1};
    const int64_t out_of_range[ROWS] = {0, 4};
    EXPECT(avc_planner_plan(planner, duplicate, ROWS, confidences, ROWS, K, scheduled, ROWS,
                            &step, admitted_out, ROWS, &plan),
           AVC_ERR_VALUE, "slots: [1] = 1 appears twice");
    EXPECT(avc_planner_plan(planner, out_of_range, ROWS, confidences, ROWS, K, scheduled, ROWS,
                            &step, admitted_out, ROWS, &plan),
           AVC_ERR_VALUE, "slots: [1] = 4 is outside 0..4");
    EXPECT(avc_planner_plan(planner, slots, 1, confidences, ROWS, K, scheduled, ROWS, &step,
                            admitted_out, ROWS, &plan),
           AVC_ERR_VALUE, "slots");
    EXPECT(avc_planner_plan(planner, slots, ROWS, confidences, ROWS, 2, scheduled, ROWS, &step,
                            admitted_out, ROWS, &plan),
           AVC_ERR_VALUE, "confidences");
    EXPECT(avc_planner_plan(planner, slots, ROWS, nan_confidences, ROWS, K, scheduled, ROWS,
                            &step, admitted_out, ROWS, &plan),
           AVC_ERR_VALUE, "confidences");
    EXPECT(avc_planner_plan(planner, slots, ROWS, confidences, ROWS, K, scheduled, ROWS, &step,
                            admitted_out, ROWS, NULL),
           AVC_ERR_NULL, "plan_out");
    EXPECT(avc_planner_plan(planner, slots, ROWS, confidences, ROWS, K, scheduled, ROWS, &step,
                            (int32_t *)(void *)scheduled, ROWS, &plan),
           AVC_ERR_VALUE, "admitted: overlaps scheduled_drafts");

    /* Rejected plans remembered nothing: every slot still holds the initial 1.0. */
    double remembered[K];
    OK(avc_planner_previous_confidences(planner, 0, remembered, K));
    CHECK(remembered[0] == 1.0 && remembered[2] == 1.0, "slot 0 remembers %g", remembered[0]);
    EXPECT(avc_planner_previous_confidences(planner, 4, remembered, K), AVC_ERR_VALUE, "slot");
    EXPECT(avc_planner_previous_confidences(planner, 0, remembered, 2), AVC_ERR_VALUE,
           "confidences_len");

    OK(avc_planner_plan(planner, slots, ROWS, confidences, ROWS, K, scheduled, ROWS, &step,
                        admitted_out, ROWS, &plan));
    OK(avc_planner_previous_confidences(planner, 1, remembered, K));
    CHECK(remembered[0] == (double)0.7f, "slot 1 remembers %g, expected 0.7", remembered[0]);
    EXPECT(avc_planner_add_request(planner, 99), AVC_ERR_VALUE, "slot");
    OK(avc_planner_add_request(planner, 1));
    OK(avc_planner_previous_confidences(planner, 1, remembered, K));
    CHECK(remembered[0] == 1.0, "slot 1 after add_request remembers %g", remembered[0]);
    EXPECT(avc_planner_add_request(NULL, 0), AVC_ERR_NULL, "planner");
    EXPECT(avc_planner_set_exploration(planner, 1.5, 0), AVC_ERR_VALUE, "probability");
    EXPECT(avc_planner_set_exploration(planner, NAN, 0), AVC_ERR_VALUE, "probability");
    EXPECT(avc_planner_set_exploration(NULL, 0.0, 0), AVC_ERR_NULL, "planner");
    OK(avc_planner_set_exploration(planner, 0.0, 7));

    /* remember: what plan stores, without planning; rejected calls store nothing. */
    const int64_t one_drafted[ROWS] = {1, 1};
    EXPECT(avc_planner_remember(NULL, slots, ROWS, confidences, ROWS, K, one_drafted, ROWS),
           AVC_ERR_NULL, "planner");
    EXPECT(avc_planner_remember(planner, NULL, ROWS, confidences, ROWS, K, one_drafted, ROWS),
           AVC_ERR_NULL, "slots");
    EXPECT(avc_planner_remember(planner, slots, ROWS, confidences, ROWS, K, one_drafted, 1),
           AVC_ERR_VALUE, "scheduled_drafts");
    EXPECT(avc_planner_remember(planner, slots, ROWS, confidences, ROWS, K - 1, one_drafted,
                                ROWS),
           AVC_ERR_VALUE, "confidences");
    OK(avc_planner_previous_confidences(planner, 1, remembered, K));
    const double before = remembered[1];
    OK(avc_planner_remember(planner, slots, ROWS, confidences, ROWS, K, one_drafted, ROWS));
    OK(avc_planner_previous_confidences(planner, 1, remembered, K));
    CHECK(remembered[0] == (double)0.7f && remembered[1] == before,
          "slot 1 remembers %g, %g after remember", remembered[0], remembered[1]);

    /* An engine that plans verification itself counts each step and may read the draws. */
    bool explorers[ROWS] = {false, false};
    bool exploration_step = false;
    OK(avc_planner_set_exploration(planner, 1.0, 7));
    OK(avc_planner_coming_explorers(planner, slots, ROWS, explorers, ROWS, &exploration_step));
    CHECK(explorers[0] && explorers[1] && exploration_step, "probability 1: all explore");
    OK(avc_planner_count_step(planner));
    EXPECT(avc_planner_count_step(NULL), AVC_ERR_NULL, "planner");
    EXPECT(avc_planner_coming_explorers(NULL, slots, ROWS, explorers, ROWS, &exploration_step),
           AVC_ERR_NULL, "planner");
    EXPECT(avc_planner_coming_explorers(planner, slots, ROWS, explorers, 1, &exploration_step),
           AVC_ERR_VALUE, "explorers");
    EXPECT(avc_planner_coming_explorers(planner, slots, ROWS, explorers, ROWS, NULL),
           AVC_ERR_NULL, "exploration_step_out");
    OK(avc_planner_set_exploration(planner, 0.0, 7));
    OK(avc_planner_coming_explorers(planner, slots, ROWS, explorers, ROWS, &exploration_step));
    CHECK(!explorers[0] && !explorers[1] && !exploration_step, "probability 0: none explores");

    OK(avc_planner_free(planner));
    EXPECT(avc_planner_free(planner), AVC_ERR_INVALID_HANDLE, "planner");
}

/* The drafting-depth API: draft-depth tables on new cost-tables handles, the stateless
 * decision against hand-computed cases, and the stateful planner's decision. */
static void test_draft_depth(void) {
    const double expensive_draft[] = {0.0, 100.0, 100.0, 100.0};
    const double free_draft[] = {0.0, 0.0, 0.0, 0.0};
    double flat_verify[13];
    for (int t = 0; t < 13; t++) {
        flat_verify[t] = 10.0;
    }
    avc_cost_tables *plain = NULL;
    OK(avc_cost_tables_new(expensive_draft, 4, flat_verify, 13, &plain));

    /* avc_cost_tables_with_draft_depth: a failure sets the output to NULL. */
    const double depth_table[] = {0.0, 1.0, 2.0, 3.0}; /* one pass per position */
    const double decreasing[] = {0.0, 2.0, 1.0};
    avc_cost_tables *out = plain; /* any non-NULL value */
    EXPECT(avc_cost_tables_with_draft_depth(plain, decreasing, 3, &out), AVC_ERR_VALUE,
           "draft_depth_ms: [2] = 1 must be finite and >= [1] = 2");
    CHECK(out == NULL, "tables_out not NULL after a failure");
    out = plain;
    EXPECT(avc_cost_tables_with_draft_depth(plain, depth_table, 1, &out), AVC_ERR_VALUE,
           "draft_depth_ms: has 1 entries");
    CHECK(out == NULL, "tables_out not NULL after a failure");
    EXPECT(avc_cost_tables_with_draft_depth(plain, NULL, 4, &out), AVC_ERR_NULL,
           "draft_depth_ms: is NULL");
    EXPECT(avc_cost_tables_with_draft_depth(NULL, depth_table, 4, &out), AVC_ERR_NULL,
           "tables: must not be NULL");
    EXPECT(avc_cost_tables_with_draft_depth(plain, depth_table, 4, NULL), AVC_ERR_NULL,
           "tables_out");
    avc_cost_tables *expensive = NULL;
    OK(avc_cost_tables_with_draft_depth(plain, depth_table, 4, &expensive));
    CHECK(expensive != NULL && expensive != plain, "with_draft_depth returned the input");

    /* avc_cost_tables_draft_depth: length 0 without a table; a size query; a copy. */
    double table[8];
    for (int i = 0; i < 8; i++) {
        table[i] = -1.0;
    }
    size_t len = 99;
    OK(avc_cost_tables_draft_depth(plain, table, 8, &len));
    CHECK(len == 0 && table[0] == -1.0, "the input gained a depth table (len %zu)", len);
    EXPECT(avc_cost_tables_draft_depth(expensive, NULL, 0, &len), AVC_ERR_BUFFER_TOO_SMALL,
           "draft_depth_ms: capacity = 0, the table has 4 entries");
    CHECK(len == 4, "size query said %zu, expected 4", len);
    len = 99;
    EXPECT(avc_cost_tables_draft_depth(expensive, table, 3, &len), AVC_ERR_BUFFER_TOO_SMALL,
           "capacity = 3");
    CHECK(len == 4 && table[0] == -1.0, "a too-small buffer was written");
    len = 99;
    EXPECT(avc_cost_tables_draft_depth(expensive, table, 8, NULL), AVC_ERR_NULL, "len_out");
    EXPECT(avc_cost_tables_draft_depth(NULL, table, 8, &len), AVC_ERR_NULL, "tables");
    CHECK(len == 99 && table[0] == -1.0, "a rejected query wrote its outputs");
    OK(avc_cost_tables_draft_depth(expensive, table, 8, &len));
    CHECK(len == 4 && table[0] == 0.0 && table[3] == 3.0 && table[4] == -1.0,
          "draft depth table: len %zu, [3] = %g, [4] = %g", len, table[3], table[4]);

    /* avc_cost_tables_with_drafter; derived tables outlive their base. */
    out = plain;
    EXPECT(avc_cost_tables_with_drafter(plain, 2, K, &out), AVC_ERR_VALUE,
           "kind: must be AVC_DRAFTER_KIND_AUTOREGRESSIVE (0) or AVC_DRAFTER_KIND_PARALLEL (1), "
           "got 2");
    CHECK(out == NULL, "tables_out not NULL after a failure");
    EXPECT(avc_cost_tables_with_drafter(plain, AVC_DRAFTER_KIND_PARALLEL, 0, &out),
           AVC_ERR_VALUE, "max_depth: = 0 must be in 1..=4096");
    avc_cost_tables *free_base = NULL, *free_tables = NULL, *block = NULL;
    OK(avc_cost_tables_new(free_draft, 4, flat_verify, 13, &free_base));
    OK(avc_cost_tables_with_drafter(free_base, AVC_DRAFTER_KIND_AUTOREGRESSIVE, K, &free_tables));
    OK(avc_cost_tables_with_drafter(free_base, AVC_DRAFTER_KIND_PARALLEL, K, &block));
    OK(avc_cost_tables_free(free_base));
    OK(avc_cost_tables_draft_depth(free_tables, table, 8, &len));
    CHECK(len == K + 1 && table[1] == 1.0 / 3.0 && table[3] == 1.0, "autoregressive shape");
    OK(avc_cost_tables_draft_depth(block, table, 8, &len));
    CHECK(len == K + 1 && table[1] == 1.0 && table[2] == 1.0, "parallel shape");
    OK(avc_cost_tables_free(block));

    /* avc_choose_draft_depth. */
    const float hopeless[ROWS * K] = {0.01f, 0.01f, 0.01f, 0.01f, 0.01f, 0.01f};
    const float confident[ROWS * K] = {0.9f, 0.9f, 0.9f, 0.9f, 0.9f, 0.9f};
    const int64_t caps[ROWS] = {K, K};
    const int64_t too_deep[ROWS] = {K + 1, 0};
    avc_step_tokens step = {ROWS, ROWS, SIZE_MAX};
    int32_t depths[ROWS] = {-1, -1};
    avc_depth_plan plan = {77, 77, 77, -7.0, -7.0};
    EXPECT(avc_choose_draft_depth(hopeless, ROWS, K, caps, ROWS, &step, plain,
                                  AVC_DEPTH_MODE_BATCH, depths, ROWS, &plan),
           AVC_ERR_VALUE, "tables: have no draft-depth table");
    EXPECT(avc_choose_draft_depth(hopeless, ROWS, K, caps, ROWS, &step, expensive, 5, depths,
                                  ROWS, &plan),
           AVC_ERR_VALUE, "mode: must be AVC_DEPTH_MODE_BATCH (0) or");
    EXPECT(avc_choose_draft_depth(hopeless, ROWS, K, too_deep, ROWS, &step, expensive,
                                  AVC_DEPTH_MODE_BATCH, depths, ROWS, &plan),
           AVC_ERR_VALUE, "max_depths");
    EXPECT(avc_choose_draft_depth(hopeless, ROWS, K, caps, ROWS, &step, expensive,
                                  AVC_DEPTH_MODE_BATCH, depths, 1, &plan),
           AVC_ERR_VALUE, "depths: has length 1");
    EXPECT(avc_choose_draft_depth(hopeless, ROWS, K, caps, ROWS, NULL, expensive,
                                  AVC_DEPTH_MODE_BATCH, depths, ROWS, &plan),
           AVC_ERR_NULL, "step");
    EXPECT(avc_choose_draft_depth(hopeless, ROWS, K, caps, ROWS, &step, expensive,
                                  AVC_DEPTH_MODE_BATCH, depths, ROWS, NULL),
           AVC_ERR_NULL, "plan_out");
    CHECK(depths[0] == -1 && depths[1] == -1 && plan.max_depth == 77 &&
              plan.expected_accepted_tokens == -7.0,
          "a rejected depth decision wrote its outputs");
    const avc_depth_mode modes[2] = {AVC_DEPTH_MODE_BATCH, AVC_DEPTH_MODE_PER_REQUEST};
    const double p = (double)0.9f;
    const double confident_tokens = 2.0 + 2.0 * (p + p * p + p * p * p);
    for (int m = 0; m < 2; m++) {
        /* Hopeless drafts, 100 ms to draft 3 positions: not drafting (2 tokens / 10 ms) beats
         * every depth d, which adds 100 d / 3 ms for at most 0.06 tokens. */
        OK(avc_choose_draft_depth(hopeless, ROWS, K, caps, ROWS, &step, expensive, modes[m],
                                  depths, ROWS, &plan));
        CHECK(depths[0] == 0 && depths[1] == 0, "mode %d: hopeless depths %d %d", modes[m],
              depths[0], depths[1]);
        CHECK(plan.max_depth == 0 && plan.drafts == 0 && plan.budget == 0 &&
                  plan.expected_accepted_tokens == 2.0 && plan.predicted_cost_ms == 10.0,
              "mode %d: hopeless plan %zu %zu %zu %g %g", modes[m], plan.max_depth, plan.drafts,
              plan.budget, plan.expected_accepted_tokens, plan.predicted_cost_ms);
        /* Confident drafts, free drafting, flat verification: every position pays. */
        OK(avc_choose_draft_depth(confident, ROWS, K, caps, ROWS, &step, free_tables, modes[m],
                                  depths, ROWS, &plan));
        CHECK(depths[0] == K && depths[1] == K, "mode %d: confident depths %d %d", modes[m],
              depths[0], depths[1]);
        CHECK(plan.max_depth == K && plan.drafts == 2 * K && plan.budget == 2 * K &&
                  fabs(plan.expected_accepted_tokens - confident_tokens) < 1e-12 &&
                  plan.predicted_cost_ms == 10.0,
              "mode %d: confident plan %zu %zu %zu %.17g (expected %.17g) %g", modes[m],
              plan.max_depth, plan.drafts, plan.budget, plan.expected_accepted_tokens,
              confident_tokens, plan.predicted_cost_ms);
    }

    /* avc_planner_choose_draft_depth: 6 ms to draft 3 positions, 10 ms to verify. */
    const double moderate_draft[] = {0.0, 6.0, 6.0, 6.0};
    avc_cost_tables *moderate_base = NULL, *moderate = NULL;
    OK(avc_cost_tables_new(moderate_draft, 4, flat_verify, 13, &moderate_base));
    OK(avc_cost_tables_with_drafter(moderate_base, AVC_DRAFTER_KIND_AUTOREGRESSIVE, K,
                                    &moderate));
    avc_planner *planner = NULL, *without = NULL;
    OK(avc_planner_new(moderate, 4, K, AVC_BUDGET_SOURCE_PREVIOUS, &planner));
    OK(avc_planner_new(moderate_base, 4, K, AVC_BUDGET_SOURCE_PREVIOUS, &without));
    OK(avc_cost_tables_free(moderate));
    OK(avc_cost_tables_free(moderate_base));
    const int64_t slots[ROWS] = {0, 1};
    const int64_t duplicate[ROWS] = {1, 1};
    plan = (avc_depth_plan){77, 77, 77, -7.0, -7.0};
    depths[0] = depths[1] = -1;
    EXPECT(avc_planner_choose_draft_depth(without, slots, ROWS, caps, ROWS, &step,
                                          AVC_DEPTH_MODE_BATCH, depths, ROWS, &plan),
           AVC_ERR_VALUE, "planner: its cost tables have no draft-depth table");
    EXPECT(avc_planner_choose_draft_depth(planner, duplicate, ROWS, caps, ROWS, &step,
                                          AVC_DEPTH_MODE_BATCH, depths, ROWS, &plan),
           AVC_ERR_VALUE, "slots: [1] = 1 appears twice");
    EXPECT(avc_planner_choose_draft_depth(planner, slots, ROWS, caps, 1, &step,
                                          AVC_DEPTH_MODE_BATCH, depths, ROWS, &plan),
           AVC_ERR_VALUE, "max_depths");
    EXPECT(avc_planner_choose_draft_depth(planner, slots, ROWS, caps, ROWS, &step, -1, depths,
                                          ROWS, &plan),
           AVC_ERR_VALUE, "mode");
    EXPECT(avc_planner_choose_draft_depth(NULL, slots, ROWS, caps, ROWS, &step,
                                          AVC_DEPTH_MODE_BATCH, depths, ROWS, &plan),
           AVC_ERR_NULL, "planner");
    CHECK(depths[0] == -1 && plan.max_depth == 77, "a rejected planner depth wrote its outputs");
    /* Fresh slots remember 1.0: depth 3 gives (2 + 6) tokens / (6 + 10) ms, the best. */
    OK(avc_planner_choose_draft_depth(planner, slots, ROWS, caps, ROWS, &step,
                                      AVC_DEPTH_MODE_BATCH, depths, ROWS, &plan));
    CHECK(depths[0] == K && depths[1] == K && plan.expected_accepted_tokens == 8.0 &&
              plan.predicted_cost_ms == 16.0,
          "fresh slots: depths %d %d, plan %g tokens / %g ms", depths[0], depths[1],
          plan.expected_accepted_tokens, plan.predicted_cost_ms);
    /* After a step of poor drafts no depth beats running without the drafter. */
    const int64_t scheduled[ROWS] = {K, K};
    int32_t admitted[ROWS];
    avc_verification_plan verification;
    OK(avc_planner_plan(planner, slots, ROWS, hopeless, ROWS, K, scheduled, ROWS, &step, admitted,
                        ROWS, &verification));
    for (int m = 0; m < 2; m++) {
        OK(avc_planner_choose_draft_depth(planner, slots, ROWS, caps, ROWS, &step, modes[m],
                                          depths, ROWS, &plan));
        CHECK(depths[0] == 0 && depths[1] == 0 && plan.max_depth == 0 &&
                  plan.predicted_cost_ms == 10.0,
              "mode %d after poor drafts: depths %d %d", modes[m], depths[0], depths[1]);
    }
    /* Deciding the depth changed nothing the planner remembers. */
    double remembered[K];
    OK(avc_planner_previous_confidences(planner, 1, remembered, K));
    CHECK(remembered[0] == (double)0.01f && remembered[2] == (double)0.01f,
          "slot 1 remembers %g", remembered[0]);

    OK(avc_planner_free(planner));
    OK(avc_planner_free(without));
    OK(avc_cost_tables_free(free_tables));
    OK(avc_cost_tables_free(expensive));
    OK(avc_cost_tables_free(plain));
}

static void test_misc(void) {
    uint32_t major = 0, minor = 0, patch = 0;
    OK(avc_version(&major, &minor, &patch));
    EXPECT(avc_version(NULL, &minor, &patch), AVC_ERR_NULL, "major_out");
    char expected[64];
    snprintf(expected, sizeof expected, "%u.%u.%u", major, minor, patch);
    CHECK(strcmp(expected, avc_version_string()) == 0, "%s vs %s", expected,
          avc_version_string());
    CHECK(avc_abi_version() == AVC_ABI_VERSION, "ABI %u", avc_abi_version());
    CHECK(strcmp(avc_status_name(AVC_ERR_NULL), "AVC_ERR_NULL") == 0, "status name");
    CHECK(strcmp(avc_status_name(1234), "AVC_UNKNOWN_STATUS") == 0, "unknown status name");

    /* Errors are like errno: a success leaves the last message in place. */
    EXPECT(avc_estimator_refit(NULL), AVC_ERR_NULL, "avc_estimator_refit: estimator");
    OK(avc_version(&major, &minor, &patch));
    CHECK(strstr(avc_last_error(), "avc_estimator_refit") != NULL, "message lost: %s",
          avc_last_error());
}

/* Error messages are thread-local: another thread's failure does not replace ours. */
static void *fail_elsewhere(void *unused) {
    (void)unused;
    avc_status status = avc_cost_tables_free((avc_cost_tables *)&status);
    return (void *)(intptr_t)(status == AVC_ERR_INVALID_HANDLE &&
                              strstr(avc_last_error(), "avc_cost_tables_free") != NULL);
}

static void test_thread_local_errors(void) {
    EXPECT(avc_estimator_refit(NULL), AVC_ERR_NULL, "estimator");
    pthread_t thread;
    void *result = NULL;
    CHECK(pthread_create(&thread, NULL, fail_elsewhere, NULL) == 0, "pthread_create");
    CHECK(pthread_join(thread, &result) == 0, "pthread_join");
    CHECK(result == (void *)1, "the other thread did not see its own error");
    CHECK(strstr(avc_last_error(), "avc_estimator_refit") != NULL, "our message changed: %s",
          avc_last_error());
}

/* Concurrent observers on one handle give exactly the serial bytes (docs/design.md,
 * "Determinism and concurrency"). */
enum { THREADS = 4, BATCHES = 64, BATCH_ROWS = 8 };
static float batch_features[BATCHES][BATCH_ROWS * K];
static int64_t batch_admitted[BATCHES][BATCH_ROWS];
static int64_t batch_accepted[BATCHES][BATCH_ROWS];

struct worker {
    avc_estimator *estimator;
    int first;
    int failed;
};

static void *observe_batches(void *arg) {
    struct worker *w = arg;
    float probabilities[BATCH_ROWS * K];
    for (int b = w->first; b < BATCHES; b += THREADS) {
        w->failed |= avc_estimator_observe(w->estimator, batch_features[b], BATCH_ROWS, K,
                                           batch_admitted[b], BATCH_ROWS, batch_accepted[b],
                                           BATCH_ROWS, NULL, 0, NULL) != AVC_OK;
        w->failed |= avc_estimator_predict(w->estimator, batch_features[b], BATCH_ROWS, K,
                                           probabilities, BATCH_ROWS * K) != AVC_OK;
    }
    return NULL;
}

static void test_concurrent_observe(void) {
    uint64_t state = 7;
    for (int b = 0; b < BATCHES; b++) {
        for (int i = 0; i < BATCH_ROWS * K; i++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            batch_features[b][i] = (float)((int)((state >> 33) % 4001) - 2000) / 100.0f;
        }
        for (int r = 0; r < BATCH_ROWS; r++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            batch_admitted[b][r] = (int64_t)((state >> 33) % (K + 1));
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            batch_accepted[b][r] = (int64_t)((state >> 33) % (uint64_t)(batch_admitted[b][r] + 1));
        }
    }
    /* refit_interval above the number of batches: one round, so interleaving cannot matter. */
    avc_estimator *serial = new_estimator(1000);
    for (int b = 0; b < BATCHES; b++) {
        OK(avc_estimator_observe(serial, batch_features[b], BATCH_ROWS, K, batch_admitted[b],
                                 BATCH_ROWS, batch_accepted[b], BATCH_ROWS, NULL, 0, NULL));
    }
    avc_estimator *shared = new_estimator(1000);
    pthread_t threads[THREADS];
    struct worker workers[THREADS];
    for (int t = 0; t < THREADS; t++) {
        workers[t] = (struct worker){shared, t, 0};
        CHECK(pthread_create(&threads[t], NULL, observe_batches, &workers[t]) == 0, "create");
    }
    for (int t = 0; t < THREADS; t++) {
        CHECK(pthread_join(threads[t], NULL) == 0, "join");
        CHECK(!workers[t].failed, "worker %d saw an error", t);
    }
    CHECK(same_state(serial, shared), "concurrent observe differs from serial");
    OK(avc_estimator_refit(serial));
    OK(avc_estimator_refit(shared));
    CHECK(same_state(serial, shared), "refit after concurrent observe differs from serial");
    OK(avc_estimator_free(serial));
    OK(avc_estimator_free(shared));
}

/* AV_CORE_SIMD: the documented levels pass, anything else is named. Run last and restored: the
 * kernels' level was fixed at their first call, so this changes nothing else in the program. */
static void test_environment(void) {
    const char *before = getenv("AV_CORE_SIMD");
    char saved[64] = "";
    if (before != NULL) {
        snprintf(saved, sizeof saved, "%s", before);
    }
    OK(avc_check_environment());
    setenv("AV_CORE_SIMD", " AVX2 ", 1);
    OK(avc_check_environment());
    setenv("AV_CORE_SIMD", "baseline", 1);
    OK(avc_check_environment());
    setenv("AV_CORE_SIMD", "sse2", 1);
    EXPECT(avc_check_environment(), AVC_ERR_VALUE, "avc_check_environment: AV_CORE_SIMD: \"sse2\"");
    setenv("AV_CORE_SIMD", "avx-2", 1);
    EXPECT(avc_check_environment(), AVC_ERR_VALUE, "\"avx-2\" is not a level");
    if (before != NULL) {
        setenv("AV_CORE_SIMD", saved, 1);
    } else {
        unsetenv("AV_CORE_SIMD");
    }
    OK(avc_check_environment());
}

/* The entry points a C engine needs besides the estimator and the planner: the feature from
 * raw logits under the sampler's settings, and cost tables as JSON text. */
static void test_engine_entry_points(void) {
    /* q = (0.4, 0.3, 0.2, 0.1): no truncation gives ln(0.4 / 0.6), top-p 0.5 ln(0.4 / 0.3). */
    const float logits[2 * 4] = {logf(0.4f), logf(0.3f), logf(0.2f), logf(0.1f),
                                 logf(0.2f), logf(0.4f), logf(0.1f), logf(0.3f)};
    const float temperature[2] = {1.0f, 1.0f};
    const int32_t top_k[2] = {0, 2};
    const float top_p[2] = {0.5f, 1.0f};
    float x[2] = {0.0f, 0.0f};
    OK(avc_draft_log_odds(logits, 2, 4, NULL, 0, NULL, 0, NULL, 0, 40.0f, x, 2));
    CHECK(fabsf(x[0] - logf(0.4f / 0.6f)) < 1e-5f && fabsf(x[1] - x[0]) < 1e-5f, "%g %g",
          (double)x[0], (double)x[1]);
    OK(avc_draft_log_odds(logits, 2, 4, temperature, 2, top_k, 2, top_p, 2, 40.0f, x, 2));
    CHECK(fabsf(x[0] - logf(4.0f / 3.0f)) < 1e-5f && fabsf(x[1] - x[0]) < 1e-5f, "%g %g",
          (double)x[0], (double)x[1]);

    float untouched[2] = {9.0f, 9.0f};
    const float bad_temperature[2] = {1.0f, NAN};
    const int32_t bad_top_k[2] = {0, -2};
    const float bad_top_p[2] = {0.0f, 1.0f};
    EXPECT(avc_draft_log_odds(logits, 2, 4, bad_temperature, 2, NULL, 0, NULL, 0, 40.0f,
                              untouched, 2),
           AVC_ERR_VALUE, "avc_draft_log_odds: temperature: [1] = NaN must be finite");
    EXPECT(avc_draft_log_odds(logits, 2, 4, NULL, 0, bad_top_k, 2, NULL, 0, 40.0f, untouched,
                              2),
           AVC_ERR_VALUE, "top_k: [1] = -2");
    EXPECT(avc_draft_log_odds(logits, 2, 4, NULL, 0, NULL, 0, bad_top_p, 2, 40.0f, untouched,
                              2),
           AVC_ERR_VALUE, "top_p: [0] = 0");
    EXPECT(avc_draft_log_odds(logits, 2, 4, temperature, 1, NULL, 0, NULL, 0, 40.0f, untouched,
                              2),
           AVC_ERR_VALUE, "temperature: must have one entry per row (2) or none, got 1");
    EXPECT(avc_draft_log_odds(logits, 2, 4, NULL, 0, NULL, 0, NULL, 0, 40.0f, untouched, 3),
           AVC_ERR_VALUE, "features_len: must equal num_rows = 2, got 3");
    EXPECT(avc_draft_log_odds(logits, 2, 0, NULL, 0, NULL, 0, NULL, 0, 40.0f, untouched, 2),
           AVC_ERR_VALUE, "vocab: must be at least 1");
    EXPECT(avc_draft_log_odds(NULL, 2, 4, NULL, 0, NULL, 0, NULL, 0, 40.0f, untouched, 2),
           AVC_ERR_NULL, "logits: is NULL");
    EXPECT(avc_draft_log_odds(logits, 2, 4, NULL, 0, NULL, 0, NULL, 0, -1.0f, untouched, 2),
           AVC_ERR_VALUE, "max_log_odds");
    CHECK(untouched[0] == 9.0f && untouched[1] == 9.0f, "a rejected call wrote its output");

    const char json[] = "{\"draft_ms\": [0.0, 34.0, 47.0], \"verify_ms\": [1.0, 36.0, 60.0]}";
    avc_cost_tables *tables = NULL;
    OK(avc_cost_tables_from_json(json, strlen(json), &tables));
    size_t len = 0;
    EXPECT(avc_cost_tables_to_json(tables, NULL, 0, &len), AVC_ERR_BUFFER_TOO_SMALL, "buf");
    CHECK(len == strlen(json) + 1, "to_json needs %zu bytes, expected %zu", len,
          strlen(json) + 1);
    char *text = malloc(len);
    if (text == NULL) {
        abort();
    }
    memset(text, 'x', len);
    EXPECT(avc_cost_tables_to_json(tables, text, len - 1, &len), AVC_ERR_BUFFER_TOO_SMALL,
           "the text needs");
    CHECK(text[0] == 'x', "a refused to_json wrote its buffer");
    OK(avc_cost_tables_to_json(tables, text, len, &len));
    CHECK(strcmp(text, json) == 0, "round trip: %s", text);
    free(text);
    OK(avc_cost_tables_free(tables));

    avc_cost_tables *refused = (avc_cost_tables *)&len;
    EXPECT(avc_cost_tables_from_json("{\"draft_ms\": [0]}", 17, &refused), AVC_ERR_VALUE,
           "avc_cost_tables_from_json: json: ");
    CHECK(refused == NULL, "a failed from_json left a handle");
    EXPECT(avc_cost_tables_from_json("{\"draft_ms\": [0], \"verify_ms\": [-1]}", 36, &refused),
           AVC_ERR_VALUE, "verify_ms: ");
    EXPECT(avc_cost_tables_from_json("not json", 8, &refused), AVC_ERR_VALUE, "json: ");
    EXPECT(avc_cost_tables_from_json(NULL, 4, &refused), AVC_ERR_NULL, "text: is NULL");
    EXPECT(avc_cost_tables_from_json(json, strlen(json), NULL), AVC_ERR_NULL, "tables_out");
    CHECK(refused == NULL, "a failed from_json left a handle");
}

int main(void) {
    test_estimator_arguments();
    test_map_update();
    test_config();
    test_save_load();
    test_planner_and_tables_save_load();
    test_handles();
    test_cost_tables();
    test_planner();
    test_draft_depth();
    test_misc();
    test_thread_local_errors();
    test_concurrent_observe();
    test_environment();
    test_engine_entry_points();
    printf("error_paths: %d checks, %d failures\n", checks, failures);
    return failures == 0 ? 0 : 1;
}
