/*
 * av_spec: av_core's adaptive speculative decoding inside llama.cpp, from C.
 *
 * R concurrent requests share one target and one drafter context (one sequence id per
 * request, kv_unified off). Each decode step:
 *
 *   1. depth   the policy decides how many positions each request drafts, before the drafter
 *              runs (AV+D: avc_planner_choose_draft_depth from the confidences the planner
 *              remembers; fixed K, AV, vLLM's AV and llama.cpp's: K; none: 0);
 *   2. draft   the drafter drafts in batched llama_decode calls, one per position; each draft
 *              token is sampled from q (the drafter's distribution under the sampling
 *              settings) and x = logit(q_max) comes from avc_draft_log_odds; llama.cpp's
 *              policy drafts its most likely token instead (q one-hot) and stops a request
 *              before a position whose top-10 confidence is below --p-min
 *              (common/speculative.cpp), dropping a draft shorter than --n-min;
 *   3. plan    the estimator predicts acceptance from x and the planner admits a prefix of
 *              each request's drafts (avc_estimator_predict, avc_planner_plan);
 *   4. verify  ONE target llama_decode verifies every admitted draft of every request;
 *   5. sample  exact speculative sampling: draft t accepted with probability min(1, p(t)/q(t));
 *              the first rejection samples from norm(max(0, p - q)); a request whose admitted
 *              drafts all pass gets a bonus token from p;
 *   6. rollback llama_memory_seq_rm drops the rejected positions from both models' caches;
 *   7. observe the estimator folds the verdicts in (avc_estimator_observe).
 *
 * Nothing that decides what to draft or verify reads a sampled token of the step it governs,
 * so the output has the target's law under every policy (docs/design.md, "Losslessness").
 * Prints tokens/s (wall and CPU), acceptance and tokens per target call.
 *
 * Build: examples/llama_cpp/build.sh. Usage: av_spec --help. See docs/c-api.md.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, strdup */

#include <errno.h>
#include <float.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "av_core.h"
#include "llama.h"

#define PROGRAM "av_spec"

/* ---------------------------------------------------------------- errors and options */

/* One line on stderr, then exit: `what` is "error: " and status 2 for bad input (a file, a
 * setting), "" and status 1 when a library call fails at run time. */
_Noreturn static void vexit(int status, const char *what, const char *format, va_list args) {
    fprintf(stderr, PROGRAM ": %s", what);
    vfprintf(stderr, format, args);
    fprintf(stderr, "\n");
    exit(status);
}

_Noreturn static void fail(const char *format, ...) {
    va_list args;
    va_start(args, format);
    vexit(2, "error: ", format, args);
}

_Noreturn static void die(const char *format, ...) {
    va_list args;
    va_start(args, format);
    vexit(1, "", format, args);
}

/* Calls an avc_* function; a failure is a bug in this program or the library. */
#define AVC(call)                                                                              \
    do {                                                                                       \
        avc_status status_ = (call);                                                           \
        if (status_ != AVC_OK) {                                                               \
            die("%s failed: %s", #call, avc_last_error());                                     \
        }                                                                                      \
    } while (0)

static void *checked_calloc(size_t count, size_t size) {
    void *memory = calloc(count == 0 ? 1 : count, size == 0 ? 1 : size);
    if (memory == NULL) {
        die("out of memory (%zu x %zu bytes)", count, size);
    }
    return memory;
}

enum policy { POLICY_AVD, POLICY_AV, POLICY_VLLM, POLICY_LLAMA, POLICY_FIXED, POLICY_NONE };
static const char *const POLICY_NAMES[] = {"avd", "av", "vllm", "llama", "fixed", "none"};
enum { N_POLICIES = sizeof POLICY_NAMES / sizeof POLICY_NAMES[0] };

typedef struct {
    const char *target;
    const char *drafter;
    const char *cost_tables;
    const char *prompt;
    int requests;
    int new_tokens;
    int threads;
    int k;
    int n_min;
    float p_min;
    int n_ctx;
    enum policy policy;
    avc_depth_mode depth_mode;
    uint64_t seed;
    float temperature;
    int top_k;
    float top_p;
    bool json;
    bool print_text;
    bool verbose;
} options;

static void usage(FILE *out) {
    fprintf(out,
            "usage: " PROGRAM " --target GGUF --drafter GGUF [options]\n"
            "\n"
            "Runs R concurrent requests through speculative decoding on llama.cpp, with av_core\n"
            "choosing the drafting depth and the drafts to verify, and prints tokens/s (wall and\n"
            "CPU), acceptance and tokens per target call.\n"
            "\n"
            "  --target GGUF         target model\n"
            "  --drafter GGUF        drafter model (same vocabulary)\n"
            "  --policy NAME         avd (av_core: depth + verification; default), av (fixed\n"
            "                        depth K, av_core's verification budget), vllm (av with\n"
            "                        vLLM's update and no exploration), llama (llama.cpp's\n"
            "                        draft policy: greedy drafts, n_max = K, --p-min, --n-min),\n"
            "                        fixed (depth K, verify all), none (no speculation)\n"
            "  --p-min P             llama: stop before a draft whose top-10 confidence < P\n"
            "                        (default 0, llama.cpp's; 0.75 was its earlier default)\n"
            "  --n-min N             llama: drop a draft shorter than N (default 0)\n"
            "  --requests R          concurrent requests (default 4)\n"
            "  --new-tokens N        tokens each request generates (default 64)\n"
            "  --k K                 deepest draft (default 4)\n"
            "  --depth-mode MODE     batch (one depth for all requests; default) or per-request\n"
            "  --threads T           llama.cpp threads (default 2)\n"
            "  --seed S              sampling seed (default 0)\n"
            "  --temperature T       sampling temperature, <= 0 greedy (default 1)\n"
            "  --top-k K             top-k, <= 0 off (default 0)\n"
            "  --top-p P             top-p in (0, 1], 1 off (default 1)\n"
            "  --cost-tables FILE    CostTables JSON (draft_ms, verify_ms[, draft_depth_ms]);\n"
            "                        default: built-in tables of the Qwen2.5-Coder 1.5B/0.5B pair\n"
            "                        on a 2-core CPU\n"
            "  --n-ctx N             total context (default: R x (prompt + new tokens + K + 1))\n"
            "  --prompt TEXT         one prompt for every request (default: built-in code prompts)\n"
            "  --json                print the results as one JSON object\n"
            "  --print-text          print each request's generated text\n"
            "  --verbose             show llama.cpp's log\n");
}

/* An integer option in [low, high]. */
static long parse_int(const char *name, const char *text, long low, long high) {
    char *end = NULL;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < low || value > high) {
        fail("%s: expected an integer in [%ld, %ld], got '%s'", name, low, high, text);
    }
    return value;
}

static float parse_float(const char *name, const char *text) {
    char *end = NULL;
    errno = 0;
    float value = strtof(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !isfinite(value)) {
        fail("%s: expected a finite number, got '%s'", name, text);
    }
    return value;
}

static options parse_options(int argc, char **argv) {
    options o = {.requests = 4, .new_tokens = 64, .threads = 2, .k = 4, .policy = POLICY_AVD,
                 .depth_mode = AVC_DEPTH_MODE_BATCH, .temperature = 1.0f, .top_p = 1.0f};
    static const struct option long_options[] = {
        {"target", required_argument, NULL, 't'},      {"drafter", required_argument, NULL, 'd'},
        {"policy", required_argument, NULL, 'P'},      {"requests", required_argument, NULL, 'R'},
        {"new-tokens", required_argument, NULL, 'n'},  {"k", required_argument, NULL, 'k'},
        {"depth-mode", required_argument, NULL, 'D'},  {"threads", required_argument, NULL, 'T'},
        {"seed", required_argument, NULL, 's'},        {"temperature", required_argument, NULL, 'm'},
        {"top-k", required_argument, NULL, 'K'},       {"top-p", required_argument, NULL, 'p'},
        {"cost-tables", required_argument, NULL, 'c'}, {"n-ctx", required_argument, NULL, 'C'},
        {"prompt", required_argument, NULL, 'x'},      {"json", no_argument, NULL, 'j'},
        {"p-min", required_argument, NULL, 'q'},       {"n-min", required_argument, NULL, 'N'},
        {"print-text", no_argument, NULL, 'w'},        {"verbose", no_argument, NULL, 'v'},
        {"help", no_argument, NULL, 'h'},              {NULL, 0, NULL, 0}};
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "", long_options, NULL)) != -1) {
        switch (c) {
        case 't': o.target = optarg; break;
        case 'd': o.drafter = optarg; break;
        case 'P': {
            size_t i = 0;
            while (i < N_POLICIES && strcmp(optarg, POLICY_NAMES[i]) != 0) {
                i++;
            }
            if (i == N_POLICIES) {
                fail("--policy: expected avd, av, vllm, llama, fixed or none, got '%s'", optarg);
            }
            o.policy = (enum policy)i;
            break;
        }
        case 'R': o.requests = (int)parse_int("--requests", optarg, 1, 256); break;
        case 'n': o.new_tokens = (int)parse_int("--new-tokens", optarg, 1, 1 << 20); break;
        case 'k': o.k = (int)parse_int("--k", optarg, 1, 16); break;
        case 'D':
            if (strcmp(optarg, "batch") == 0) {
                o.depth_mode = AVC_DEPTH_MODE_BATCH;
            } else if (strcmp(optarg, "per-request") == 0) {
                o.depth_mode = AVC_DEPTH_MODE_PER_REQUEST;
            } else {
                fail("--depth-mode: expected batch or per-request, got '%s'", optarg);
            }
            break;
        case 'T': o.threads = (int)parse_int("--threads", optarg, 1, 1024); break;
        case 's': o.seed = (uint64_t)parse_int("--seed", optarg, 0, INT64_MAX); break;
        case 'm': o.temperature = parse_float("--temperature", optarg); break;
        case 'K': o.top_k = (int)parse_int("--top-k", optarg, -1, INT32_MAX); break;
        case 'p':
            o.top_p = parse_float("--top-p", optarg);
            if (!(o.top_p > 0.0f && o.top_p <= 1.0f)) {
                fail("--top-p: expected a number in (0, 1], got '%s'", optarg);
            }
            break;
        case 'q':
            o.p_min = parse_float("--p-min", optarg);
            if (!(o.p_min >= 0.0f && o.p_min <= 1.0f)) {
                fail("--p-min: expected a number in [0, 1], got '%s'", optarg);
            }
            break;
        case 'N': o.n_min = (int)parse_int("--n-min", optarg, 0, 64); break;
        case 'c': o.cost_tables = optarg; break;
        case 'C': o.n_ctx = (int)parse_int("--n-ctx", optarg, 1, INT32_MAX); break;
        case 'x': o.prompt = optarg; break;
        case 'j': o.json = true; break;
        case 'w': o.print_text = true; break;
        case 'v': o.verbose = true; break;
        case 'h': usage(stdout); exit(0);
        default:
            fail("unknown or incomplete option '%s' (see --help)", argv[optind - 1]);
        }
    }
    if (optind < argc) {
        fail("unexpected argument '%s' (see --help)", argv[optind]);
    }
    if (o.target == NULL || o.drafter == NULL) {
        fail("%s is required (see --help)", o.target == NULL ? "--target" : "--drafter");
    }
    if (o.prompt != NULL && o.prompt[0] == '\0') {
        fail("--prompt: must not be empty");
    }
    return o;
}

/* ---------------------------------------------------------------- llama.cpp setup */

static bool verbose_log = false;

static void log_callback(enum ggml_log_level level, const char *text, void *user_data) {
    (void)level;
    (void)user_data;
    if (verbose_log) {
        fputs(text, stderr);
    }
}

/* Loads a GGUF model; a missing or unreadable file, or one llama.cpp refuses, is bad input. */
static struct llama_model *load_model(const char *option, const char *path) {
    FILE *file = fopen(path, "rb");
    if (file == NULL) {
        fail("%s %s: cannot open: %s", option, path, strerror(errno));
    }
    char magic[4] = {0};
    size_t got = fread(magic, 1, 4, file);
    fclose(file);
    if (got != 4 || memcmp(magic, "GGUF", 4) != 0) {
        fail("%s %s: not a GGUF file (no GGUF magic)", option, path);
    }
    struct llama_model_params params = llama_model_default_params();
    params.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(path, params);
    if (model == NULL) {
        fail("%s %s: llama.cpp cannot load this GGUF model (corrupt or unsupported; "
             "--verbose shows why)",
             option, path);
    }
    return model;
}

/* The drafter must share the target's vocabulary token for token: speculative sampling
 * compares p and q entry by entry. */
static void check_vocabularies(const options *o, const struct llama_vocab *target,
                               const struct llama_vocab *drafter) {
    int n_target = llama_vocab_n_tokens(target);
    int n_drafter = llama_vocab_n_tokens(drafter);
    if (n_target != n_drafter) {
        fail("--drafter %s: vocabulary of %d tokens, but --target %s has %d", o->drafter,
             n_drafter, o->target, n_target);
    }
    if (llama_vocab_type(target) != llama_vocab_type(drafter)) {
        fail("--drafter %s: tokenizer type differs from --target %s's", o->drafter, o->target);
    }
    for (int i = 0; i < n_target; i++) {
        const char *a = llama_vocab_get_text(target, i);
        const char *b = llama_vocab_get_text(drafter, i);
        if (strcmp(a == NULL ? "" : a, b == NULL ? "" : b) != 0) {
            fail("--drafter %s: token %d is '%s', but '%s' in --target %s", o->drafter, i,
                 b == NULL ? "" : b, a == NULL ? "" : a, o->target);
        }
    }
}

static struct llama_context *new_context(const char *option, const char *path,
                                         struct llama_model *model, const options *o,
                                         uint32_t n_ctx, uint32_t per_sequence) {
    struct llama_context_params params = llama_context_default_params();
    params.n_ctx = n_ctx;
    params.n_batch = n_ctx;
    params.n_ubatch = n_ctx < 512 ? n_ctx : 512;
    params.n_seq_max = (uint32_t)o->requests;
    params.n_threads = o->threads;
    params.n_threads_batch = o->threads;
    params.kv_unified = false; /* each request its own cells: n_ctx / R per sequence */
    params.no_perf = true;
    struct llama_context *ctx = llama_init_from_model(model, params);
    if (ctx == NULL) {
        fail("%s %s: llama.cpp cannot create a context of %u tokens for %d sequences "
             "(--n-ctx, --requests)",
             option, path, n_ctx, o->requests);
    }
    if (llama_n_ctx_seq(ctx) < per_sequence) {
        fail("--n-ctx: %u tokens give each of the %d requests %u cells, fewer than the %u it "
             "needs (prompt + new tokens + K + 1)",
             n_ctx, o->requests, llama_n_ctx_seq(ctx), per_sequence);
    }
    return ctx;
}

/* ---------------------------------------------------------------- cost tables */

/* Built-in tables: the Qwen2.5-Coder 1.5B target and 0.5B drafter (Q4_K_M) measured on a quiet
 * 2-core x86 CPU with 2 threads and a 200-token context. verify: one target decode of
 * t tokens; draft pass: one drafter decode of one token for each of r requests. The planner's
 * draft_ms[r] is the cost of drafting all K positions, K passes here. The drafter costs about
 * what the target does, so speculation rarely pays on this CPU: AV+D mostly drafts nothing.
 * Measure your own machine (`av-core profile`) and pass --cost-tables. */
static const avc_cost_point DEFAULT_DRAFT_PASS[] = {{1, 34.0}, {2, 47.0}, {4, 69.0}, {8, 120.0}};
static const avc_cost_point DEFAULT_VERIFY[] = {{1, 36.0},  {3, 91.0},   {5, 140.0},
                                                {8, 266.0}, {24, 448.0}, {40, 889.0}};

static char *read_file(const char *option, const char *path, size_t *len) {
    FILE *file = fopen(path, "rb");
    if (file == NULL) {
        fail("%s %s: cannot open: %s", option, path, strerror(errno));
    }
    size_t cap = 4096, n = 0;
    char *text = checked_calloc(cap, 1);
    size_t got;
    while ((got = fread(text + n, 1, cap - n, file)) > 0) {
        n += got;
        if (n == cap) {
            cap *= 2;
            char *grown = realloc(text, cap);
            if (grown == NULL) {
                die("out of memory reading %s", path);
            }
            text = grown;
        }
    }
    bool error = ferror(file) != 0;
    fclose(file);
    if (error) {
        fail("%s %s: read error", option, path);
    }
    *len = n;
    return text;
}

/* Just enough JSON to find one member's value in a file: the text of the value is handed to
 * avc_cost_tables_from_json, which parses and validates it. Each function takes a pointer into
 * [s, end) and returns the position after what it skipped, or NULL on malformed text. */
static const char *skip_space(const char *s, const char *end) {
    while (s < end && (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')) {
        s++;
    }
    return s;
}

static const char *skip_string(const char *s, const char *end) {
    for (s++; s < end; s++) {
        if (*s == '"') {
            return s + 1;
        }
        if (*s == '\\' && ++s == end) { /* an escape: the loop skips the escaped character */
            return NULL;
        }
    }
    return NULL;
}

static const char *skip_value(const char *s, const char *end) {
    s = skip_space(s, end);
    if (s == end) {
        return NULL;
    }
    if (*s == '"') {
        return skip_string(s, end);
    }
    if (*s != '{' && *s != '[') { /* number, true, false, null */
        while (s < end && strchr(",}] \t\r\n", *s) == NULL) {
            s++;
        }
        return s;
    }
    char close = *s == '{' ? '}' : ']';
    s = skip_space(s + 1, end);
    if (s < end && *s == close) {
        return s + 1;
    }
    for (;;) {
        if (close == '}') {
            s = skip_space(s, end);
            if (s == end || *s != '"' || (s = skip_string(s, end)) == NULL) {
                return NULL;
            }
            s = skip_space(s, end);
            if (s == end || *s++ != ':') {
                return NULL;
            }
        }
        if ((s = skip_value(s, end)) == NULL) {
            return NULL;
        }
        s = skip_space(s, end);
        if (s < end && *s == ',') {
            s++;
        } else if (s < end && *s == close) {
            return s + 1;
        } else {
            return NULL;
        }
    }
}

/* The value of member `key` of the object at s (*value_end set after it), or NULL. */
static const char *member(const char *s, const char *end, const char *key,
                          const char **value_end) {
    s = skip_space(s, end);
    if (s == end || *s != '{') {
        return NULL;
    }
    s = skip_space(s + 1, end);
    size_t key_len = strlen(key);
    while (s < end && *s == '"') {
        const char *name = s + 1, *after = skip_string(s, end);
        if (after == NULL) {
            return NULL;
        }
        bool match = (size_t)(after - 1 - name) == key_len && memcmp(name, key, key_len) == 0;
        s = skip_space(after, end);
        if (s == end || *s++ != ':') {
            return NULL;
        }
        const char *value = skip_space(s, end);
        if ((s = skip_value(value, end)) == NULL) {
            return NULL;
        }
        if (match) {
            *value_end = s;
            return value;
        }
        s = skip_space(s, end);
        if (s < end && *s == ',') {
            s = skip_space(s + 1, end);
        }
    }
    return NULL;
}

/* The planner's CostTables JSON in a --cost-tables file: the whole file (CostTables.to_json()),
 * or, in the file `av-core profile --engine llama.cpp` writes, concurrency["R"].cost_tables. */
static avc_cost_tables *tables_from_file(const options *o) {
    size_t len = 0;
    char *text = read_file("--cost-tables", o->cost_tables, &len);
    const char *start = text, *end = text + len, *value_end = NULL;
    const char *per_r = member(text, end, "concurrency", &value_end);
    if (per_r != NULL) {
        char key[16];
        snprintf(key, sizeof key, "%d", o->requests);
        const char *entry = member(per_r, value_end, key, &value_end);
        if (entry == NULL) {
            fail("--cost-tables %s: has no profile at R = %d (profile that concurrency)",
                 o->cost_tables, o->requests);
        }
        start = member(entry, value_end, "cost_tables", &end);
        if (start == NULL) {
            fail("--cost-tables %s: concurrency \"%d\" has no cost_tables", o->cost_tables,
                 o->requests);
        }
    }
    avc_cost_tables *tables = NULL;
    if (avc_cost_tables_from_json(start, (size_t)(end - start), &tables) != AVC_OK) {
        fail("--cost-tables %s: %s", o->cost_tables, avc_last_error());
    }
    free(text);
    return tables;
}

/* Tables covering R requests and R * (K + 1) target tokens, with a depth table over K. */
static avc_cost_tables *cost_tables(const options *o) {
    size_t max_tokens = (size_t)o->requests * (size_t)(o->k + 1);
    avc_cost_tables *base = NULL;
    if (o->cost_tables == NULL) {
        avc_cost_point draft[4];
        for (int i = 0; i < 4; i++) {
            draft[i] = (avc_cost_point){DEFAULT_DRAFT_PASS[i].size, DEFAULT_DRAFT_PASS[i].ms * o->k};
        }
        AVC(avc_cost_tables_from_curves(draft, 4, DEFAULT_VERIFY, 6, (size_t)o->requests,
                                        max_tokens, 0, &base));
    } else {
        base = tables_from_file(o);
        size_t max_reqs = 0, max_batch_tokens = 0;
        AVC(avc_cost_tables_sizes(base, &max_reqs, &max_batch_tokens));
        if (max_reqs < (size_t)o->requests || max_batch_tokens < max_tokens) {
            fail("--cost-tables %s: covers %zu requests and %zu tokens; R = %d with K = %d needs "
                 "%d and %zu",
                 o->cost_tables, max_reqs, max_batch_tokens, o->requests, o->k, o->requests,
                 max_tokens);
        }
    }
    size_t depth_len = 0; /* the size query: 0 without a depth table, else K + 1 */
    avc_status status = avc_cost_tables_draft_depth(base, NULL, 0, &depth_len);
    if (status != AVC_OK && status != AVC_ERR_BUFFER_TOO_SMALL) {
        die("avc_cost_tables_draft_depth failed: %s", avc_last_error());
    }
    if (depth_len != 0 && depth_len != (size_t)o->k + 1) {
        fail("--cost-tables %s: its draft_depth_ms covers depth %zu, but --k is %d",
             o->cost_tables, depth_len - 1, o->k);
    }
    if (depth_len != 0) {
        return base;
    }
    /* No depth table: the drafter is autoregressive, one pass per drafted position. */
    avc_cost_tables *tables = NULL;
    AVC(avc_cost_tables_with_drafter(base, AVC_DRAFTER_KIND_AUTOREGRESSIVE, (size_t)o->k,
                                     &tables));
    AVC(avc_cost_tables_free(base));
    return tables;
}

/* ---------------------------------------------------------------- sampling */

/* splitmix64: one independent stream per request, so a request's tokens do not depend on
 * which other requests share its batch. */
static uint64_t next_u64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double uniform(uint64_t *state) { return (double)(next_u64(state) >> 11) * 0x1.0p-53; }

/* An index drawn with probability w[i] / sum(w) from the non-negative weights w[0..n). */
static int draw(const float *w, int n, uint64_t *rng) {
    double total = 0.0;
    for (int i = 0; i < n; i++) {
        total += w[i];
    }
    double u = uniform(rng) * total, acc = 0.0;
    int last = 0;
    for (int i = 0; i < n; i++) {
        if (w[i] > 0.0f) {
            acc += w[i];
            last = i;
            if (u < acc) {
                return i;
            }
        }
    }
    return last; /* u landed on the rounding of the last sum: the last positive weight */
}

typedef struct {
    float value;
    int index;
} entry;

static int by_value_descending(const void *a, const void *b) {
    const entry *x = a, *y = b;
    if (x->value != y->value) {
        return x->value > y->value ? -1 : 1;
    }
    return x->index - y->index;
}

typedef struct {
    float temperature;
    int top_k;
    float top_p;
    entry *scratch; /* n_vocab entries */
} sampler;

/* The distribution a row of logits is sampled from, normalized into out[0..n): softmax(z / T)
 * (one-hot on the first maximum when T <= 0), top-k, then top-p on the renormalized top-k
 * (the smallest descending prefix holding at least p): the rule avc_draft_log_odds computes
 * its feature under. The sort is the slow path; with top-k and top-p off it is skipped. */
static void distribution(const float *z, int n, const sampler *s, float *out) {
    int best = 0;
    for (int i = 1; i < n; i++) {
        if (z[i] > z[best]) {
            best = i;
        }
    }
    if (s->temperature <= 0.0f) {
        memset(out, 0, sizeof(float) * (size_t)n);
        out[best] = 1.0f;
        return;
    }
    double total = 0.0;
    for (int i = 0; i < n; i++) {
        out[i] = expf((z[i] - z[best]) / s->temperature);
        total += out[i];
    }
    bool top_k = s->top_k > 0 && s->top_k < n;
    if (top_k || s->top_p < 1.0f) {
        for (int i = 0; i < n; i++) {
            s->scratch[i] = (entry){out[i], i};
        }
        qsort(s->scratch, (size_t)n, sizeof(entry), by_value_descending);
        int kept = top_k ? s->top_k : n;
        double mass = 0.0;
        for (int j = 0; j < kept; j++) {
            mass += s->scratch[j].value;
        }
        if (s->top_p < 1.0f) {
            double before = 0.0;
            int j = 0;
            while (j < kept && (j == 0 || before < (double)s->top_p * mass)) {
                before += s->scratch[j].value;
                j++;
            }
            kept = j;
        }
        total = 0.0;
        for (int j = kept; j < n; j++) {
            out[s->scratch[j].index] = 0.0f;
        }
        for (int j = 0; j < kept; j++) {
            total += s->scratch[j].value;
        }
    }
    float scale = (float)(1.0 / total);
    for (int i = 0; i < n; i++) {
        out[i] *= scale;
    }
}

/* llama.cpp's draft confidence (common/speculative.cpp, draft-simple): its draft sampler keeps
 * the 10 largest logits (top-k 10, then dist) and drafts the first candidate, the most likely
 * token (*best, the first maximum); the confidence it compares with p_min is that candidate's
 * share of a softmax over the 10, temperature playing no part. */
static float top10_confidence(const float *z, int n, int *best) {
    float top[10];
    int kept = 0;
    *best = 0;
    for (int i = 0; i < n; i++) {
        if (z[i] > z[*best]) {
            *best = i;
        }
        if (kept < 10 || z[i] > top[kept - 1]) {
            int j = kept < 10 ? kept++ : 9;
            while (j > 0 && top[j - 1] < z[i]) {
                top[j] = top[j - 1];
                j--;
            }
            top[j] = z[i];
        }
    }
    double total = 0.0;
    for (int j = 0; j < kept; j++) {
        total += exp((double)top[j] - (double)top[0]);
    }
    return (float)(1.0 / total);
}

/* ---------------------------------------------------------------- the requests */

static const char *const DEFAULT_PROMPTS[] = {
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "import numpy as np\n\n\ndef normalize(x):\n    \"\"\"Scale x to unit norm.\"\"\"\n",
    "class Stack:\n    \"\"\"A last-in, first-out stack.\"\"\"\n\n    def __init__(self):\n",
    "def is_prime(n: int) -> bool:\n    \"\"\"Return True if n is a prime number.\"\"\"\n",
    "def sort_by_key(items, key):\n    \"\"\"Sort a list of dicts by the given key.\"\"\"\n",
    "def read_lines(path):\n    \"\"\"Return the lines of a text file without newlines.\"\"\"\n",
    "def flatten(nested):\n    \"\"\"Flatten a list of lists into one list.\"\"\"\n",
    "def word_count(text):\n    \"\"\"Count how often each word occurs in text.\"\"\"\n",
};
enum { N_DEFAULT_PROMPTS = sizeof DEFAULT_PROMPTS / sizeof DEFAULT_PROMPTS[0] };

typedef struct {
    llama_token *tokens; /* prompt, then every emitted token */
    int n_tokens;        /* the target's cache holds tokens[0 .. n_tokens - 1) */
    int n_prompt;
    int n_drafter;       /* the drafter's cache holds tokens[0 .. n_drafter) */
    int emitted;
    uint64_t rng;
} request;

/* Appends one token to a batch, on sequence `seq`, with or without its logits. */
static void batch_add(struct llama_batch *batch, llama_token token, llama_pos pos,
                      llama_seq_id seq, bool logits) {
    int i = batch->n_tokens++;
    batch->token[i] = token;
    batch->pos[i] = pos;
    batch->n_seq_id[i] = 1;
    batch->seq_id[i][0] = seq;
    batch->logits[i] = (int8_t)logits;
}

static void decode(struct llama_context *ctx, struct llama_batch batch, const char *which) {
    if (batch.n_tokens == 0) {
        return;
    }
    int32_t status = llama_decode(ctx, batch);
    if (status != 0) {
        die("llama_decode failed on the %s (status %d, %d tokens)", which, status,
            batch.n_tokens);
    }
}

static double seconds(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---------------------------------------------------------------- main */

typedef struct {
    long steps, target_calls, drafter_calls, verifies, drafted, admitted, accepted, emitted;
    double wall_s, cpu_s, av_core_s;
} totals;

int main(int argc, char **argv) {
    options o = parse_options(argc, argv);
    verbose_log = o.verbose;
    if (avc_abi_version() != AVC_ABI_VERSION) {
        die("libav_core_capi has ABI %u, this program was built for %u", avc_abi_version(),
            AVC_ABI_VERSION);
    }
    if (avc_check_environment() != AVC_OK) {
        fail("%s", avc_last_error());
    }

    const int R = o.requests, K = o.k;
    const bool speculate = o.policy != POLICY_NONE;
    const bool adaptive = o.policy == POLICY_AVD || o.policy == POLICY_AV || o.policy == POLICY_VLLM;
    const bool greedy = o.policy == POLICY_LLAMA;

    /* The cost tables first: a bad file fails before the models load. */
    avc_cost_tables *tables = cost_tables(&o);
    llama_log_set(log_callback, NULL);
    llama_backend_init();

    /* Models, vocabulary, prompts. */
    struct llama_model *target_model = load_model("--target", o.target);
    struct llama_model *drafter_model = load_model("--drafter", o.drafter);
    const struct llama_vocab *vocab = llama_model_get_vocab(target_model);
    check_vocabularies(&o, vocab, llama_model_get_vocab(drafter_model));
    const int V = llama_vocab_n_tokens(vocab);

    request *requests = checked_calloc((size_t)R, sizeof(request));
    int longest_prompt = 0;
    for (int r = 0; r < R; r++) {
        const char *text = o.prompt != NULL ? o.prompt : DEFAULT_PROMPTS[r % N_DEFAULT_PROMPTS];
        int32_t len = (int32_t)strlen(text);
        int32_t n = -llama_tokenize(vocab, text, len, NULL, 0, true, false);
        if (n <= 0) {
            fail("--prompt: the target's tokenizer gives no tokens for '%s'", text);
        }
        requests[r].tokens = checked_calloc((size_t)(n + o.new_tokens), sizeof(llama_token));
        if (llama_tokenize(vocab, text, len, requests[r].tokens, n, true, false) != n) {
            die("llama_tokenize disagreed with itself on '%s'", text);
        }
        requests[r].n_prompt = requests[r].n_tokens = n;
        requests[r].n_drafter = n - 1;
        requests[r].rng = o.seed * 0x9e3779b97f4a7c15ULL + (uint64_t)r;
        longest_prompt = n > longest_prompt ? n : longest_prompt;
    }

    /* Contexts: each request needs its prompt, its new tokens and one verify block beyond. */
    uint32_t per_sequence = (uint32_t)(longest_prompt + o.new_tokens + K + 1);
    uint64_t needed = (uint64_t)R * per_sequence;
    if (o.n_ctx != 0 && (uint64_t)o.n_ctx < needed) {
        fail("--n-ctx: %d is too small for R x (prompt + new tokens + K + 1) = %d x %u = %llu",
             o.n_ctx, R, per_sequence, (unsigned long long)needed);
    }
    if (needed > INT32_MAX) {
        fail("--new-tokens: R x (prompt + new tokens + K + 1) = %llu tokens do not fit a context",
             (unsigned long long)needed);
    }
    uint32_t n_ctx = o.n_ctx != 0 ? (uint32_t)o.n_ctx : (uint32_t)needed;
    struct llama_context *target =
        new_context("--target", o.target, target_model, &o, n_ctx, per_sequence);
    struct llama_context *drafter =
        new_context("--drafter", o.drafter, drafter_model, &o, n_ctx, per_sequence);
    llama_memory_t target_memory = llama_get_memory(target);
    llama_memory_t drafter_memory = llama_get_memory(drafter);

    /* av_core: an estimator over K positions and a planner with one slot per request. */
    avc_estimator *estimator = NULL;
    avc_planner *planner = NULL;
    avc_estimator_config config;
    AVC(avc_estimator_config_default((size_t)K, &config));
    avc_estimator_update update;
    AVC(avc_estimator_update_default(&update));
    if (o.policy == POLICY_VLLM) { /* vLLM's memoryless, unbounded update */
        update.update = AVC_UPDATE_VLLM;
        config.memory = 0.0;
        config.max_step = config.max_slope = config.max_intercept = INFINITY;
    }
    AVC(avc_estimator_new_with_update(&config, &update, &estimator));
    AVC(avc_planner_new(tables, (size_t)R, (size_t)K, AVC_BUDGET_SOURCE_PREVIOUS, &planner));
    if (o.policy == POLICY_VLLM) { /* vLLM verifies by the budget alone: no exploration */
        AVC(avc_planner_set_exploration(planner, 0.0, 0));
    }
    AVC(avc_cost_tables_free(tables));
    for (int r = 0; r < R; r++) {
        AVC(avc_planner_add_request(planner, (size_t)r));
    }

    /* Per-step buffers, over the active requests (row i is request active[i]). */
    struct llama_batch batch = llama_batch_init((int32_t)n_ctx, 0, 1);
    int *active = checked_calloc((size_t)R, sizeof(int));
    int64_t *slots = checked_calloc((size_t)R, sizeof(int64_t));
    int64_t *max_depths = checked_calloc((size_t)R, sizeof(int64_t));
    int32_t *depths = checked_calloc((size_t)R, sizeof(int32_t));
    int64_t *scheduled = checked_calloc((size_t)R, sizeof(int64_t));
    int32_t *admitted = checked_calloc((size_t)R, sizeof(int32_t));
    int64_t *admitted64 = checked_calloc((size_t)R, sizeof(int64_t));
    int64_t *accepted64 = checked_calloc((size_t)R, sizeof(int64_t));
    int *logit_index = checked_calloc((size_t)R, sizeof(int));
    int *made = checked_calloc((size_t)R, sizeof(int));    /* drafts made this step */
    int *passes = checked_calloc((size_t)R, sizeof(int));  /* drafter passes taken */
    bool *stopped = checked_calloc((size_t)R, sizeof(bool));
    llama_token *drafts = checked_calloc((size_t)R * (size_t)K, sizeof(llama_token));
    float *x = checked_calloc((size_t)R * (size_t)K, sizeof(float));
    float *confidence = checked_calloc((size_t)R * (size_t)K, sizeof(float));
    float *q = checked_calloc((size_t)R * (size_t)K * (size_t)V, sizeof(float));
    float *p = checked_calloc((size_t)V, sizeof(float));
    float *residual = checked_calloc((size_t)V, sizeof(float));
    sampler sampling = {o.temperature, o.top_k, o.top_p, checked_calloc((size_t)V, sizeof(entry))};
    const float max_log_odds = (float)config.max_log_odds;

    /* Prefill both caches with every prompt token but the last (the first verify feeds it). */
    batch.n_tokens = 0;
    for (int r = 0; r < R; r++) {
        for (int i = 0; i < requests[r].n_prompt - 1; i++) {
            batch_add(&batch, requests[r].tokens[i], i, r, false);
        }
    }
    decode(target, batch, "target (prefill)");
    if (speculate) {
        decode(drafter, batch, "drafter (prefill)");
    }

    totals t = {0};
    const double wall0 = seconds(CLOCK_MONOTONIC), cpu0 = seconds(CLOCK_PROCESS_CPUTIME_ID);
    for (;;) {
        int n_active = 0;
        for (int r = 0; r < R; r++) {
            if (requests[r].emitted < o.new_tokens) {
                active[n_active] = r;
                slots[n_active] = r;
                /* A verify emits up to depth + 1 tokens: never draft past the request's end. */
                int room = o.new_tokens - requests[r].emitted - 1;
                max_depths[n_active] = room < K ? room : K;
                n_active++;
            }
        }
        if (n_active == 0) {
            break;
        }
        const avc_step_tokens step = {(size_t)n_active, (size_t)n_active, SIZE_MAX};
        t.steps++;

        /* 1. Depth, before the drafter runs. */
        double av0 = seconds(CLOCK_MONOTONIC);
        if (o.policy == POLICY_AVD) {
            avc_depth_plan depth_plan;
            AVC(avc_planner_choose_draft_depth(planner, slots, (size_t)n_active, max_depths,
                                               (size_t)n_active, &step, o.depth_mode, depths,
                                               (size_t)n_active, &depth_plan));
        } else {
            for (int i = 0; i < n_active; i++) {
                depths[i] = speculate ? (int32_t)max_depths[i] : 0;
            }
        }
        t.av_core_s += seconds(CLOCK_MONOTONIC) - av0;
        int deepest = 0;
        for (int i = 0; i < n_active; i++) {
            deepest = depths[i] > deepest ? depths[i] : deepest;
            made[i] = passes[i] = 0;
            stopped[i] = false;
        }

        /* 2. Draft: pass j feeds each request still drafting at position j one token (pass 0
         * also the tokens its cache missed) and draws draft j: a sample from q, or llama.cpp's
         * most likely token unless its confidence stops the request. */
        memset(x, 0, sizeof(float) * (size_t)n_active * (size_t)K);
        for (int j = 0; j < deepest; j++) {
            batch.n_tokens = 0;
            for (int i = 0; i < n_active; i++) {
                request *rq = &requests[active[i]];
                if (depths[i] <= j || stopped[i]) {
                    continue;
                }
                passes[i]++;
                if (j == 0) {
                    for (int pos = rq->n_drafter; pos < rq->n_tokens; pos++) {
                        batch_add(&batch, rq->tokens[pos], pos, active[i],
                                  pos == rq->n_tokens - 1);
                    }
                } else {
                    batch_add(&batch, drafts[i * K + j - 1], rq->n_tokens - 1 + j, active[i],
                              true);
                }
                logit_index[i] = batch.n_tokens - 1;
            }
            if (batch.n_tokens == 0) { /* every request stopped (llama.cpp's p_min) */
                break;
            }
            decode(drafter, batch, "drafter");
            t.drafter_calls++;
            for (int i = 0; i < n_active; i++) {
                if (depths[i] <= j || stopped[i]) {
                    continue;
                }
                const float *logits = llama_get_logits_ith(drafter, logit_index[i]);
                if (logits == NULL) {
                    die("llama_get_logits_ith returned NULL (drafter, index %d)", logit_index[i]);
                }
                float *qi = q + ((size_t)i * (size_t)K + (size_t)j) * (size_t)V;
                if (greedy) {
                    int best = 0;
                    if (top10_confidence(logits, V, &best) < o.p_min) {
                        stopped[i] = true; /* common/speculative.cpp: cur_p->data[0].p < p_min */
                        continue;
                    }
                    memset(qi, 0, sizeof(float) * (size_t)V);
                    qi[best] = 1.0f;
                    drafts[i * K + j] = best;
                } else {
                    distribution(logits, V, &sampling, qi);
                    drafts[i * K + j] = draw(qi, V, &requests[active[i]].rng);
                }
                made[i]++;
                av0 = seconds(CLOCK_MONOTONIC);
                AVC(avc_draft_log_odds(logits, 1, (size_t)V, &o.temperature, 1, &o.top_k, 1,
                                       &o.top_p, 1, max_log_odds, &x[i * K + j], 1));
                t.av_core_s += seconds(CLOCK_MONOTONIC) - av0;
            }
        }
        for (int i = 0; i < n_active; i++) {
            if (greedy && made[i] < o.n_min) { /* llama.cpp drops a draft shorter than n_min */
                made[i] = 0;
                memset(x + (size_t)i * (size_t)K, 0, sizeof(float) * (size_t)K);
            }
            scheduled[i] = made[i];
            t.drafted += made[i];
        }

        /* 3. Predict and plan: which prefix of each request's drafts to verify. */
        av0 = seconds(CLOCK_MONOTONIC);
        if (adaptive) {
            avc_verification_plan plan;
            AVC(avc_estimator_predict(estimator, x, (size_t)n_active, (size_t)K, confidence,
                                      (size_t)n_active * (size_t)K));
            AVC(avc_planner_plan(planner, slots, (size_t)n_active, confidence, (size_t)n_active,
                                 (size_t)K, scheduled, (size_t)n_active, &step, admitted,
                                 (size_t)n_active, &plan));
        } else {
            for (int i = 0; i < n_active; i++) {
                admitted[i] = made[i];
            }
        }
        t.av_core_s += seconds(CLOCK_MONOTONIC) - av0;

        /* 4. One target decode verifies every request's last token and admitted drafts. */
        batch.n_tokens = 0;
        for (int i = 0; i < n_active; i++) {
            request *rq = &requests[active[i]];
            logit_index[i] = batch.n_tokens;
            batch_add(&batch, rq->tokens[rq->n_tokens - 1], rq->n_tokens - 1, active[i], true);
            for (int j = 0; j < admitted[i]; j++) {
                batch_add(&batch, drafts[i * K + j], rq->n_tokens + j, active[i], true);
            }
        }
        decode(target, batch, "target");
        t.target_calls++;

        /* 5-6. Speculative sampling per request, then roll both caches back. */
        for (int i = 0; i < n_active; i++) {
            request *rq = &requests[active[i]];
            int accepted = 0;
            llama_token next = -1;
            for (int j = 0; j <= admitted[i]; j++) {
                const float *logits = llama_get_logits_ith(target, logit_index[i] + j);
                if (logits == NULL) {
                    die("llama_get_logits_ith returned NULL (target, index %d)",
                        logit_index[i] + j);
                }
                distribution(logits, V, &sampling, p);
                if (j == admitted[i]) { /* every admitted draft passed: the bonus token */
                    next = draw(p, V, &rq->rng);
                    break;
                }
                const float *qj = q + ((size_t)i * (size_t)K + (size_t)j) * (size_t)V;
                llama_token d = drafts[i * K + j];
                if (uniform(&rq->rng) * qj[d] < p[d]) { /* u < p / q, without dividing */
                    accepted++;
                    continue;
                }
                bool any = false;
                for (int v = 0; v < V; v++) {
                    residual[v] = p[v] > qj[v] ? p[v] - qj[v] : 0.0f;
                    any = any || residual[v] > 0.0f;
                }
                /* A rejection implies p(v) > q(v) somewhere; only rounding can leave none. */
                next = draw(any ? residual : p, V, &rq->rng);
                break;
            }
            /* Keep last + the accepted drafts; drop what the rejected positions left. */
            int base = rq->n_tokens; /* position of the first draft */
            for (int j = 0; j < accepted; j++) {
                rq->tokens[rq->n_tokens++] = drafts[i * K + j];
            }
            rq->tokens[rq->n_tokens++] = next;
            rq->emitted += accepted + 1;
            if (!llama_memory_seq_rm(target_memory, active[i], base + accepted, -1)) {
                die("llama_memory_seq_rm failed (target, sequence %d)", active[i]);
            }
            if (passes[i] > 0) {
                /* The drafter fed last and one draft per later pass; keep the accepted ones. */
                int fed = passes[i] - 1;
                int keep = accepted < fed ? accepted : fed;
                if (!llama_memory_seq_rm(drafter_memory, active[i], base + keep, -1)) {
                    die("llama_memory_seq_rm failed (drafter, sequence %d)", active[i]);
                }
                rq->n_drafter = base + keep;
            }
            admitted64[i] = admitted[i];
            accepted64[i] = accepted;
            t.verifies++;
            t.admitted += admitted[i];
            t.accepted += accepted;
            t.emitted += accepted + 1;
        }

        /* 7. Observe the verdicts. */
        if (adaptive) {
            av0 = seconds(CLOCK_MONOTONIC);
            AVC(avc_estimator_observe(estimator, x, (size_t)n_active, (size_t)K, admitted64,
                                      (size_t)n_active, accepted64, (size_t)n_active, confidence,
                                      (size_t)n_active * (size_t)K, NULL));
            t.av_core_s += seconds(CLOCK_MONOTONIC) - av0;
        }
    }
    t.wall_s = seconds(CLOCK_MONOTONIC) - wall0;
    t.cpu_s = seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu0;

    /* Report. */
    double acceptance = t.admitted > 0 ? (double)t.accepted / (double)t.admitted : 0.0;
    double per_call = t.target_calls > 0 ? (double)t.emitted / (double)t.target_calls : 0.0;
    double av_ms = t.steps > 0 ? 1e3 * t.av_core_s / (double)t.steps : 0.0;
    if (o.json) {
        printf("{\"policy\": \"%s\", \"requests\": %d, \"new_tokens\": %d, \"k\": %d, "
               "\"threads\": %d, \"seed\": %llu, \"steps\": %ld, \"target_calls\": %ld, "
               "\"drafter_calls\": %ld, \"verifies\": %ld, \"drafted\": %ld, \"admitted\": %ld, "
               "\"accepted\": %ld, \"emitted\": %ld, \"wall_s\": %.6f, \"cpu_s\": %.6f, "
               "\"tokens_per_s\": %.4f, \"tokens_per_s_cpu\": %.4f, \"acceptance\": %.6f, "
               "\"tokens_per_target_call\": %.6f, \"av_core_ms_per_step\": %.6f, ",
               POLICY_NAMES[o.policy], R, o.new_tokens, K, o.threads,
               (unsigned long long)o.seed, t.steps, t.target_calls, t.drafter_calls, t.verifies,
               t.drafted, t.admitted, t.accepted, t.emitted, t.wall_s, t.cpu_s,
               (double)t.emitted / t.wall_s, (double)t.emitted / t.cpu_s, acceptance, per_call,
               av_ms);
        /* The generated token ids of every request, for checks of the emitted law. */
        printf("\"generated\": [");
        for (int r = 0; r < R; r++) {
            printf(r == 0 ? "[" : ", [");
            for (int i = requests[r].n_prompt; i < requests[r].n_tokens; i++) {
                printf(i == requests[r].n_prompt ? "%d" : ", %d", requests[r].tokens[i]);
            }
            printf("]");
        }
        printf("]}\n");
    } else {
        printf("policy %s, R = %d, %d new tokens each, K = %d, %d threads, seed %llu\n",
               POLICY_NAMES[o.policy], R, o.new_tokens, K, o.threads,
               (unsigned long long)o.seed);
        printf("tokens/s        %10.2f wall   %10.2f CPU\n", (double)t.emitted / t.wall_s,
               (double)t.emitted / t.cpu_s);
        printf("acceptance      %10.4f (%ld of %ld verified drafts; %ld drafted)\n", acceptance,
               t.accepted, t.admitted, t.drafted);
        printf("tokens/target call %7.3f (%ld tokens, %ld target calls, %ld drafter calls)\n",
               per_call, t.emitted, t.target_calls, t.drafter_calls);
        printf("emitted = accepted + verifies: %ld = %ld + %ld\n", t.emitted, t.accepted,
               t.verifies);
        printf("av_core host time %8.3f ms per step (%ld steps)\n", av_ms, t.steps);
    }
    if (o.print_text) {
        for (int r = 0; r < R; r++) {
            fprintf(o.json ? stderr : stdout, "--- request %d\n", r);
            for (int i = requests[r].n_prompt; i < requests[r].n_tokens; i++) {
                char piece[256];
                int32_t n = llama_token_to_piece(vocab, requests[r].tokens[i], piece,
                                                 (int32_t)sizeof piece, 0, false);
                if (n > 0) {
                    fwrite(piece, 1, (size_t)n, o.json ? stderr : stdout);
                }
            }
            fputc('\n', o.json ? stderr : stdout);
        }
    }

    /* Cleanup. */
    for (int r = 0; r < R; r++) {
        free(requests[r].tokens);
    }
    free(requests);
    free(active);
    free(slots);
    free(max_depths);
    free(depths);
    free(scheduled);
    free(admitted);
    free(admitted64);
    free(accepted64);
    free(logit_index);
    free(made);
    free(passes);
    free(stopped);
    free(drafts);
    free(x);
    free(confidence);
    free(q);
    free(p);
    free(residual);
    free(sampling.scratch);
    llama_batch_free(batch);
    AVC(avc_planner_free(planner));
    AVC(avc_estimator_free(estimator));
    llama_free(target);
    llama_free(drafter);
    llama_model_free(target_model);
    llama_model_free(drafter_model);
    llama_backend_free();
    return 0;
}
