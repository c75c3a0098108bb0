/* pto_native.c - the native pool: worker threads that run a task graph's InCore functions
 * compiled to C (pto/codegen/c_incore.py), taking tasks from the runtime's ready queue while
 * the orchestration (pto_NAME_build) is still submitting them.
 *
 * The pool's mutex is the runtime's lock: pto_native_create installs the sync hooks, so every
 * public runtime call of the orchestration thread takes it, and the workers take it to pop a
 * task, read its arguments and complete it (one critical section from one task to the next).
 * A kernel runs with the lock released. Three conditions:
 *
 *  - a task became ready: the unlock hook wakes an idle worker when the queue is not empty
 *    (a submit's), a completion that readies several wakes them all;
 *  - the window has room: completions notify (the runtime's notify_all hook); while the window
 *    is full the orchestration thread runs ready tasks itself instead of sleeping (the wait
 *    hook), so a pool of one thread, or workers all busy, never stalls it;
 *  - everything is done: pto_native_work (the orchestration thread, when its build returned)
 *    clears `building`; when the last submitted task completes every worker leaves the run and
 *    parks, until pto_native_reuse and pto_native_start begin another (its threads and scratch
 *    kept: a replay starts no thread) or pto_native_destroy joins them.
 *
 * A kernel's failure (a non-zero status) or pto_native_cancel switches the pool to draining:
 * the tasks not yet started complete without running, so the build (blocked on the window or
 * not) runs to its end and every thread leaves; pto_native_work reports the first failure.
 */

#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pto_runtime_internal.h"

typedef struct {
    char *data;
    int64_t ld, rows, cols;
    int32_t elem_size;
    int32_t packed; /* rows of packed blocks: ld is bytes, a region starts at its row */
} nt_tensor;

/* a worker's start: the pool and the worker's number */
typedef struct {
    pto_native *nt;
    int64_t thread;
} nt_start;

struct pto_native {
    pthread_mutex_t mutex;
    pthread_cond_t room; /* the window has room (the orchestration thread waits here) */
    pthread_cond_t work; /* a task is ready, or the pool is done (idle workers wait here) */
    pto_runtime *rt;
    int32_t threads, spawned, idle;
    pthread_t *tids;
    nt_start *starts;
    nt_tensor *tensors;
    int32_t n_tensors;
    const pto_kernel_info **kernels;
    int32_t n_kernels;
    int64_t scratch_floats; /* the largest kernel's */
    int32_t max_args;
    float *own_scratch; /* the orchestration thread's, for the tasks it runs */
    void *own_block;
    int64_t own_floats, own_args; /* what own_block was made for */
    int started, building, draining, exiting;
    int64_t generation; /* runs started: a parked worker wakes for the next (pto_native_reuse) */
    int64_t done_gen;   /* the last run whose every task completed (a run is done when it is this one) */
    int64_t completed;
    int32_t fail_task, fail_func, fail_status;
    int64_t *records; /* pto_native_record: 5 per task run (task, func, thread, start, end) */
    int64_t n_records, cap_records;
};

/* a worker's buffers: its scratch, one task's arguments as the runtime stores them and as the
 * kernel takes them */
typedef struct {
    void *block;
    float *scratch;
    pto_arg *args;
    pto_region *mems;
    int64_t *scalars;
    int64_t thread; /* 0: the orchestration thread, 1..threads-1: the workers */
} nt_room;


static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int32_t ready_now(const pto_runtime *rt)
{
    return (int32_t)(rt->rq_tail - rt->rq_head);
}

/* ---------------------------------------------------------------------------------------
 * the runtime's sync hooks
 * ------------------------------------------------------------------------------------- */

static void hook_lock(void *ctx)
{
    pthread_mutex_lock(&((pto_native *)ctx)->mutex);
}

/* A call of the orchestration thread ends: a task it submitted may be ready. */
static void hook_unlock(void *ctx)
{
    pto_native *nt = ctx;
    if (nt->idle > 0 && nt->rt != NULL && ready_now(nt->rt) > 0) {
        pthread_cond_signal(&nt->work);
    }
    pthread_mutex_unlock(&nt->mutex);
}

static int run_one(pto_native *nt, nt_room *room);

/* pto_task_alloc finds the window full (the lock is held): run a ready task here, or sleep
 * until a completion makes room. The runtime re-checks the window after the return. */
static void hook_wait(void *ctx)
{
    pto_native *nt = ctx;
    nt_room room;
    if (nt->started && ready_now(nt->rt) > 0) {
        room.scratch = nt->own_scratch;
        room.args = (pto_arg *)(void *)(nt->own_scratch + nt->scratch_floats);
        room.mems = (pto_region *)(void *)(room.args + nt->max_args);
        room.scalars = (int64_t *)(void *)(room.mems + nt->max_args);
        room.thread = 0;
        run_one(nt, &room);
        return;
    }
    pthread_cond_wait(&nt->room, &nt->mutex);
}

static void hook_notify_all(void *ctx)
{
    pthread_cond_broadcast(&((pto_native *)ctx)->room);
}

/* ---------------------------------------------------------------------------------------
 * running tasks (the lock held on entry and exit)
 * ------------------------------------------------------------------------------------- */

static void fail(pto_native *nt, int32_t task, int32_t func, int status)
{
    if (nt->fail_status == PTO_OK) {
        nt->fail_task = task;
        nt->fail_func = func;
        nt->fail_status = status;
    }
    nt->draining = 1;
}

/* The kernel's arguments from the runtime's records; PTO_ERR_INVALID for a tensor without a
 * binding or arguments the kernel does not take. */
static int unpack(pto_native *nt, const pto_kernel_info *k, nt_room *room, int32_t n)
{
    int32_t a, nm = 0, ns = 0;
    for (a = 0; a < n; a++) {
        const pto_arg *g = &room->args[a];
        if (g->kind == PTO_ARG_SCALAR) {
            if (ns == k->n_scalars) {
                return PTO_ERR_INVALID;
            }
            room->scalars[ns++] = g->scalar;
        } else {
            const nt_tensor *t;
            pto_region *r;
            if (nm == k->n_mems || g->tensor < 0 || g->tensor >= nt->n_tensors || nt->tensors[g->tensor].data == NULL) {
                return PTO_ERR_INVALID;
            }
            t = &nt->tensors[g->tensor];
            r = &room->mems[nm++];
            r->origin = t->packed ? t->data + g->row0 * t->ld : t->data + (g->row0 * t->ld + g->col0) * t->elem_size;
            r->ld = t->ld;
            r->rows = g->rows;
            r->cols = g->cols;
            r->row0 = g->row0;
            r->col0 = g->col0;
            r->trows = t->rows;
            r->tcols = t->cols;
        }
    }
    return nm == k->n_mems && ns == k->n_scalars ? PTO_OK : PTO_ERR_INVALID;
}

/* Pop a ready task, run it (unlocked) unless the pool drains, complete it. */
static int run_one(pto_native *nt, nt_room *room)
{
    pto_runtime *rt = nt->rt;
    const pto_kernel_info *k = NULL;
    int32_t id, got = 0, n = 0, func;
    int st;
    if (rt->broken || ptoi_ready_pop(rt, &id, 1, &got) != PTO_OK || got != 1) {
        fail(nt, -1, -1, rt->broken ? rt->fail_st : PTO_ERR_STATE);
        return PTO_ERR_STATE;
    }
    func = slot_at(rt, id)->func;
    if (!nt->draining) {
        k = func >= 0 && func < nt->n_kernels ? nt->kernels[func] : NULL;
        st = k == NULL ? PTO_ERR_UNKNOWN_FUNC : ptoi_task_args(rt, id, room->args, nt->max_args, &n);
        if (st == PTO_OK && n > nt->max_args) {
            st = PTO_ERR_LIMIT;
        }
        if (st == PTO_OK) {
            st = unpack(nt, k, room, n);
        }
        if (st == PTO_OK) {
            const int64_t t0 = nt->records != NULL ? now_ns() : 0;
            pthread_mutex_unlock(&nt->mutex);
            st = k->fn(room->mems, room->scalars, room->scratch);
            pthread_mutex_lock(&nt->mutex);
            if (nt->records != NULL && nt->n_records < nt->cap_records) {
                int64_t *r = nt->records + 5 * nt->n_records++;
                r[0] = id;
                r[1] = func;
                r[2] = room->thread;
                r[3] = t0;
                r[4] = now_ns();
            }
        }
        if (st != PTO_OK) {
            fail(nt, id, func, st);
        }
    }
    st = ptoi_complete_many(rt, &id, 1);
    if (st != PTO_OK) {
        fail(nt, id, func, st);
        return st;
    }
    nt->completed++;
    if (nt->idle > 0 && ready_now(rt) > 1) {
        pthread_cond_broadcast(&nt->work);
    }
    return PTO_OK;
}

/* Run tasks until the pool is done (the lock held on entry and exit). */
static void work_loop(pto_native *nt, nt_room *room)
{
    pto_runtime *rt = nt->rt;
    const int64_t generation = nt->generation;
    for (;;) {
        if (nt->done_gen == generation || nt->generation != generation) {
            return;
        }
        if (ready_now(rt) > 0) {
            if (run_one(nt, room) != PTO_OK) { /* the runtime itself failed: nothing more completes */
                nt->done_gen = generation;
                pthread_cond_broadcast(&nt->work);
                pthread_cond_broadcast(&nt->room);
                return;
            }
            continue;
        }
        if (!nt->building && rt->completed == rt->submitted) {
            nt->done_gen = generation;
            pthread_cond_broadcast(&nt->work);
            return;
        }
        nt->idle++;
        pthread_cond_wait(&nt->work, &nt->mutex);
        nt->idle--;
    }
}

static int room_init(pto_native *nt, nt_room *room, void **block)
{
    /* scratch (64-byte aligned), then the argument records, regions and scalars */
    size_t bytes = sizeof(float) * (size_t)nt->scratch_floats + 64
                   + (size_t)nt->max_args * (sizeof(pto_arg) + sizeof(pto_region) + sizeof(int64_t));
    char *p = malloc(bytes);
    if (p == NULL) {
        return PTO_ERR_NO_MEMORY;
    }
    *block = p;
    room->scratch = (float *)(void *)(p + ((64 - (uintptr_t)p % 64) % 64));
    room->args = (pto_arg *)(void *)(room->scratch + nt->scratch_floats);
    room->mems = (pto_region *)(void *)(room->args + nt->max_args);
    room->scalars = (int64_t *)(void *)(room->mems + nt->max_args);
    return PTO_OK;
}

/* A worker: each run's work loop, parked between runs until pto_native_destroy. */
static void *worker(void *arg)
{
    pto_native *nt = ((nt_start *)arg)->nt;
    nt_room room;
    void *block = NULL;
    int64_t seen = 0, floats = -1, args = -1;
    pthread_mutex_lock(&nt->mutex);
    for (;;) {
        while (!nt->exiting && nt->generation == seen) {
            pthread_cond_wait(&nt->work, &nt->mutex);
        }
        if (nt->exiting) {
            break;
        }
        seen = nt->generation;
        if (nt->scratch_floats > floats || nt->max_args > args) { /* another program's kernels */
            free(block);
            block = NULL;
            if (room_init(nt, &room, &block) != PTO_OK) { /* one worker fewer: the others carry on */
                break;
            }
            floats = nt->scratch_floats;
            args = nt->max_args;
        }
        room.thread = ((nt_start *)arg)->thread;
        work_loop(nt, &room);
    }
    pthread_mutex_unlock(&nt->mutex);
    free(block);
    return NULL;
}

/* ---------------------------------------------------------------------------------------
 * the API
 * ------------------------------------------------------------------------------------- */

static void install_hooks(pto_native *nt, pto_config *cfg)
{
    cfg->sync_ctx = nt;
    cfg->lock = hook_lock;
    cfg->unlock = hook_unlock;
    cfg->wait = hook_wait;
    cfg->notify_all = hook_notify_all;
}

int pto_native_create(pto_config *cfg, int32_t threads, pto_native **out)
{
    pto_native *nt;
    if (cfg == NULL || out == NULL || threads < 1 || cfg->sync_ctx != NULL || cfg->lock != NULL) {
        return PTO_ERR_INVALID;
    }
    nt = calloc(1, sizeof *nt);
    if (nt == NULL) {
        return PTO_ERR_NO_MEMORY;
    }
    if (pthread_mutex_init(&nt->mutex, NULL) != 0) {
        free(nt);
        return PTO_ERR_NO_MEMORY;
    }
    if (pthread_cond_init(&nt->room, NULL) != 0) {
        pthread_mutex_destroy(&nt->mutex);
        free(nt);
        return PTO_ERR_NO_MEMORY;
    }
    if (pthread_cond_init(&nt->work, NULL) != 0) {
        pthread_cond_destroy(&nt->room);
        pthread_mutex_destroy(&nt->mutex);
        free(nt);
        return PTO_ERR_NO_MEMORY;
    }
    nt->threads = threads;
    nt->building = 1;
    nt->fail_task = -1;
    nt->fail_func = -1;
    nt->own_floats = nt->own_args = -1;
    install_hooks(nt, cfg);
    *out = nt;
    return PTO_OK;
}

int pto_native_reuse(pto_native *nt, pto_config *cfg)
{
    if (nt == NULL || cfg == NULL || cfg->sync_ctx != NULL || cfg->lock != NULL) {
        return PTO_ERR_INVALID;
    }
    pthread_mutex_lock(&nt->mutex);
    if (nt->started && nt->done_gen != nt->generation) { /* a run under way */
        pthread_mutex_unlock(&nt->mutex);
        return PTO_ERR_STATE;
    }
    nt->rt = NULL;
    nt->started = nt->draining = 0;
    nt->building = 1;
    nt->completed = 0;
    nt->fail_task = nt->fail_func = -1;
    nt->fail_status = PTO_OK;
    nt->n_records = 0;
    pthread_mutex_unlock(&nt->mutex);
    install_hooks(nt, cfg);
    return PTO_OK;
}

int pto_native_attach(pto_native *nt, pto_runtime *rt)
{
    if (nt == NULL || rt == NULL || nt->rt != NULL || rt->cfg.sync_ctx != nt) {
        return PTO_ERR_INVALID;
    }
    nt->rt = rt;
    return PTO_OK;
}

static int bind(pto_native *nt, int32_t tensor, void *data, int64_t ld, int32_t packed)
{
    const pto_tensor *t;
    int32_t cap;
    if (nt == NULL || nt->rt == NULL || nt->started || data == NULL || tensor < 0 || tensor >= nt->rt->n_tensors) {
        return PTO_ERR_INVALID;
    }
    t = &nt->rt->tensors[tensor];
    if (packed ? ld <= 0 : ld < t->cols) {
        return PTO_ERR_INVALID;
    }
    if (tensor >= nt->n_tensors) {
        nt_tensor *grown;
        cap = nt->rt->n_tensors;
        grown = realloc(nt->tensors, sizeof *grown * (size_t)cap);
        if (grown == NULL) {
            return PTO_ERR_NO_MEMORY;
        }
        memset(grown + nt->n_tensors, 0, sizeof *grown * (size_t)(cap - nt->n_tensors));
        nt->tensors = grown;
        nt->n_tensors = cap;
    }
    nt->tensors[tensor].data = data;
    nt->tensors[tensor].ld = ld;
    nt->tensors[tensor].rows = t->rows;
    nt->tensors[tensor].cols = t->cols;
    nt->tensors[tensor].elem_size = t->elem_size;
    nt->tensors[tensor].packed = packed;
    return PTO_OK;
}

int pto_native_bind_tensor(pto_native *nt, int32_t tensor, void *data, int64_t ld)
{
    return bind(nt, tensor, data, ld, 0);
}

int pto_native_bind_rows(pto_native *nt, int32_t tensor, void *data, int64_t row_bytes)
{
    return bind(nt, tensor, data, row_bytes, 1);
}

int pto_native_bind_kernel(pto_native *nt, int32_t func, const pto_kernel_info *info)
{
    if (nt == NULL || nt->rt == NULL || nt->started || info == NULL || info->fn == NULL || func < 0
        || func >= nt->rt->n_funcs || info->n_mems < 0 || info->n_scalars < 0 || info->scratch_floats < 0) {
        return PTO_ERR_INVALID;
    }
    if (func >= nt->n_kernels) {
        const pto_kernel_info **grown = realloc(nt->kernels, sizeof *grown * (size_t)nt->rt->n_funcs);
        if (grown == NULL) {
            return PTO_ERR_NO_MEMORY;
        }
        memset(grown + nt->n_kernels, 0, sizeof *grown * (size_t)(nt->rt->n_funcs - nt->n_kernels));
        nt->kernels = grown;
        nt->n_kernels = nt->rt->n_funcs;
    }
    nt->kernels[func] = info;
    if (info->scratch_floats > nt->scratch_floats) {
        nt->scratch_floats = info->scratch_floats;
    }
    if (info->n_mems + info->n_scalars > nt->max_args) {
        nt->max_args = info->n_mems + info->n_scalars;
    }
    return PTO_OK;
}

int pto_native_start(pto_native *nt)
{
    nt_room room;
    int32_t k;
    if (nt == NULL || nt->rt == NULL || nt->started) {
        return PTO_ERR_INVALID;
    }
    if (nt->scratch_floats > nt->own_floats || nt->max_args > nt->own_args) {
        free(nt->own_block);
        nt->own_block = NULL;
        if (room_init(nt, &room, &nt->own_block) != PTO_OK) {
            return PTO_ERR_NO_MEMORY;
        }
        nt->own_scratch = room.scratch;
        nt->own_floats = nt->scratch_floats;
        nt->own_args = nt->max_args;
    }
    if (nt->tids == NULL) {
        nt->tids = calloc((size_t)nt->threads, sizeof *nt->tids);
        nt->starts = calloc((size_t)nt->threads, sizeof *nt->starts);
        if (nt->tids == NULL || nt->starts == NULL) {
            return PTO_ERR_NO_MEMORY;
        }
    }
    pthread_mutex_lock(&nt->mutex);
    nt->started = 1;
    nt->generation++;
    if (nt->spawned > 0 || nt->threads == 1) { /* the workers of an earlier run: wake them */
        pthread_cond_broadcast(&nt->work);
        pthread_mutex_unlock(&nt->mutex);
        return PTO_OK;
    }
    for (k = 0; k < nt->threads - 1; k++) {
        nt->starts[k].nt = nt;
        nt->starts[k].thread = k + 1;
        if (pthread_create(&nt->tids[nt->spawned], NULL, worker, &nt->starts[k]) != 0) {
            break; /* fewer workers: the orchestration thread runs tasks when the window fills */
        }
        nt->spawned++;
    }
    pthread_mutex_unlock(&nt->mutex);
    return PTO_OK;
}

static void join_all(pto_native *nt)
{
    int32_t k, n;
    pthread_mutex_lock(&nt->mutex);
    n = nt->spawned;
    nt->spawned = 0;
    nt->exiting = 1;
    pthread_cond_broadcast(&nt->work);
    pthread_mutex_unlock(&nt->mutex);
    for (k = 0; k < n; k++) {
        pthread_join(nt->tids[k], NULL);
    }
}

int pto_native_work(pto_native *nt)
{
    nt_room room;
    int st;
    if (nt == NULL || !nt->started || !nt->building) {
        return PTO_ERR_INVALID;
    }
    room.scratch = nt->own_scratch;
    room.args = (pto_arg *)(void *)(nt->own_scratch + nt->scratch_floats);
    room.mems = (pto_region *)(void *)(room.args + nt->max_args);
    room.scalars = (int64_t *)(void *)(room.mems + nt->max_args);
    room.thread = 0;
    pthread_mutex_lock(&nt->mutex);
    nt->building = 0;
    pthread_cond_broadcast(&nt->work);
    work_loop(nt, &room);
    st = nt->fail_status != PTO_OK ? nt->fail_status : nt->draining ? PTO_ERR_STATE : PTO_OK;
    pthread_mutex_unlock(&nt->mutex);
    return st; /* the workers park until the next run (pto_native_reuse) or pto_native_destroy */
}

int pto_native_record(pto_native *nt, int64_t capacity)
{
    if (nt == NULL || nt->started || capacity < 0 || capacity > INT64_MAX / 40) {
        return PTO_ERR_INVALID;
    }
    free(nt->records);
    nt->records = NULL;
    nt->n_records = nt->cap_records = 0;
    if (capacity > 0) {
        nt->records = malloc(sizeof *nt->records * 5 * (size_t)capacity);
        if (nt->records == NULL) {
            return PTO_ERR_NO_MEMORY;
        }
        nt->cap_records = capacity;
    }
    return PTO_OK;
}

int pto_native_records(pto_native *nt, int64_t *out, int64_t max, int64_t *n)
{
    if (nt == NULL || n == NULL || max < 0 || (out == NULL && max > 0)) {
        return PTO_ERR_INVALID;
    }
    pthread_mutex_lock(&nt->mutex);
    *n = nt->n_records;
    if (max > 0) {
        memcpy(out, nt->records, sizeof *out * 5 * (size_t)(max < nt->n_records ? max : nt->n_records));
    }
    pthread_mutex_unlock(&nt->mutex);
    return PTO_OK;
}

int pto_native_cancel(pto_native *nt)
{
    if (nt == NULL) {
        return PTO_ERR_INVALID;
    }
    pthread_mutex_lock(&nt->mutex);
    nt->draining = 1;
    pthread_cond_broadcast(&nt->work);
    pthread_cond_broadcast(&nt->room);
    pthread_mutex_unlock(&nt->mutex);
    return PTO_OK;
}

int pto_native_progress(pto_native *nt, int64_t *completed, int32_t *task, int32_t *func, int32_t *status)
{
    if (nt == NULL || completed == NULL || task == NULL || func == NULL || status == NULL) {
        return PTO_ERR_INVALID;
    }
    pthread_mutex_lock(&nt->mutex);
    *completed = nt->completed;
    *task = nt->fail_task;
    *func = nt->fail_func;
    *status = nt->fail_status;
    pthread_mutex_unlock(&nt->mutex);
    return PTO_OK;
}

/* The order: pto_native_work (every task has completed), pto_runtime_destroy (it may call the
 * hooks until then), then pto_native_reuse for another run or pto_native_destroy, which stops
 * the workers. A pool whose pto_native_work was never called drains here, so call this before
 * the runtime's destroy then. */
int pto_native_destroy(pto_native *nt)
{
    if (nt == NULL) {
        return PTO_ERR_INVALID;
    }
    if (nt->started && nt->building) {
        pthread_mutex_lock(&nt->mutex);
        nt->draining = 1;
        nt->done_gen = nt->generation;
        pthread_cond_broadcast(&nt->work);
        pthread_mutex_unlock(&nt->mutex);
    }
    join_all(nt);
    pthread_cond_destroy(&nt->work);
    pthread_cond_destroy(&nt->room);
    pthread_mutex_destroy(&nt->mutex);
    free(nt->tids);
    free(nt->starts);
    free(nt->records);
    free(nt->tensors);
    free(nt->kernels);
    free(nt->own_block);
    free(nt);
    return PTO_OK;
}
