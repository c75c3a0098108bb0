/* test_native.c - C tests of the native pool (runtime_c/pto_native.c): worker threads that run
 * tasks' kernels while the orchestration submits them.
 *
 * tests/runtime/test_native_c.py compiles this with the runtime's C files under AddressSanitizer +
 * UndefinedBehaviorSanitizer (and ThreadSanitizer where it runs) and runs it with a timeout, so
 * a deadlock fails instead of hanging. Taskflow's tests are the model: chains, fan-outs and
 * random graphs at several worker counts.
 *
 * A task's kernel mixes everything it reads (its input and inout regions, in argument order)
 * into a 64-bit hash with its id, then writes each output and inout region, element by element,
 * from that hash, the element's place and (inout) its old value. Run in program order without
 * the pool, the same kernels give the reference memory; a task that ran before one of its
 * predecessors, or beside a task writing what it touches, leaves other values (and a race
 * shows in ThreadSanitizer). Every program runs at 1 to 4 threads, with the whole graph kept
 * and through windows of 1 to 16 slots.
 */

#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pto_runtime.h"

static int g_failures;
static int g_checks;

#define CHECK(cond)                                                                          \
    do {                                                                                     \
        g_checks++;                                                                          \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);          \
            g_failures++;                                                                    \
            goto done;                                                                       \
        }                                                                                    \
    } while (0)

enum { MAXT = 3, MAXA = 4, MAXTASKS = 400, SIDE = 24 };

typedef struct {
    int kind; /* PTO_ARG_IN, OUT, INOUT */
    int tensor, r0, c0, nr, nc;
} access;

typedef struct {
    int ntensors, ntasks;
    int shape[MAXT][2];
    int nargs[MAXTASKS];
    access args[MAXTASKS][MAXA];
} program;

static uint64_t rng_state = 0x2545f4914f6cdd1du;

static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

/* ---------------------------------------------------------------------------------------
 * the kernel: scalars are the task's index and its arguments' kinds (2 bits each)
 * ------------------------------------------------------------------------------------- */

static int g_fail_at = -1; /* a task index whose kernel fails (returns 7) */
static int g_spin;         /* busy work per task (the cancel test) */

static uint64_t mix(uint64_t h, uint64_t v)
{
    return (h ^ v) * 0x100000001b3u;
}

static int kernel(const pto_region *m, const int64_t *s, int n)
{
    uint64_t h = mix(0xcbf29ce484222325u, (uint64_t)s[0]);
    volatile uint64_t spin = 0;
    int a, i, j;
    if (s[0] == g_fail_at) {
        return 7;
    }
    for (a = 0; a < g_spin; a++) {
        spin += (uint64_t)a;
    }
    for (a = 0; a < n; a++) {
        int kind = (int)((s[1] >> (2 * a)) & 3);
        if (kind == PTO_ARG_OUT) {
            continue;
        }
        for (i = 0; i < m[a].rows; i++) {
            for (j = 0; j < m[a].cols; j++) {
                h = mix(h, (uint64_t)((const int64_t *)(void *)m[a].origin)[i * m[a].ld + j]);
            }
        }
    }
    for (a = 0; a < n; a++) {
        int kind = (int)((s[1] >> (2 * a)) & 3);
        int64_t *p = (int64_t *)(void *)m[a].origin;
        if (kind == PTO_ARG_IN) {
            continue;
        }
        for (i = 0; i < m[a].rows; i++) {
            for (j = 0; j < m[a].cols; j++) {
                uint64_t old = kind == PTO_ARG_INOUT ? (uint64_t)p[i * m[a].ld + j] : 0;
                p[i * m[a].ld + j] = (int64_t)mix(h + (uint64_t)(i * 131 + j), old);
            }
        }
    }
    return 0;
}

static int kernel1(const pto_region *m, const int64_t *s, float *scratch)
{
    (void)scratch;
    return kernel(m, s, 1);
}

static int kernel2(const pto_region *m, const int64_t *s, float *scratch)
{
    (void)scratch;
    return kernel(m, s, 2);
}

static int kernel3(const pto_region *m, const int64_t *s, float *scratch)
{
    (void)scratch;
    return kernel(m, s, 3);
}

static int kernel4(const pto_region *m, const int64_t *s, float *scratch)
{
    (void)scratch;
    return kernel(m, s, 4);
}

static const pto_kernel_info kernels[MAXA] = {
    {kernel1, 1, 2, 16, "one"}, {kernel2, 2, 2, 16, "two"}, {kernel3, 3, 2, 16, "three"}, {kernel4, 4, 2, 16, "four"}};

/* ---------------------------------------------------------------------------------------
 * programs: random, a chain, a fan-out and fan-in
 * ------------------------------------------------------------------------------------- */

static void random_program(program *p)
{
    int t, a;
    p->ntensors = 1 + (int)rnd(MAXT);
    for (t = 0; t < p->ntensors; t++) {
        p->shape[t][0] = 1 + (int)rnd(SIDE);
        p->shape[t][1] = 1 + (int)rnd(SIDE);
    }
    p->ntasks = 1 + (int)rnd(MAXTASKS);
    for (t = 0; t < p->ntasks; t++) {
        p->nargs[t] = 1 + (int)rnd(MAXA);
        for (a = 0; a < p->nargs[t]; a++) {
            access *g = &p->args[t][a];
            int rows, cols;
            static const int kinds[4] = {PTO_ARG_IN, PTO_ARG_IN, PTO_ARG_OUT, PTO_ARG_INOUT};
            g->kind = kinds[rnd(4)];
            g->tensor = (int)rnd((uint32_t)p->ntensors);
            rows = p->shape[g->tensor][0];
            cols = p->shape[g->tensor][1];
            g->r0 = (int)rnd((uint32_t)rows);
            g->c0 = (int)rnd((uint32_t)cols);
            g->nr = 1 + (int)rnd((uint32_t)(rows - g->r0));
            g->nc = 1 + (int)rnd((uint32_t)(cols - g->c0));
        }
    }
}

/* n tasks updating one tile in turn, each also reading the whole tensor (a chain) */
static void chain_program(program *p, int n)
{
    int t;
    p->ntensors = 1;
    p->shape[0][0] = 8;
    p->shape[0][1] = 8;
    p->ntasks = n;
    for (t = 0; t < n; t++) {
        access w = {PTO_ARG_INOUT, 0, (t % 2) * 4, 0, 4, 8}, r = {PTO_ARG_IN, 0, 0, 0, 8, 8};
        p->nargs[t] = 2;
        p->args[t][0] = r;
        p->args[t][1] = w;
    }
}

/* one writer, n - 2 readers of it writing their own cells, one reader of all (a diamond) */
static void fan_program(program *p, int n)
{
    int t;
    p->ntensors = 2;
    p->shape[0][0] = 4;
    p->shape[0][1] = 4;
    p->shape[1][0] = 1;
    p->shape[1][1] = n;
    p->ntasks = n;
    for (t = 0; t < n; t++) {
        access src = {t == 0 ? PTO_ARG_OUT : PTO_ARG_IN, 0, 0, 0, 4, 4};
        access cell = {PTO_ARG_OUT, 1, 0, t, 1, 1}, all = {PTO_ARG_IN, 1, 0, 0, 1, n};
        p->nargs[t] = 2;
        p->args[t][0] = src;
        p->args[t][1] = t == n - 1 ? all : cell;
    }
}

/* ---------------------------------------------------------------------------------------
 * running
 * ------------------------------------------------------------------------------------- */

typedef struct {
    int64_t *data[MAXT];
} memory;

static void memory_init(const program *p, memory *mem, uint64_t seed)
{
    int t, k;
    for (t = 0; t < p->ntensors; t++) {
        int n = p->shape[t][0] * p->shape[t][1];
        mem->data[t] = malloc(sizeof(int64_t) * (size_t)n);
        for (k = 0; k < n; k++) {
            mem->data[t][k] = (int64_t)mix(seed, (uint64_t)(t * 1000 + k));
        }
    }
}

static void memory_free(const program *p, memory *mem)
{
    int t;
    for (t = 0; t < p->ntensors; t++) {
        free(mem->data[t]);
    }
}

static int64_t kinds_of(const program *p, int t)
{
    int64_t k = 0;
    int a;
    for (a = 0; a < p->nargs[t]; a++) {
        k |= (int64_t)p->args[t][a].kind << (2 * a);
    }
    return k;
}

/* every task in program order, no runtime */
static void run_sequential(const program *p, memory *mem)
{
    int t, a;
    for (t = 0; t < p->ntasks; t++) {
        pto_region regions[MAXA];
        int64_t s[2];
        s[0] = t;
        s[1] = kinds_of(p, t);
        for (a = 0; a < p->nargs[t]; a++) {
            const access *g = &p->args[t][a];
            int64_t ld = p->shape[g->tensor][1];
            pto_region *r = &regions[a];
            r->origin = (char *)(void *)(mem->data[g->tensor] + g->r0 * ld + g->c0);
            r->ld = ld;
            r->rows = g->nr;
            r->cols = g->nc;
            r->row0 = g->r0;
            r->col0 = g->c0;
            r->trows = p->shape[g->tensor][0];
            r->tcols = ld;
        }
        kernels[p->nargs[t] - 1].fn(regions, s, NULL);
    }
}

typedef struct {
    pto_native *nt;
    int after_ms;
} canceller;

static void *cancel_later(void *arg)
{
    canceller *c = arg;
    struct timespec ts = {0, c->after_ms * 1000000L};
    nanosleep(&ts, NULL);
    pto_native_cancel(c->nt);
    return NULL;
}

/* the program through a pool of `threads` (*pool: reused for another run, or NULL: made here and
 * destroyed after) and a runtime of `window` slots (0: the whole graph); the status
 * pto_native_work returned, the tasks completed in *completed */
static int run_on(pto_native **pool, const program *p, memory *mem, int threads, int window, int cancel_ms,
                  int64_t *completed)
{
    pto_config cfg;
    pto_runtime *rt = NULL;
    pto_native *nt = pool != NULL ? *pool : NULL;
    int32_t tid[MAXT], fid[MAXA], task, ftask, ffunc, fst;
    int t, a, st = -100;
    pthread_t cancel_thread;
    canceller c;
    pto_config_init(&cfg);
    cfg.window = window;
    if ((nt != NULL ? pto_native_reuse(nt, &cfg) : pto_native_create(&cfg, threads, &nt)) != PTO_OK
        || pto_runtime_create(&cfg, &rt) != PTO_OK || pto_native_attach(nt, rt) != PTO_OK) {
        fprintf(stderr, "cannot create a pool and runtime\n");
        goto out;
    }
    for (t = 0; t < p->ntensors; t++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", t);
        if (pto_tensor_register(rt, name, p->shape[t][0], p->shape[t][1], 8, &tid[t]) != PTO_OK
            || pto_native_bind_tensor(nt, tid[t], mem->data[t], p->shape[t][1]) != PTO_OK) {
            goto out;
        }
    }
    for (a = 0; a < MAXA; a++) {
        if (pto_func_register(rt, kernels[a].name, &fid[a]) != PTO_OK
            || pto_native_bind_kernel(nt, fid[a], &kernels[a]) != PTO_OK) {
            goto out;
        }
    }
    if (pto_native_start(nt) != PTO_OK) {
        goto out;
    }
    c.nt = nt;
    c.after_ms = cancel_ms;
    if (cancel_ms > 0 && pthread_create(&cancel_thread, NULL, cancel_later, &c) != 0) {
        cancel_ms = 0;
    }
    for (t = 0; t < p->ntasks; t++) { /* the orchestration: submits while the workers run */
        if (pto_task_alloc(rt, fid[p->nargs[t] - 1], 0, &task) != PTO_OK) {
            break;
        }
        for (a = 0; a < p->nargs[t]; a++) {
            const access *g = &p->args[t][a];
            int (*add)(pto_runtime *, int32_t, int32_t, int64_t, int64_t, int64_t, int64_t) =
                g->kind == PTO_ARG_IN ? pto_task_add_input : g->kind == PTO_ARG_OUT ? pto_task_add_output
                                                                                    : pto_task_add_inout;
            add(rt, task, tid[g->tensor], g->r0, g->c0, g->nr, g->nc);
        }
        pto_task_add_scalar(rt, task, t);
        pto_task_add_scalar(rt, task, kinds_of(p, t));
        pto_task_submit(rt, task);
    }
    st = pto_native_work(nt);
    if (cancel_ms > 0) {
        pthread_join(cancel_thread, NULL);
    }
    pto_native_progress(nt, completed, &ftask, &ffunc, &fst);
out:
    if (rt != NULL) {
        pto_runtime_destroy(rt);
    }
    if (pool != NULL) {
        *pool = nt;
    } else if (nt != NULL) {
        pto_native_destroy(nt);
    }
    return st;
}

static int run_native(const program *p, memory *mem, int threads, int window, int cancel_ms, int64_t *completed)
{
    return run_on(NULL, p, mem, threads, window, cancel_ms, completed);
}

static int same_memory(const program *p, const memory *x, const memory *y)
{
    int t;
    for (t = 0; t < p->ntensors; t++) {
        if (memcmp(x->data[t], y->data[t], sizeof(int64_t) * (size_t)(p->shape[t][0] * p->shape[t][1])) != 0) {
            return 0;
        }
    }
    return 1;
}

/* ---------------------------------------------------------------------------------------
 * tests
 * ------------------------------------------------------------------------------------- */

static const int THREADS[] = {1, 2, 3, 4};
static const int WINDOWS[] = {0, 1, 3, 16};

static void check_program(const program *p, uint64_t seed)
{
    memory want, got;
    size_t i, j;
    memory_init(p, &want, seed);
    run_sequential(p, &want);
    for (i = 0; i < sizeof THREADS / sizeof *THREADS; i++) {
        for (j = 0; j < sizeof WINDOWS / sizeof *WINDOWS; j++) {
            int64_t completed = -1;
            int st;
            memory_init(p, &got, seed);
            st = run_native(p, &got, THREADS[i], WINDOWS[j], 0, &completed);
            g_checks++;
            if (st != PTO_OK || completed != p->ntasks || !same_memory(p, &got, &want)) {
                fprintf(stderr, "program (seed %llu, %d tasks) at %d threads, window %d: status %d, %lld completed, "
                        "memory %s\n", (unsigned long long)seed, p->ntasks, THREADS[i], WINDOWS[j], st,
                        (long long)completed, same_memory(p, &got, &want) ? "the same" : "differs");
                g_failures++;
            }
            memory_free(p, &got);
        }
    }
    memory_free(p, &want);
}

static program g_prog;

static void test_random_programs(int n)
{
    int k;
    for (k = 0; k < n; k++) {
        random_program(&g_prog);
        check_program(&g_prog, (uint64_t)k);
    }
}

static void test_chain_and_fan(void)
{
    chain_program(&g_prog, MAXTASKS);
    check_program(&g_prog, 11);
    fan_program(&g_prog, MAXTASKS);
    check_program(&g_prog, 12);
}

/* A kernel's failure: pto_native_work returns its status, the failing task is reported, every
 * task completes (the rest without running). */
static void test_kernel_failure(void)
{
    memory got;
    int64_t completed = -1;
    int st, threads;
    chain_program(&g_prog, 50);
    for (threads = 1; threads <= 3; threads++) {
        g_fail_at = 20;
        memory_init(&g_prog, &got, 5);
        st = run_native(&g_prog, &got, threads, 4, 0, &completed);
        g_fail_at = -1;
        memory_free(&g_prog, &got);
        CHECK(st == 7);
        CHECK(completed == 50);
    }
done:
    g_fail_at = -1;
}

/* pto_native_cancel from another thread during a run through a small window: every task
 * completes (most without running), pto_native_work returns PTO_ERR_STATE. */
static void test_cancel(void)
{
    memory got;
    int64_t completed = -1;
    int st;
    chain_program(&g_prog, MAXTASKS);
    g_spin = 2000000;
    memory_init(&g_prog, &got, 6);
    st = run_native(&g_prog, &got, 2, 2, 20, &completed);
    memory_free(&g_prog, &got);
    g_spin = 0;
    CHECK(st == PTO_ERR_STATE);
    CHECK(completed == MAXTASKS);
done:
    g_spin = 0;
}

/* One pool for many runs (pto_native_reuse): each random program's memory is the in-order one,
 * with the workers started once; a reuse during a run is refused. */
static void test_reuse(void)
{
    pto_native *pool = NULL;
    memory want, got;
    int k;
    for (k = 0; k < 12; k++) {
        int64_t completed = -1;
        int st, same;
        random_program(&g_prog);
        memory_init(&g_prog, &want, 100 + (uint64_t)k);
        run_sequential(&g_prog, &want);
        memory_init(&g_prog, &got, 100 + (uint64_t)k);
        st = run_on(&pool, &g_prog, &got, 3, k % 3 == 0 ? 0 : 1 + k % 5, 0, &completed);
        same = same_memory(&g_prog, &got, &want);
        memory_free(&g_prog, &got);
        memory_free(&g_prog, &want);
        CHECK(st == PTO_OK && completed == g_prog.ntasks && same);
    }
done:
    if (pool != NULL) {
        pto_native_destroy(pool);
    }
}

/* bad arguments are refused, never a crash */
static void test_refusals(void)
{
    pto_config cfg;
    pto_native *nt = NULL;
    pto_config_init(&cfg);
    CHECK(pto_native_create(&cfg, 0, &nt) == PTO_ERR_INVALID);
    CHECK(pto_native_create(NULL, 1, &nt) == PTO_ERR_INVALID);
    CHECK(pto_native_create(&cfg, 1, &nt) == PTO_OK);
    CHECK(pto_native_create(&cfg, 1, &nt) == PTO_ERR_INVALID); /* the hooks are taken */
    CHECK(pto_native_start(nt) == PTO_ERR_INVALID);            /* no runtime attached */
    CHECK(pto_native_work(nt) == PTO_ERR_INVALID);             /* not started */
    CHECK(pto_native_bind_tensor(nt, 0, &cfg, 1) == PTO_ERR_INVALID);
    CHECK(pto_native_bind_rows(nt, 0, &cfg, 16) == PTO_ERR_INVALID);
done:
    if (nt != NULL) {
        pto_native_destroy(nt);
    }
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 40;
    test_refusals();
    test_chain_and_fan();
    test_random_programs(n);
    test_kernel_failure();
    test_cancel();
    test_reuse();
    printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures != 0;
}
