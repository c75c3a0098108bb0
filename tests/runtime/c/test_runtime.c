/* test_runtime.c - C unit tests of the PTO runtime (runtime_c/).
 *
 * tests/runtime/test_runtime_c.py compiles this with the runtime's C files under AddressSanitizer +
 * UndefinedBehaviorSanitizer (leak checking on) and runs it; any failed check or sanitizer
 * report fails that test. Usage: test_runtime TMPDIR (for the dump file).
 *
 * Checks print file:line and keep going with the next test, so one run reports every
 * failure. The random tests compare the runtime's edges with an element-by-element oracle,
 * with the whole graph kept and through small windows; the extreme-value tests pass int64
 * limits everywhere a region or shape goes in.
 */

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pto_orch.h"
#include "pto_runtime.h"

static int g_failures;
static int g_checks;

/* A failed check reports where and why, then leaves the current test function. */
#define CHECK(cond)                                                                          \
    do {                                                                                     \
        g_checks++;                                                                          \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);          \
            g_failures++;                                                                    \
            goto done;                                                                       \
        }                                                                                    \
    } while (0)

/* Expect status `want` from a runtime call on `rt` (and, for errors, a message containing
 * `text`); the runtime's message is printed when the status differs. */
#define CHECK_ST(rt, expr, want, text)                                                          \
    do {                                                                                        \
        int st_ = (expr);                                                                       \
        g_checks++;                                                                             \
        if (st_ != (want) || ((want) != PTO_OK && strstr(pto_last_error(rt), (text)) == NULL)) { \
            fprintf(stderr, "%s:%d: %s returned %s (want %s): %s\n", __FILE__, __LINE__, #expr,  \
                    pto_status_name(st_), pto_status_name(want), pto_last_error(rt));           \
            g_failures++;                                                                       \
            goto done;                                                                          \
        }                                                                                       \
    } while (0)

#define CHECK_OK(rt, expr) CHECK_ST(rt, expr, PTO_OK, "")

static pto_runtime *new_runtime(int32_t window, int32_t count_only)
{
    pto_config cfg;
    pto_runtime *rt = NULL;
    pto_config_init(&cfg);
    cfg.window = window;
    cfg.count_only = count_only;
    if (pto_runtime_create(&cfg, &rt) != PTO_OK) {
        fprintf(stderr, "cannot create a runtime\n");
        exit(2);
    }
    return rt;
}

/* One task with one region argument of the given kind. */
static int one_region_task(pto_runtime *rt, int32_t func, int kind, int32_t tensor, int64_t r0, int64_t c0,
                           int64_t nr, int64_t nc, int32_t *id)
{
    int32_t t;
    PTO_TRY(pto_task_alloc(rt, func, 0, &t));
    if (kind == PTO_ARG_IN) {
        PTO_TRY(pto_task_add_input(rt, t, tensor, r0, c0, nr, nc));
    } else if (kind == PTO_ARG_OUT) {
        PTO_TRY(pto_task_add_output(rt, t, tensor, r0, c0, nr, nc));
    } else {
        PTO_TRY(pto_task_add_inout(rt, t, tensor, r0, c0, nr, nc));
    }
    if (id != NULL) {
        *id = t;
    }
    return pto_task_submit(rt, t);
}

/* Add one region argument of the given kind. */
static int add_kind(pto_runtime *rt, int kind, int32_t task, int32_t tensor, int64_t r0, int64_t c0, int64_t nr,
                    int64_t nc)
{
    if (kind == PTO_ARG_IN) {
        return pto_task_add_input(rt, task, tensor, r0, c0, nr, nc);
    }
    if (kind == PTO_ARG_OUT) {
        return pto_task_add_output(rt, task, tensor, r0, c0, nr, nc);
    }
    return pto_task_add_inout(rt, task, tensor, r0, c0, nr, nc);
}

/* Edges of the runtime as an n x n matrix (caller frees), via the bulk export. */
static unsigned char *edge_matrix(pto_runtime *rt, int32_t *n_out, int64_t *n_edges)
{
    pto_export_info info;
    pto_export_arrays a;
    unsigned char *m;
    int64_t *fptr;
    int32_t *fids, i;
    int64_t k;
    memset(&a, 0, sizeof a);
    if (pto_export_info_get(rt, &info) != PTO_OK) {
        return NULL;
    }
    fptr = malloc(sizeof *fptr * (size_t)(info.n_tasks + 1));
    fids = malloc(sizeof *fids * (size_t)(info.n_edges + 1));
    m = calloc((size_t)info.n_tasks * (size_t)info.n_tasks + 1, 1);
    a.fanout_ptr = fptr;
    a.fanout_ids = fids;
    if (pto_export_fill(rt, &a) == PTO_OK) {
        for (i = 0; i < info.n_tasks; i++) {
            for (k = fptr[i]; k < fptr[i + 1]; k++) {
                m[(size_t)i * (size_t)info.n_tasks + (size_t)(fids[k] - info.first_task)] = 1;
                /* successors are listed ascending */
                if (k > fptr[i] && fids[k] <= fids[k - 1]) {
                    m[0] = 2;
                }
            }
        }
    }
    *n_out = info.n_tasks;
    *n_edges = info.n_edges;
    free(fptr);
    free(fids);
    return m;
}

/* Pop and complete until nothing is ready; returns how many completed. */
static int32_t run_ready(pto_runtime *rt)
{
    int32_t ids[64], n, total = 0;
    do {
        if (pto_ready_pop(rt, ids, 64, &n) != PTO_OK || pto_task_complete_many(rt, ids, n) != PTO_OK) {
            return -1;
        }
        total += n;
    } while (n > 0);
    return total;
}

static void test_chain_and_order(void)
{
    pto_runtime *rt = new_runtime(0, 0);
    int32_t x, f, ids[8], n, i;
    pto_stats s;
    CHECK_OK(rt, pto_tensor_register(rt, "x", 64, 64, 4, &x));
    CHECK_OK(rt, pto_func_register(rt, "step", &f));
    for (i = 0; i < 100; i++) {
        CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_INOUT, x, 0, 0, 64, 64, NULL));
    }
    for (i = 0; i < 100; i++) {
        CHECK_OK(rt, pto_ready_pop(rt, ids, 8, &n));
        CHECK(n == 1 && ids[0] == i);
        CHECK_OK(rt, pto_task_complete(rt, ids[0]));
    }
    CHECK_OK(rt, pto_get_stats(rt, &s));
    CHECK(s.tasks_submitted == 100 && s.edges == 99 && s.tasks_completed == 100 && s.ready == 0);
done:
    pto_runtime_destroy(rt);
}

static void test_partial_overwrite_exact(void)
{
    pto_runtime *rt = new_runtime(0, 0);
    int32_t x, f, n;
    int64_t ne;
    unsigned char *m = NULL;
    CHECK_OK(rt, pto_tensor_register(rt, "x", 128, 16, 4, &x));
    CHECK_OK(rt, pto_func_register(rt, "f", &f));
    CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_OUT, x, 0, 0, 64, 16, NULL));  /* W1 */
    CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_OUT, x, 0, 0, 32, 16, NULL));  /* W2 */
    CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_OUT, x, 32, 0, 32, 16, NULL)); /* W3 */
    CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_IN, x, 0, 0, 64, 16, NULL));   /* R */
    m = edge_matrix(rt, &n, &ne);
    CHECK(m != NULL && n == 4 && ne == 4);
    CHECK(m[0 * 4 + 1] && m[0 * 4 + 2] && m[1 * 4 + 3] && m[2 * 4 + 3] && !m[0 * 4 + 3]);
    free(m);
    m = NULL;
    /* inside one grid cell: a 1x1 writer swallowed by a 2x2 write, then a 4x4 read */
    CHECK_OK(rt, pto_runtime_reset(rt));
    CHECK_OK(rt, pto_tensor_register(rt, "y", 16, 16, 4, &x));
    CHECK_OK(rt, pto_func_register(rt, "f", &f));
    CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_OUT, x, 0, 0, 4, 4, NULL));
    CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_OUT, x, 1, 1, 1, 1, NULL));
    CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_OUT, x, 0, 0, 2, 2, NULL));
    CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_IN, x, 0, 0, 4, 4, NULL));
    m = edge_matrix(rt, &n, &ne);
    CHECK(m != NULL && n == 4 && ne == 5);
    CHECK(m[0 * 4 + 1] && m[0 * 4 + 2] && m[1 * 4 + 2] && m[0 * 4 + 3] && m[2 * 4 + 3] && !m[1 * 4 + 3]);
done:
    free(m);
    pto_runtime_destroy(rt);
}

static void test_war_and_runs(void)
{
    pto_runtime *rt = new_runtime(0, 0);
    int32_t x, f, n, last;
    int64_t ne;
    unsigned char *m = NULL;
    pto_task_view v;
    CHECK_OK(rt, pto_tensor_register(rt, "x", 32, 32, 4, &x));
    CHECK_OK(rt, pto_func_register(rt, "f", &f));
    CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_OUT, x, 0, 0, 32, 32, NULL));
    CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_IN, x, 0, 0, 32, 32, NULL));
    CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_OUT, x, 0, 0, 32, 32, NULL));
    m = edge_matrix(rt, &n, &ne);
    CHECK(m != NULL && ne == 3 && m[0 * 3 + 1] && m[0 * 3 + 2] && m[1 * 3 + 2]);
    /* 5000 readers then a writer: one run in the map, 5001 edges into the writer */
    for (n = 0; n < 5000; n++) {
        CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_IN, x, 0, 0, 32, 32, NULL));
    }
    CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_OUT, x, 0, 0, 32, 32, &last));
    CHECK_OK(rt, pto_task_query(rt, last, &v));
    CHECK(v.fanin == 5001 && v.pending == 5001 && v.state == PTO_TASK_SUBMITTED);
    CHECK(run_ready(rt) == 5004);
done:
    free(m);
    pto_runtime_destroy(rt);
}

/* ---- random programs against an element-by-element oracle ---------------------------- */

enum { MAXT = 48, NTENS = 3, MAXA = 4 };

typedef struct {
    int kind, tensor, r0, c0, nr, nc;
} access;

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static uint32_t rnd(uint32_t n)
{
    rng_state = rng_state * 6364136223846793005u + 1442695040888963407u;
    return (uint32_t)(rng_state >> 33) % n;
}

/* want[a * n + b] = 1 when task b depends on task a, computed element by element: a reader
 * depends on the last writer, a writer on the last writer and the readers since. */
static void oracle(int n, const int *nargs, access prog[][MAXA], const int shape[][2], unsigned char *want)
{
    int *last[NTENS];
    uint64_t *readers[NTENS];
    int t, a, r, c, k;
    memset(want, 0, (size_t)n * (size_t)n);
    for (k = 0; k < NTENS; k++) {
        size_t cells = (size_t)shape[k][0] * (size_t)shape[k][1];
        last[k] = malloc(cells * sizeof(int));
        readers[k] = calloc(cells, sizeof(uint64_t));
        for (r = 0; r < (int)cells; r++) {
            last[k][r] = -1;
        }
    }
    for (t = 0; t < n; t++) {
        uint64_t deps = 0;
        for (k = 0; k < 3; k++) { /* 0: lookups, 1: reads, 2: writes */
            for (a = 0; a < nargs[t]; a++) {
                const access *x = &prog[t][a];
                int w = shape[x->tensor][1];
                for (r = x->r0; r < x->r0 + x->nr; r++) {
                    for (c = x->c0; c < x->c0 + x->nc; c++) {
                        int *lw = &last[x->tensor][r * w + c];
                        uint64_t *rd = &readers[x->tensor][r * w + c];
                        if (k == 0) {
                            deps |= (*lw >= 0 ? (uint64_t)1 << *lw : 0) | (x->kind != PTO_ARG_IN ? *rd : 0);
                        } else if (k == 1 && x->kind == PTO_ARG_IN) {
                            *rd |= (uint64_t)1 << t;
                        } else if (k == 2 && x->kind != PTO_ARG_IN) {
                            *lw = t;
                            *rd = 0;
                        }
                    }
                }
            }
        }
        deps &= ~((uint64_t)1 << t);
        for (a = 0; a < t; a++) {
            want[(size_t)a * (size_t)n + (size_t)t] = (unsigned char)((deps >> a) & 1);
        }
    }
    for (k = 0; k < NTENS; k++) {
        free(last[k]);
        free(readers[k]);
    }
}

/* Extents: mostly small tiles on big tensors when `small`, else anything. */
static int extent(int room, int small)
{
    if (small && rnd(8) != 0) {
        int e = 1 + (int)rnd(6);
        return e < room ? e : room;
    }
    return 1 + (int)rnd((uint32_t)room);
}

static void random_vs_oracle(int iterations, int max_rows, int max_cols, int small)
{
    static access prog[MAXT][MAXA];
    static unsigned char want[MAXT * MAXT];
    int nargs[MAXT], shape[NTENS][2];
    int iter;
    for (iter = 0; iter < iterations; iter++) {
        pto_runtime *rt = new_runtime(0, 0);
        int32_t tid[NTENS], f, n_got, t, a;
        int64_t ne;
        unsigned char *got = NULL;
        int n = 1 + (int)rnd(MAXT), bad = 0;
        char name[8];
        CHECK_OK(rt, pto_func_register(rt, "f", &f));
        for (t = 0; t < NTENS; t++) {
            shape[t][0] = small ? max_rows - (int)rnd(40) : 1 + (int)rnd((uint32_t)max_rows);
            shape[t][1] = small ? max_cols - (int)rnd(40) : 1 + (int)rnd((uint32_t)max_cols);
            sprintf(name, "t%d", t);
            CHECK_OK(rt, pto_tensor_register(rt, name, shape[t][0], shape[t][1], 4, &tid[t]));
        }
        for (t = 0; t < n; t++) {
            int32_t id;
            nargs[t] = 1 + (int)rnd(MAXA);
            CHECK_OK(rt, pto_task_alloc(rt, f, 0, &id));
            for (a = 0; a < nargs[t]; a++) {
                access *x = &prog[t][a];
                x->kind = (int)rnd(3);
                x->tensor = (int)rnd(NTENS);
                x->r0 = (int)rnd((uint32_t)shape[x->tensor][0]);
                x->c0 = (int)rnd((uint32_t)shape[x->tensor][1]);
                x->nr = extent(shape[x->tensor][0] - x->r0, small);
                x->nc = extent(shape[x->tensor][1] - x->c0, small);
                if (x->kind == PTO_ARG_IN) {
                    CHECK_OK(rt, pto_task_add_input(rt, id, tid[x->tensor], x->r0, x->c0, x->nr, x->nc));
                } else if (x->kind == PTO_ARG_OUT) {
                    CHECK_OK(rt, pto_task_add_output(rt, id, tid[x->tensor], x->r0, x->c0, x->nr, x->nc));
                } else {
                    CHECK_OK(rt, pto_task_add_inout(rt, id, tid[x->tensor], x->r0, x->c0, x->nr, x->nc));
                }
            }
            if (rnd(4) == 0) {
                CHECK_OK(rt, pto_task_add_scalar(rt, id, (int64_t)rnd(1000) - 500));
            }
            CHECK_OK(rt, pto_task_submit(rt, id));
        }
        oracle(n, nargs, prog, (const int(*)[2])shape, want);
        got = edge_matrix(rt, &n_got, &ne);
        CHECK(got != NULL && n_got == n && got[0] != 2);
        for (t = 0; t < n * n; t++) {
            if ((got[t] != 0) != (want[t] != 0) && bad++ == 0) {
                fprintf(stderr, "iteration %d: edge %d -> %d: runtime %d, oracle %d\n", iter, t / n, t % n, got[t],
                        want[t]);
            }
        }
        CHECK(bad == 0);
        CHECK(run_ready(rt) == n);
        free(got);
        pto_runtime_destroy(rt);
        continue;
    done:
        free(got);
        pto_runtime_destroy(rt);
        return;
    }
}

/* OR the edges among the live submitted tasks into seen (n x n, indexed by task id). */
static int collect_edges(pto_runtime *rt, unsigned char *seen, int n)
{
    pto_export_info info;
    pto_export_arrays a;
    int64_t *fptr, k;
    int32_t *fids, i;
    int st;
    memset(&a, 0, sizeof a);
    if ((st = pto_export_info_get(rt, &info)) != PTO_OK) {
        return st;
    }
    fptr = malloc(sizeof *fptr * (size_t)(info.n_tasks + 1));
    fids = malloc(sizeof *fids * (size_t)(info.n_edges + 1));
    a.fanout_ptr = fptr;
    a.fanout_ids = fids;
    if ((st = pto_export_fill(rt, &a)) == PTO_OK) {
        for (i = 0; i < info.n_tasks; i++) {
            for (k = fptr[i]; k < fptr[i + 1]; k++) {
                seen[(size_t)(info.first_task + i) * (size_t)n + (size_t)fids[k]] = 1;
            }
        }
    }
    free(fptr);
    free(fids);
    return st;
}

/* Random programs through windows of 1..6 slots, completing a random part of the ready
 * tasks whenever the window is full (retirement, chunk reuse and freed edges under the
 * sanitizers). Edges are collected before every round of completions (nothing retires in
 * between), so they must be exactly the oracle's edges whose predecessor had not retired
 * when the successor was built; a task must never be handed out before its predecessors
 * completed. */
static void random_windowed_vs_oracle(int iterations)
{
    static access prog[MAXT][MAXA];
    static unsigned char want[MAXT * MAXT], seen[MAXT * MAXT];
    int nargs[MAXT], shape[NTENS][2], completed[MAXT], built_after[MAXT];
    int iter;
    for (iter = 0; iter < iterations; iter++) {
        int32_t window = 1 + (int32_t)rnd(6), tid[NTENS], f, pool[MAXT], t, a, got;
        pto_runtime *rt = new_runtime(window, 0);
        int n = 1 + (int)rnd(MAXT), submitted = 0, retired = 0, ncompleted = 0, npool = 0, bad = 0;
        pto_stats s;
        char name[8];
        CHECK_OK(rt, pto_func_register(rt, "f", &f));
        for (t = 0; t < NTENS; t++) {
            shape[t][0] = 1 + (int)rnd(12);
            shape[t][1] = 1 + (int)rnd(12);
            sprintf(name, "t%d", t);
            CHECK_OK(rt, pto_tensor_register(rt, name, shape[t][0], shape[t][1], 4, &tid[t]));
        }
        for (t = 0; t < n; t++) {
            nargs[t] = 1 + (int)rnd(MAXA);
            for (a = 0; a < nargs[t]; a++) {
                access *x = &prog[t][a];
                x->kind = (int)rnd(3);
                x->tensor = (int)rnd(NTENS);
                x->r0 = (int)rnd((uint32_t)shape[x->tensor][0]);
                x->c0 = (int)rnd((uint32_t)shape[x->tensor][1]);
                x->nr = extent(shape[x->tensor][0] - x->r0, 0);
                x->nc = extent(shape[x->tensor][1] - x->c0, 0);
            }
            completed[t] = 0;
        }
        oracle(n, nargs, prog, (const int(*)[2])shape, want);
        memset(seen, 0, sizeof seen);
        while (ncompleted < n) {
            if (submitted < n && submitted - retired < window) {
                int32_t id;
                built_after[submitted] = retired;
                CHECK_OK(rt, pto_task_alloc(rt, f, 0, &id));
                CHECK(id == submitted);
                for (a = 0; a < nargs[id]; a++) {
                    const access *x = &prog[id][a];
                    CHECK_OK(rt, add_kind(rt, x->kind, id, tid[x->tensor], x->r0, x->c0, x->nr, x->nc));
                }
                CHECK_OK(rt, pto_task_submit(rt, id));
                submitted++;
                continue;
            }
            CHECK_OK(rt, collect_edges(rt, seen, n));
            CHECK_OK(rt, pto_ready_pop(rt, pool + npool, MAXT - npool, &got));
            for (t = npool; t < npool + got; t++) {
                for (a = 0; a < pool[t]; a++) {
                    CHECK(!want[(size_t)a * (size_t)n + (size_t)pool[t]] || completed[a]);
                }
            }
            npool += got;
            CHECK(npool > 0);
            for (got = 1 + (int32_t)rnd((uint32_t)npool); got > 0; got--) {
                int32_t pick = (int32_t)rnd((uint32_t)npool), id = pool[pick];
                pool[pick] = pool[--npool];
                CHECK_OK(rt, pto_task_complete(rt, id));
                completed[id] = 1;
                ncompleted++;
            }
            while (retired < n && completed[retired]) {
                retired++;
            }
        }
        for (t = 0; t < n; t++) {
            for (a = 0; a < n; a++) {
                int expect = want[(size_t)a * (size_t)n + (size_t)t] && a >= built_after[t];
                if (expect != seen[(size_t)a * (size_t)n + (size_t)t] && bad++ == 0) {
                    fprintf(stderr, "windowed iteration %d (window %d): edge %d -> %d: runtime %d, oracle %d\n",
                            iter, window, a, t, seen[(size_t)a * (size_t)n + (size_t)t], expect);
                }
            }
        }
        CHECK(bad == 0);
        CHECK_OK(rt, pto_get_stats(rt, &s));
        CHECK(s.tasks_retired == n && s.tasks_live == 0 && s.edges_live == 0);
        pto_runtime_destroy(rt);
        continue;
    done:
        pto_runtime_destroy(rt);
        return;
    }
}

static void test_random_vs_oracle(void)
{
    random_vs_oracle(600, 12, 12, 0);
    /* big tensors with 1..6-element tiles: more than 2^16 cells, so the grid coarsens, and
     * occasional huge regions land in the large list */
    random_vs_oracle(40, 300, 300, 1);
    random_windowed_vs_oracle(600);
}

/* Regrid with large entries present: rows fixed first, a whole-tensor write (large), then a
 * narrow column access fixes the columns and re-anchors everything. */
static void test_regrid_with_large_entries(void)
{
    pto_runtime *rt = new_runtime(0, 0);
    int32_t x, f, n, last;
    int64_t ne;
    unsigned char *m = NULL;
    CHECK_OK(rt, pto_tensor_register(rt, "x", 64, 64, 4, &x));
    CHECK_OK(rt, pto_func_register(rt, "f", &f));
    CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_OUT, x, 0, 0, 4, 64, NULL));  /* 0: fixes 4-row cells */
    CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_OUT, x, 8, 0, 56, 64, NULL)); /* 1: large */
    CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_IN, x, 0, 3, 64, 2, NULL));   /* 2: fixes 2-col cells */
    CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_INOUT, x, 2, 2, 60, 60, &last));
    m = edge_matrix(rt, &n, &ne);
    CHECK(m != NULL && n == 4);
    CHECK(m[0 * 4 + 2] && m[1 * 4 + 2] && m[0 * 4 + 3] && m[1 * 4 + 3] && m[2 * 4 + 3] && ne == 5);
done:
    free(m);
    pto_runtime_destroy(rt);
}

/* A window whose live argument records span more chunks than the directory held (the ring
 * directory grows while wrapped), reader runs that retire partly, fanouts of many edges. */
static void test_window_ring_growth(void)
{
    pto_runtime *rt = new_runtime(700, 0);
    int32_t x, w, f, t, i, k;
    pto_stats s;
    int st;
    CHECK_OK(rt, pto_tensor_register(rt, "x", 4096, 16, 4, &x));
    CHECK_OK(rt, pto_tensor_register(rt, "w", 16, 16, 4, &w));
    CHECK_OK(rt, pto_func_register(rt, "f", &f));
    for (i = 0; i < 60000; i++) {
        while ((st = pto_task_alloc(rt, f, 0, &t)) == PTO_ERR_WINDOW_FULL) {
            int32_t id, nn;
            /* complete one task at a time: retirement then frees partial runs and chunks */
            CHECK_OK(rt, pto_ready_pop(rt, &id, 1, &nn));
            CHECK(nn == 1);
            CHECK_OK(rt, pto_task_complete(rt, id));
        }
        CHECK_OK(rt, st);
        for (k = 0; k < 30; k++) {
            CHECK_OK(rt, pto_task_add_scalar(rt, t, k));
        }
        if (i % 2000 == 1999) {
            /* after 1999 readers of w, most of them retired */
            CHECK_OK(rt, pto_task_add_output(rt, t, w, 0, 0, 16, 16));
        } else {
            CHECK_OK(rt, pto_task_add_input(rt, t, w, 0, 0, 16, 16));
        }
        CHECK_OK(rt, pto_task_add_inout(rt, t, x, (i * 16) % 4096, 0, 16, 16));
        CHECK_OK(rt, pto_task_submit(rt, t));
    }
    CHECK(run_ready(rt) > 0);
    CHECK_OK(rt, pto_get_stats(rt, &s));
    CHECK(s.tasks_retired == 60000 && s.tasks_live == 0 && s.edges_live == 0 && s.ready == 0);
done:
    pto_runtime_destroy(rt);
}

/* ---- windows ---------------------------------------------------------------------------- */

static void test_window_stream_bounded(void)
{
    pto_runtime *rt = new_runtime(32, 0);
    int32_t x, w, f, t, i;
    int64_t peak_early = 0;
    pto_stats s;
    int st;
    CHECK_OK(rt, pto_tensor_register(rt, "x", 1 << 20, 64, 4, &x));
    CHECK_OK(rt, pto_tensor_register(rt, "w", 64, 64, 4, &w));
    CHECK_OK(rt, pto_func_register(rt, "f", &f));
    for (i = 0; i < 300000; i++) {
        while ((st = pto_task_alloc(rt, f, 0, &t)) == PTO_ERR_WINDOW_FULL) {
            CHECK(run_ready(rt) > 0);
        }
        CHECK_OK(rt, st);
        CHECK_OK(rt, pto_task_add_input(rt, t, x, i, 0, 1, 64));
        CHECK_OK(rt, pto_task_add_input(rt, t, w, 0, 0, 64, 64));
        CHECK_OK(rt, pto_task_add_output(rt, t, x, i + 1, 0, 1, 64));
        CHECK_OK(rt, pto_task_submit(rt, t));
        if (i == 100000) {
            CHECK_OK(rt, pto_get_stats(rt, &s));
            peak_early = s.bytes_peak;
        }
    }
    CHECK(run_ready(rt) > 0);
    CHECK_OK(rt, pto_get_stats(rt, &s));
    CHECK(s.tasks_retired == 300000 && s.tasks_live == 0 && s.edges_live == 0);
    CHECK(s.bytes_peak == peak_early);
    CHECK(s.map_entries_peak < 40000); /* vs one entry per task without reclaiming */
done:
    pto_runtime_destroy(rt);
}

static void test_window_full_message(void)
{
    pto_runtime *rt = new_runtime(3, 0);
    int32_t x, f, t, i;
    CHECK_OK(rt, pto_tensor_register(rt, "x", 8, 8, 4, &x));
    CHECK_OK(rt, pto_func_register(rt, "f", &f));
    for (i = 0; i < 3; i++) {
        CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_INOUT, x, 0, 0, 8, 8, NULL));
    }
    CHECK_ST(rt, pto_task_alloc(rt, f, 0, &t), PTO_ERR_WINDOW_FULL, "task window full: all 3 slots");
    CHECK(run_ready(rt) == 3);
    CHECK_OK(rt, pto_task_alloc(rt, f, 0, &t));
    CHECK(t == 3);
    CHECK_OK(rt, pto_task_submit(rt, t));
done:
    pto_runtime_destroy(rt);
}

/* ---- misuse -------------------------------------------------------------------------- */

static void test_errors(void)
{
    pto_runtime *rt = new_runtime(0, 0);
    int32_t x, f, t, n, ids[4];
    CHECK_ST(rt, pto_tensor_register(rt, "bad name", 4, 4, 4, &x), PTO_ERR_INVALID, "not an identifier");
    CHECK_ST(rt, pto_tensor_register(rt, "x", 4, -4, 4, &x), PTO_ERR_INVALID, "shape 4 x -4");
    CHECK_OK(rt, pto_tensor_register(rt, "x", 100, 8, 4, &x));
    CHECK_ST(rt, pto_tensor_register(rt, "x", 4, 4, 4, &t), PTO_ERR_INVALID, "already registered");
    CHECK_OK(rt, pto_func_register(rt, "f", &f));
    CHECK_ST(rt, pto_task_alloc(rt, 7, 0, &t), PTO_ERR_UNKNOWN_FUNC, "unknown function id 7");
    CHECK_ST(rt, pto_task_alloc(rt, f, -1, &t), PTO_ERR_INVALID, "negative buffer_bytes -1");
    CHECK_OK(rt, pto_task_alloc(rt, f, 0, &t));
    CHECK_ST(rt, pto_task_alloc(rt, f, 0, &n), PTO_ERR_STATE, "still open");
    CHECK_ST(rt, pto_task_add_input(rt, t, 5, 0, 0, 1, 1), PTO_ERR_UNKNOWN_TENSOR, "unknown tensor id 5");
    CHECK_ST(rt, pto_task_add_input(rt, t, x, 96, 0, 8, 8), PTO_ERR_REGION,
             "input on tensor 'x': region rows 96..104 x cols 0..8 is outside the tensor (100 x 8)");
    CHECK_ST(rt, pto_task_add_output(rt, t, x, 0, 0, 0, 8), PTO_ERR_REGION, "extent 0 x 8 must be positive");
    CHECK_ST(rt, pto_task_add_inout(rt, t, x, 0, -2, 1, 1), PTO_ERR_REGION, "cols -2..-1");
    CHECK_ST(rt, pto_task_add_input(rt, t + 1, x, 0, 0, 1, 1), PTO_ERR_UNKNOWN_TASK, "unknown task id 1");
    CHECK_OK(rt, pto_task_add_output(rt, t, x, 0, 0, 8, 8));
    CHECK_OK(rt, pto_task_submit(rt, t));
    CHECK_ST(rt, pto_task_submit(rt, t), PTO_ERR_STATE, "already submitted");
    CHECK_ST(rt, pto_task_add_input(rt, t, x, 0, 0, 1, 1), PTO_ERR_STATE, "already submitted");
    CHECK_ST(rt, pto_task_complete(rt, t), PTO_ERR_STATE, "ready (queued, not popped)");
    CHECK_OK(rt, pto_ready_pop(rt, ids, 4, &n));
    CHECK(n == 1);
    CHECK_OK(rt, pto_task_complete(rt, t));
    CHECK_ST(rt, pto_task_complete(rt, t), PTO_ERR_STATE, "already completed");
    CHECK_ST(rt, pto_task_complete(rt, 99), PTO_ERR_UNKNOWN_TASK, "unknown task id 99");
    CHECK_ST(rt, pto_ready_pop(rt, NULL, 4, &n), PTO_ERR_INVALID, "NULL pointer");
    CHECK(pto_task_submit(NULL, 0) == PTO_ERR_INVALID);
    CHECK(strcmp(pto_status_name(PTO_ERR_REGION), "PTO_ERR_REGION") == 0);
done:
    pto_runtime_destroy(rt);
}

static void test_count_only(void)
{
    pto_runtime *rt = new_runtime(0, 1);
    int32_t x, f, t, i;
    pto_stats s;
    int64_t bytes = 0;
    CHECK_OK(rt, pto_tensor_register(rt, "x", 1 << 24, 64, 2, &x));
    CHECK_OK(rt, pto_func_register(rt, "f", &f));
    for (i = 0; i < 1000000; i++) {
        CHECK_OK(rt, pto_task_alloc(rt, f, 0, &t));
        CHECK_OK(rt, pto_task_add_input(rt, t, x, i, 0, 2, 64));
        CHECK_OK(rt, pto_task_add_inout(rt, t, x, i + 1, 0, 1, 64));
        CHECK_OK(rt, pto_task_add_scalar(rt, t, i));
        CHECK_OK(rt, pto_task_submit(rt, t));
        if (i == 10) {
            CHECK_OK(rt, pto_get_stats(rt, &s));
            bytes = s.bytes;
        }
    }
    CHECK_OK(rt, pto_get_stats(rt, &s));
    CHECK(s.tasks_submitted == 1000000 && s.regions == 2000000 && s.scalars == 1000000 && s.edges == 0);
    CHECK(s.bytes == bytes && s.count_only == 1);
    CHECK_ST(rt, pto_dump(rt, "unused"), PTO_ERR_STATE, "count_only");
done:
    pto_runtime_destroy(rt);
}

static void test_dump_and_reset(const char *dir)
{
    pto_runtime *rt = new_runtime(0, 0);
    char path[512], line[256];
    int32_t x, f, g, t;
    FILE *fp = NULL;
    int lines = 0, saw_task = 0, saw_arg = 0, saw_scalar = 0, saw_end = 0;
    pto_stats s;
    snprintf(path, sizeof path, "%s/graph.txt", dir);
    CHECK_OK(rt, pto_tensor_register(rt, "q", 64, 16, 2, &x));
    CHECK_OK(rt, pto_func_register(rt, "proj", &f));
    CHECK_OK(rt, pto_func_register(rt, "score", &g));
    CHECK_OK(rt, pto_task_alloc(rt, f, 4096, &t));
    CHECK_OK(rt, pto_task_add_output(rt, t, x, 0, 0, 32, 16));
    CHECK_OK(rt, pto_task_submit(rt, t));
    CHECK_OK(rt, pto_task_alloc(rt, g, 0, &t));
    CHECK_OK(rt, pto_task_add_input(rt, t, x, 0, 0, 64, 16));
    CHECK_OK(rt, pto_task_add_scalar(rt, t, -3));
    CHECK_OK(rt, pto_task_submit(rt, t));
    CHECK_OK(rt, pto_dump(rt, path));
    fp = fopen(path, "r");
    CHECK(fp != NULL);
    while (fgets(line, sizeof line, fp) != NULL) {
        lines++;
        saw_task += strcmp(line, "TASK 0 0 4096 0 1 1\n") == 0;
        saw_arg += strcmp(line, "ARG 1 in 0 0 0 64 16\n") == 0;
        saw_scalar += strcmp(line, "SCALAR 1 -3\n") == 0;
        saw_end += strcmp(line, "END 2 1\n") == 0;
    }
    CHECK(lines == 10 && saw_task && saw_arg && saw_scalar && saw_end);
    CHECK_OK(rt, pto_runtime_reset(rt));
    CHECK_OK(rt, pto_get_stats(rt, &s));
    CHECK(s.tasks_submitted == 0 && s.map_entries == 0 && s.edges == 0);
    CHECK_OK(rt, pto_tensor_register(rt, "q", 8, 8, 2, &x));
    CHECK(x == 0);
    CHECK_ST(rt, pto_dump(rt, "/nonexistent-dir/x/graph.txt"), PTO_ERR_IO, "cannot open");
done:
    if (fp != NULL) {
        fclose(fp);
    }
    pto_runtime_destroy(rt);
}

/* ---- sync hooks ------------------------------------------------------------------------ */

typedef struct {
    int depth, max_depth, locks, notifies;
} fake_sync;

static void fake_lock(void *p)
{
    fake_sync *s = p;
    s->locks++;
    if (++s->depth > s->max_depth) {
        s->max_depth = s->depth;
    }
}

static void fake_unlock(void *p)
{
    ((fake_sync *)p)->depth--;
}

static void fake_wait(void *p)
{
    (void)p;
}

static void fake_notify(void *p)
{
    ((fake_sync *)p)->notifies++;
}

static void test_hooks_balanced(void)
{
    fake_sync fs = {0, 0, 0, 0};
    pto_config cfg;
    pto_runtime *rt = NULL;
    int32_t x, f, i;
    pto_config_init(&cfg);
    cfg.sync_ctx = &fs;
    cfg.lock = fake_lock;
    cfg.unlock = fake_unlock;
    cfg.wait = fake_wait;
    cfg.notify_all = fake_notify;
    CHECK(pto_runtime_create(&cfg, &rt) == PTO_OK);
    CHECK_OK(rt, pto_tensor_register(rt, "x", 8, 8, 4, &x));
    CHECK_OK(rt, pto_func_register(rt, "f", &f));
    for (i = 0; i < 10; i++) {
        CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_INOUT, x, 0, 0, 8, 8, NULL));
    }
    CHECK(run_ready(rt) == 10);
    CHECK(fs.depth == 0 && fs.max_depth == 1 && fs.locks > 40 && fs.notifies >= 10);
    cfg.lock = NULL; /* lock without unlock is refused */
    pto_runtime_destroy(rt);
    rt = NULL;
    CHECK(pto_runtime_create(&cfg, &rt) == PTO_ERR_INVALID && rt == NULL);
done:
    pto_runtime_destroy(rt);
}

/* ---- extreme region values: refused cleanly, messages exact, no undefined behaviour ---- */

typedef struct {
    int64_t r0, c0, nr, nc;
    const char *region; /* the message after "task T (f) KIND on tensor 'x': " */
} bad_region;

/* Regions a user can pass that no 8 x 8 tensor holds: int64 limits, sums past INT64_MAX,
 * negative and zero extents, values that int32 truncation would turn into valid ones. */
static const bad_region bad_regions[] = {
    {INT64_MAX, 0, 1, 1, "region rows 9223372036854775807..9223372036854775808 x cols 0..1 is outside the tensor (8 x 8)"},
    {0, INT64_MAX, 1, 1, "region rows 0..1 x cols 9223372036854775807..9223372036854775808 is outside the tensor (8 x 8)"},
    {INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, "region rows 9223372036854775807..18446744073709551614 x cols "
     "9223372036854775807..18446744073709551614 is outside the tensor (8 x 8)"},
    {0, 0, INT64_MAX, 1, "region rows 0..9223372036854775807 x cols 0..1 is outside the tensor (8 x 8)"},
    {1, 1, INT64_MAX, INT64_MAX, "region rows 1..9223372036854775808 x cols 1..9223372036854775808 is outside"},
    {-1, 0, INT64_MAX, 1, "region rows -1..9223372036854775806 x cols 0..1 is outside"},
    {INT64_MAX - 7, 0, 8, 8, "region rows 9223372036854775800..9223372036854775808 x cols 0..8 is outside"},
    {INT64_MAX - 8, 0, 8, 8, "region rows 9223372036854775799..9223372036854775807 x cols 0..8 is outside"},
    {INT64_MIN, 0, 1, 1, "region rows -9223372036854775808..-9223372036854775807 x cols 0..1 is outside"},
    {INT64_MIN, INT64_MIN, INT64_MAX, INT64_MAX, "region rows -9223372036854775808..-1 x cols "
     "-9223372036854775808..-1 is outside the tensor (8 x 8)"},
    {0, INT64_MIN + 1, 1, INT64_MAX, "region rows 0..1 x cols -9223372036854775807..0 is outside"},
    {(int64_t)1 << 32, 0, 1, 1, "region rows 4294967296..4294967297 x cols 0..1 is outside"},
    {0, 0, ((int64_t)1 << 32) + 8, 8, "region rows 0..4294967304 x cols 0..8 is outside"},
    {INT32_MIN, 0, 1, 1, "region rows -2147483648..-2147483647 x cols 0..1 is outside"},
    {-4, 0, 8, 8, "region rows -4..4 x cols 0..8 is outside"},
    {7, 7, 2, 1, "region rows 7..9 x cols 7..8 is outside the tensor (8 x 8)"},
    {0, 0, 9, 8, "region rows 0..9 x cols 0..8 is outside"},
    {8, 0, 1, 8, "region rows 8..9 x cols 0..8 is outside"},
    {0, 0, 0, 1, "region extent 0 x 1 must be positive"},
    {0, 0, 1, -1, "region extent 1 x -1 must be positive"},
    {0, 0, INT64_MIN, INT64_MIN, "region extent -9223372036854775808 x -9223372036854775808 must be positive"},
    {INT64_MAX, INT64_MAX, INT64_MIN, 1, "region extent -9223372036854775808 x 1 must be positive"},
    {INT64_MIN, INT64_MIN, 1, INT64_MIN, "region extent 1 x -9223372036854775808 must be positive"},
    {0, 0, -((int64_t)1 << 32) + 8, 8, "region extent -4294967288 x 8 must be positive"},
};

/* Every bad region through every kind on one runtime configuration: each is refused with
 * PTO_ERR_REGION and the exact message, and the open task, the tensor map and the counts are
 * as if it had never been passed (the sanitizers report any overflow on the way). The tensor
 * is accessed as whole 4 x 4 tiles first, so the exact-cell fast path is armed. */
static void region_extremes_on(pto_runtime *rt, const char *what)
{
    static const char *const kinds[] = {"input", "output", "inout"};
    char want[512];
    int32_t x, f, t, n;
    int64_t ne;
    size_t k;
    int kind;
    unsigned char *m = NULL;
    pto_stats s;
    CHECK_OK(rt, pto_tensor_register(rt, "x", 8, 8, 4, &x));
    CHECK_OK(rt, pto_func_register(rt, "f", &f));
    CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_OUT, x, 4, 4, 4, 4, NULL));
    CHECK_OK(rt, pto_task_alloc(rt, f, 0, &t));
    for (k = 0; k < sizeof bad_regions / sizeof bad_regions[0]; k++) {
        const bad_region *b = &bad_regions[k];
        for (kind = PTO_ARG_IN; kind <= PTO_ARG_INOUT; kind++) {
            snprintf(want, sizeof want, "task %d (f) %s on tensor 'x': %s", t, kinds[kind], b->region);
            if (add_kind(rt, kind, t, x, b->r0, b->c0, b->nr, b->nc) != PTO_ERR_REGION
                || strstr(pto_last_error(rt), want) == NULL) {
                fprintf(stderr, "%s: case %d kind %s: got '%s', want '%s'\n", what, (int)k, kinds[kind],
                        pto_last_error(rt), want);
                g_failures++;
            }
            g_checks++;
        }
    }
    /* the open task is unharmed: a valid tile still goes in, on the fast path */
    CHECK_OK(rt, pto_task_add_input(rt, t, x, 4, 4, 4, 4));
    CHECK_OK(rt, pto_task_add_scalar(rt, t, INT64_MIN));
    CHECK_OK(rt, pto_task_add_scalar(rt, t, INT64_MAX));
    CHECK_OK(rt, pto_task_submit(rt, t));
    CHECK_OK(rt, pto_get_stats(rt, &s));
    CHECK(s.tasks_submitted == 2 && s.regions == 2 && s.scalars == 2);
    if (!s.count_only) {
        pto_arg args[3];
        CHECK_OK(rt, pto_task_args(rt, t, args, 3, &n));
        CHECK(n == 3 && args[0].row0 == 4 && args[0].rows == 4 && args[1].scalar == INT64_MIN
              && args[2].scalar == INT64_MAX);
        m = edge_matrix(rt, &n, &ne);
        CHECK(m != NULL && n == 2 && ne == 1 && m[0 * 2 + 1]);
    }
done:
    free(m);
}

static void test_region_extremes(void)
{
    fake_sync fs = {0, 0, 0, 0};
    pto_config cfg;
    pto_runtime *rt = new_runtime(0, 0);
    region_extremes_on(rt, "window 0");
    pto_runtime_destroy(rt);
    rt = new_runtime(4, 0);
    region_extremes_on(rt, "window 4");
    pto_runtime_destroy(rt);
    rt = new_runtime(0, 1);
    region_extremes_on(rt, "count_only");
    pto_runtime_destroy(rt);
    /* under a lock every call takes the checked path */
    pto_config_init(&cfg);
    cfg.sync_ctx = &fs;
    cfg.lock = fake_lock;
    cfg.unlock = fake_unlock;
    rt = NULL;
    CHECK(pto_runtime_create(&cfg, &rt) == PTO_OK);
    region_extremes_on(rt, "locked");
    CHECK(fs.depth == 0);
done:
    pto_runtime_destroy(rt);
}

/* Tensors of the largest shape, regions touching their last row and column, and shapes past
 * the limit (refused, naming the shape passed). */
static void test_huge_tensors(void)
{
    pto_runtime *rt = new_runtime(0, 0);
    const int64_t M = INT32_MAX, H = (int64_t)1 << 30;
    int32_t h, row, f, t, n, k;
    int64_t ne;
    unsigned char *m = NULL;
    CHECK_OK(rt, pto_func_register(rt, "f", &f));
    CHECK_ST(rt, pto_tensor_register(rt, "big", M + 1, 1, 4, &h), PTO_ERR_INVALID,
             "tensor 'big': shape 2147483648 x 1 must be positive and at most 2147483647 per dimension");
    CHECK_ST(rt, pto_tensor_register(rt, "big", 1, INT64_MAX, 4, &h), PTO_ERR_INVALID,
             "tensor 'big': shape 1 x 9223372036854775807 must be positive");
    CHECK_ST(rt, pto_tensor_register(rt, "big", INT64_MIN, INT64_MIN, 4, &h), PTO_ERR_INVALID,
             "tensor 'big': shape -9223372036854775808 x -9223372036854775808 must be positive");
    CHECK_ST(rt, pto_tensor_register(rt, "big", 1, 1, INT32_MIN, &h), PTO_ERR_INVALID,
             "tensor 'big': element size -2147483648 must be positive");
    CHECK_OK(rt, pto_tensor_register(rt, "h", M, M, 8, &h));
    CHECK_OK(rt, pto_tensor_register(rt, "row", 1, M, 1, &row));
    CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_OUT, h, 0, 0, M, M, NULL));         /* 0: all of it */
    CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_IN, h, M - 1, M - 1, 1, 1, NULL));  /* 1: last element */
    CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_OUT, h, M - 1, 0, 1, M, NULL));     /* 2: last row */
    CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_IN, h, 0, 0, 1, 1, NULL));          /* 3: first element */
    CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_IN, h, 0, 0, M, M, NULL));          /* 4: all of it */
    CHECK_OK(rt, pto_task_alloc(rt, f, 0, &t));                                      /* 5 */
    CHECK_ST(rt, pto_task_add_input(rt, t, h, M, 0, 1, 1), PTO_ERR_REGION,
             "input on tensor 'h': region rows 2147483647..2147483648 x cols 0..1 is outside the tensor "
             "(2147483647 x 2147483647)");
    CHECK_ST(rt, pto_task_add_inout(rt, t, h, M - 1, M - 1, 2, 1), PTO_ERR_REGION,
             "region rows 2147483646..2147483648 x cols 2147483646..2147483647 is outside");
    CHECK_ST(rt, pto_task_add_output(rt, t, h, 0, 0, M + 1, M + 1), PTO_ERR_REGION,
             "region rows 0..2147483648 x cols 0..2147483648 is outside");
    /* the lower right quarter, last row and column included: WAW on 0 and 2, WAR on 4 (1
     * read the last element before 2 overwrote it) */
    CHECK_OK(rt, pto_task_add_inout(rt, t, h, H, H, H - 1, H - 1));
    CHECK_OK(rt, pto_task_submit(rt, t));
    CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_OUT, row, 0, 0, 1, 1, NULL));        /* 6 */
    CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_OUT, row, 0, M - 1, 1, 1, NULL));    /* 7 */
    CHECK_OK(rt, one_region_task(rt, f, PTO_ARG_IN, row, 0, 0, 1, M, NULL));         /* 8 */
    m = edge_matrix(rt, &n, &ne);
    CHECK(m != NULL && n == 9 && ne == 11);
    {
        static const int want[][2] = {{0, 1}, {0, 2}, {1, 2}, {0, 3}, {0, 4}, {2, 4}, {0, 5}, {2, 5}, {4, 5},
                                      {6, 8}, {7, 8}};
        for (k = 0; k < 11; k++) {
            CHECK(m[want[k][0] * 9 + want[k][1]]);
        }
    }
    CHECK(run_ready(rt) == 9);
done:
    free(m);
    pto_runtime_destroy(rt);
}

/* pto_orch.h's Python-style division at the int64 limits (C's INT64_MIN / -1 traps). */
static void test_orch_division_extremes(void)
{
    CHECK(pto_fdiv(INT64_MIN, -1) == INT64_MIN && pto_fmod(INT64_MIN, -1) == 0);
    CHECK(pto_fdiv(INT64_MAX, -1) == -INT64_MAX && pto_fmod(INT64_MAX, -1) == 0);
    CHECK(pto_fdiv(INT64_MIN, 1) == INT64_MIN && pto_fmod(INT64_MIN, 1) == 0);
    CHECK(pto_fdiv(INT64_MIN, INT64_MAX) == -2 && pto_fmod(INT64_MIN, INT64_MAX) == INT64_MAX - 1);
    CHECK(pto_fdiv(INT64_MAX, INT64_MIN) == -1 && pto_fmod(INT64_MAX, INT64_MIN) == -1);
    CHECK(pto_fdiv(INT64_MIN, INT64_MIN) == 1 && pto_fmod(INT64_MIN, INT64_MIN) == 0);
    CHECK(pto_fdiv(-7, 2) == -4 && pto_fmod(-7, 2) == 1 && pto_fdiv(7, -2) == -4 && pto_fmod(7, -2) == -1);
    CHECK(pto_fdiv(INT64_MIN, 0) == 0 && pto_fmod(INT64_MIN, 0) == 0);
done:
    return;
}

typedef struct {
    pto_runtime *rt;
    int32_t total;
    int32_t done;
    int failed;
} executor_args;

static void *executor(void *p)
{
    executor_args *ea = p;
    int32_t ids[16], n, spins = 0;
    while (ea->done < ea->total) {
        if (pto_ready_pop(ea->rt, ids, 16, &n) != PTO_OK || pto_task_complete_many(ea->rt, ids, n) != PTO_OK) {
            ea->failed = 1;
            return NULL;
        }
        ea->done += n;
        if (n == 0 && ++spins > 200000000) {
            ea->failed = 2;
            return NULL;
        }
    }
    return NULL;
}

static void test_posix_threads(void)
{
    pto_config cfg;
    pto_runtime *rt = NULL;
    pthread_t th;
    executor_args ea;
    int32_t x, y, f, t, i, started = 0;
    pto_stats s;
    pto_config_init(&cfg);
    cfg.window = 8;
    CHECK(pto_sync_posix_init(&cfg) == PTO_OK);
    CHECK(pto_runtime_create(&cfg, &rt) == PTO_OK);
    CHECK_OK(rt, pto_tensor_register(rt, "x", 64, 64, 4, &x));
    CHECK_OK(rt, pto_tensor_register(rt, "y", 64, 64, 4, &y));
    CHECK_OK(rt, pto_func_register(rt, "f", &f));
    ea.rt = rt;
    ea.total = 20000;
    ea.done = 0;
    ea.failed = 0;
    CHECK(pthread_create(&th, NULL, executor, &ea) == 0);
    started = 1;
    for (i = 0; i < ea.total; i++) {
        /* blocks while the window is full, until the executor retires tasks */
        CHECK_OK(rt, pto_task_alloc(rt, f, 0, &t));
        CHECK_OK(rt, pto_task_add_input(rt, t, i % 2 ? x : y, (i * 7) % 64, 0, 1, 64));
        CHECK_OK(rt, pto_task_add_output(rt, t, i % 2 ? y : x, (i * 13) % 64, 0, 1, 64));
        CHECK_OK(rt, pto_task_submit(rt, t));
    }
done:
    if (started) {
        pthread_join(th, NULL);
        CHECK(ea.failed == 0 && ea.done == ea.total);
        CHECK_OK(rt, pto_get_stats(rt, &s));
        CHECK(s.tasks_completed == 20000 && s.tasks_retired == 20000);
        started = 0;
    }
    pto_runtime_destroy(rt);
    pto_sync_posix_free(&cfg);
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : ".";
    test_chain_and_order();
    test_partial_overwrite_exact();
    test_war_and_runs();
    test_random_vs_oracle();
    test_regrid_with_large_entries();
    test_window_ring_growth();
    test_window_stream_bounded();
    test_window_full_message();
    test_errors();
    test_region_extremes();
    test_huge_tensors();
    test_orch_division_extremes();
    test_count_only();
    test_dump_and_reset(dir);
    test_hooks_balanced();
    test_posix_threads();
    printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
