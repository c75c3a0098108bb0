/* pto_task.c - the task life cycle of the PTO runtime: pto_task_alloc, pto_task_add_*,
 * pto_task_submit (the graph-building hot path), the ready queue, completion and
 * retirement.
 *
 * The hot path stays in this one file: the public building calls inline their fast paths
 * (task_add and the helpers of pto_runtime_internal.h) and reach everything else by a plain
 * jump, so a tile argument costs no call and no stack frame (docs/PERF.md).
 */

#include <inttypes.h>
#include <stdio.h>

#include "pto_runtime_internal.h"

/* ---------------------------------------------------------------------------------------
 * ready queue (a growable ring; it never drops a task)
 * ------------------------------------------------------------------------------------- */

static int rq_push(pto_runtime *rt, int32_t id)
{
    if (rt->rq_tail - rt->rq_head == rt->rq_cap) {
        uint32_t ncap = rt->rq_cap ? rt->rq_cap * 2 : 64;
        uint32_t k;
        int32_t *nq = mem_alloc(rt, ncap * sizeof *nq);
        if (nq == NULL) {
            return ptoi_oom(rt, "ready queue");
        }
        for (k = rt->rq_head; k != rt->rq_tail; k++) {
            nq[k & (ncap - 1)] = rt->rq[k & (rt->rq_cap - 1)];
        }
        mem_free(rt, rt->rq, rt->rq_cap * sizeof *rt->rq);
        rt->rq = nq;
        rt->rq_cap = ncap;
    }
    rt->rq[rt->rq_tail & (rt->rq_cap - 1)] = id;
    rt->rq_tail++;
    return PTO_OK;
}

/* ---------------------------------------------------------------------------------------
 * building: alloc, add, submit
 * ------------------------------------------------------------------------------------- */

static const char *state_name(int state)
{
    switch (state) {
    case PTO_TASK_OPEN: return "open (allocated, not submitted)";
    case PTO_TASK_SUBMITTED: return "submitted (waiting for predecessors)";
    case PTO_TASK_READY: return "ready (queued, not popped)";
    case PTO_TASK_RUNNING: return "running (popped)";
    case PTO_TASK_COMPLETED: return "completed";
    default: return "retired";
    }
}

static const char *func_name(const pto_runtime *rt, int32_t f)
{
    return (f >= 0 && f < rt->n_funcs) ? rt->names + rt->funcs[f] : "?";
}

/* Message for an add/submit on a task that is not the open one. */
PTO_COLD static int not_open_error(pto_runtime *rt, int32_t task, const char *what)
{
    if (rt->broken) {
        return ptoi_broken_error(rt);
    }
    if (task < 0 || task >= rt->next_id) {
        return ptoi_fail(rt, PTO_ERR_UNKNOWN_TASK, "%s: unknown task id %d (%d tasks allocated)", what, task,
                         rt->next_id);
    }
    if (task < rt->retired) {
        return ptoi_fail(rt, PTO_ERR_STATE, "%s: task %d was already submitted (it has retired)", what, task);
    }
    if (rt->cfg.count_only) {
        return ptoi_fail(rt, PTO_ERR_STATE, "%s: task %d was already submitted", what, task);
    }
    return ptoi_fail(rt, PTO_ERR_STATE, "%s: task %d (%s) was already submitted; its state is %s", what, task,
                     func_name(rt, slot_at(rt, task)->func), state_name(slot_at(rt, task)->state));
}

PTO_COLD static int alloc_error(pto_runtime *rt, int32_t func, int32_t buffer_bytes, int32_t *out)
{
    if (rt->broken) {
        return ptoi_broken_error(rt);
    }
    if (out == NULL) {
        return ptoi_fail(rt, PTO_ERR_INVALID, "pto_task_alloc: NULL output pointer");
    }
    if (func < 0 || func >= rt->n_funcs) {
        return ptoi_fail(rt, PTO_ERR_UNKNOWN_FUNC, "pto_task_alloc: unknown function id %d (%d functions registered)",
                         func, rt->n_funcs);
    }
    if (buffer_bytes < 0) {
        return ptoi_fail(rt, PTO_ERR_INVALID, "pto_task_alloc: negative buffer_bytes %d for function '%s'",
                         buffer_bytes, func_name(rt, func));
    }
    if (rt->open_task >= 0) {
        return ptoi_fail(rt, PTO_ERR_STATE, "pto_task_alloc: task %d (%s) is still open; submit it before allocating "
                         "another task", rt->open_task,
                         func_name(rt, rt->cfg.count_only ? rt->count_func : slot_at(rt, rt->open_task)->func));
    }
    return ptoi_fail(rt, PTO_ERR_LIMIT, "pto_task_alloc: task ids exhausted (%d tasks)", INT32_MAX);
}

/* Fill the slot of the new task id and make it the open task. */
static PTO_INLINE void slot_init(pto_runtime *rt, pto_slot *s, int32_t id, int32_t func, int32_t buffer_bytes)
{
    s->func = func;
    s->state = PTO_TASK_OPEN;
    s->buffer_bytes = buffer_bytes;
    s->arg_begin = (uint32_t)rt->arg_count;
    s->fanout = -1;
    /* Successors have larger ids, so the task's own id here makes edge_add skip the task
     * itself: a task never depends on itself. */
    s->last_succ = id;
    s->fanin = 0;
    s->pending = 0;
    rt->open_task = id;
    rt->next_id = id + 1;
}

/* Everything but pto_task_alloc's fast path: errors, count_only, the lock, a full window
 * (wait or refuse), the first slot of a chunk. Opens the slot window for the fast path. */
PTO_COLD static int task_alloc_slow(pto_runtime *rt, int32_t func, int32_t buffer_bytes, int32_t *out)
{
    pto_slot *s;
    int32_t id;
    int64_t avail;
    int st;
    if (out == NULL || (uint32_t)func >= (uint32_t)rt->n_funcs || buffer_bytes < 0 || rt->open_task >= 0
        || rt->next_id == INT32_MAX || rt->broken) {
        return alloc_error(rt, func, buffer_bytes, out);
    }
    if (rt->cfg.count_only) {
        rt->count_func = func;
        *out = rt->open_task = rt->next_id++;
        return PTO_OK;
    }
    /* A windowed runtime sweeps the tensor map now and then (gc_at stays at INT64_MAX
     * without a window); this slow path runs at least once per chunk of slots. */
    if (rt->ent_live > rt->gc_at) {
        ptoi_map_gc(rt);
    }
    while (rt->cfg.window > 0 && rt->next_id - rt->retired >= rt->cfg.window) {
        if (rt->cfg.wait == NULL) {
            return ptoi_fail(rt, PTO_ERR_WINDOW_FULL, "pto_task_alloc: task window full: all %d slots hold live tasks "
                             "(ids %d..%d); oldest task %d is %s; complete tasks to retire them (a task retires when "
                             "it and every earlier task completed)", rt->cfg.window, rt->retired, rt->next_id - 1,
                             rt->retired, state_name(slot_at(rt, rt->retired)->state));
        }
        rt->cfg.wait(rt->cfg.sync_ctx);
    }
    id = rt->next_id;
    if ((uint32_t)id == rt->slots.end && (st = ptoi_chunks_push(rt, &rt->slots, "task slots")) != PTO_OK) {
        return st;
    }
    s = slot_at(rt, id);
    /* The fast path's window: the rest of this chunk, never past the last usable id or the
     * task window, and empty under a lock (the locked calls take this path). */
    avail = (int64_t)(uint32_t)(rt->slots.end - (uint32_t)id) - 1;
    if (avail > (int64_t)INT32_MAX - 2 - id) {
        avail = (int64_t)INT32_MAX - 2 - id;
    }
    if (rt->cfg.window > 0 && avail > (int64_t)rt->cfg.window - (id + 1 - rt->retired)) {
        avail = (int64_t)rt->cfg.window - (id + 1 - rt->retired);
    }
    if (avail < 0 || rt->cfg.lock != NULL) {
        avail = 0;
    }
    rt->slot_next = s + 1;
    rt->slot_end = s + 1 + avail;
    slot_init(rt, s, id, func, buffer_bytes);
    rt->add_task = rt->cfg.lock == NULL ? id : -1;
    *out = id;
    return PTO_OK;
}

/* The end offset `start + extent` of a region (extent >= 1) as decimal text, exact where the
 * sum passes INT64_MAX (it is at most 2^64 - 2 then), so a message shows the region the
 * caller asked for and never a wrapped sum. */
static const char *region_end(char *buf, size_t size, int64_t start, int64_t extent)
{
    if (start > INT64_MAX - extent) {
        snprintf(buf, size, "%" PRIu64, (uint64_t)start + (uint64_t)extent);
    } else {
        snprintf(buf, size, "%" PRId64, start + extent);
    }
    return buf;
}

/* The message and status for a region argument that ptoi_add_general refuses: a task that is
 * not open, an unknown tensor, an extent below 1 or a region outside the tensor. */
PTO_COLD int ptoi_add_error(pto_runtime *rt, int32_t task, int32_t tensor, int kind, int64_t r0, int64_t c0,
                            int64_t nr, int64_t nc)
{
    static const char *const kinds[] = {"input", "output", "inout"};
    const pto_tensor *t;
    const char *f, *tn;
    char r1[24], c1[24];
    if (task != rt->open_task || task < 0) {
        return not_open_error(rt, task, "add region");
    }
    if (tensor < 0 || tensor >= rt->n_tensors) {
        return ptoi_fail(rt, PTO_ERR_UNKNOWN_TENSOR, "task %d: unknown tensor id %d (%d tensors registered)", task,
                         tensor, rt->n_tensors);
    }
    t = &rt->tensors[tensor];
    f = func_name(rt, rt->cfg.count_only ? rt->count_func : slot_at(rt, task)->func);
    tn = rt->names + t->name;
    if (nr <= 0 || nc <= 0) {
        return ptoi_fail(rt, PTO_ERR_REGION, "task %d (%s) %s on tensor '%s': region extent %" PRId64 " x %" PRId64
                         " must be positive", task, f, kinds[kind], tn, nr, nc);
    }
    return ptoi_fail(rt, PTO_ERR_REGION, "task %d (%s) %s on tensor '%s': region rows %" PRId64 "..%s x cols %" PRId64
                     "..%s is outside the tensor (%d x %d)", task, f, kinds[kind], tn, r0,
                     region_end(r1, sizeof r1, r0, nr), c0, region_end(c1, sizeof c1, c0, nc), t->rows, t->cols);
}

/* task_add's answers past PTO_OK: the caller goes on with ptoi_exact_slow or with add_slow (a
 * plain jump either way, as both take the caller's arguments or fewer). */
enum { ADD_EXACT_SLOW = 1, ADD_NOT_FAST = 2 };

/* Called once per region argument; inlined into each public entry point, so `kind` is a
 * constant. The fast path takes a region that is one whole grid cell of a simple tensor
 * (see pto_tensor): its checks also prove the region inside the tensor, and the cell's list
 * is all the map work. When that list is one entry of exactly the cell (the tile it was
 * written or read as before) and at most two edges are due, it is handled here, straight
 * through with no call (so the public entry points need no stack frame); other exact-cell
 * arguments return ADD_EXACT_SLOW, and everything else (and any call under a lock, where
 * add_task stays -1) ADD_NOT_FAST. The record is committed first: ptoi_exact_slow reads
 * the argument back from it. */
static PTO_INLINE int task_add(pto_runtime *rt, int32_t task, int32_t tensor, int kind, int64_t r0, int64_t c0,
                               int64_t nr, int64_t nc)
{
    pto_tensor *t;
    pto_argrec *a;
    pto_entry *e;
    pto_slot *ts, *ws;
    int32_t i;
    if (rt == NULL || (int64_t)(uint32_t)task != rt->add_task || (uint32_t)tensor >= (uint32_t)rt->n_tensors) {
        return ADD_NOT_FAST;
    }
    t = &rt->tensors[tensor];
    a = rt->arg_next;
    if (nr != t->ex_rows || nc != t->ex_cols || (uint64_t)r0 >= t->ex_rlim || (uint64_t)c0 >= t->ex_clim
        || ((uint32_t)r0 & t->ex_rmask) != 0 || ((uint32_t)c0 & t->ex_cmask) != 0 || a == rt->arg_end) {
        return ADD_NOT_FAST;
    }
    a->tk = (tensor << 2) | kind;
    a->r0 = (int32_t)r0;
    a->c0 = (int32_t)c0;
    a->nr = (int32_t)nr;
    a->nc = (int32_t)nc;
    rt->arg_next = a + 1;
    rt->arg_count++;
    i = t->cells[(size_t)(((uint64_t)r0 * t->ex_rmul + (uint64_t)c0 * t->ex_cmul) >> 32)];
    if (i < 0) {
        return ADD_EXACT_SLOW;
    }
    e = &rt->ent[i];
    if (!alone_whole(e)) {
        return ADD_EXACT_SLOW;
    }
    ts = open_slot(rt);
    ws = e->wslot;
    if (kind == PTO_ARG_IN) {
        /* Edge from the writer (unless none, retired or already linked), then join the
         * run of readers: its next term, or the first reader of an empty run. */
        if (task - e->last != e->step && e->last >= 0) {
            return ADD_EXACT_SLOW;
        }
        if (e->writer >= rt->retired && ws->last_succ != task) {
            if (rt->ebump == rt->elim) {
                return ADD_EXACT_SLOW;
            }
            edge_add_room(rt, ws, task, ts);
        }
        if (e->last < 0) {
            e->first = task;
        }
        e->last = task;
        return PTO_OK;
    } else {
        /* Edges from the writer and a single live reader, then the task is the writer. */
        pto_slot *rs = NULL;
        if (e->last >= rt->retired) {
            if (e->first != e->last) {
                return ADD_EXACT_SLOW;
            }
            rs = slot_at(rt, e->last);
        }
        if (rt->elim - rt->ebump < 2) {
            return ADD_EXACT_SLOW;
        }
        if (e->writer >= rt->retired && ws->last_succ != task) {
            edge_add_room(rt, ws, task, ts);
        }
        if (rs != NULL && rs->last_succ != task) {
            edge_add_room(rt, rs, task, ts);
        }
        e->writer = task;
        e->wslot = ts;
        e->last = -1;
        e->step = 0;
        return PTO_OK;
    }
}

static int task_add_scalar(pto_runtime *rt, int32_t task, int64_t value)
{
    pto_argrec *a = NULL;
    uint64_t u = (uint64_t)value;
    int st;
    if (task != rt->open_task || task < 0) {
        return not_open_error(rt, task, "add scalar");
    }
    if (rt->cfg.count_only) {
        rt->scalars++;
        return PTO_OK;
    }
    if ((st = next_arg(rt, &a)) != PTO_OK) {
        ptoi_set_broken(rt, st);
        return st;
    }
    a->tk = PTO_ARG_SCALAR;
    a->r0 = (int32_t)(uint32_t)(u & 0xffffffffu);
    a->c0 = (int32_t)(uint32_t)(u >> 32);
    a->nr = a->nc = 0;
    arg_done(rt);
    rt->scalars++;
    return PTO_OK;
}

/* The end of a submit of a task with no pending predecessor: it goes to the ready queue. */
PTO_NOINLINE static int submit_ready(pto_runtime *rt, int32_t task, pto_slot *ts)
{
    ts->state = PTO_TASK_READY;
    return rq_push(rt, task);
}

/* Submit past pto_task_submit's fast path: errors, count_only, the lock. */
static int task_submit(pto_runtime *rt, int32_t task)
{
    pto_slot *ts;
    if (task != rt->open_task || task < 0) {
        return not_open_error(rt, task, "submit");
    }
    rt->submitted++;
    rt->open_task = -1;
    rt->add_task = -1;
    if (rt->cfg.count_only) {
        return PTO_OK;
    }
    /* The dependencies were resolved argument by argument; the task now waits for the
     * predecessors that have not completed (see pto_slot). */
    ts = open_slot(rt);
    ts->pending += ts->fanin;
    if (ts->pending == 0) {
        return submit_ready(rt, task, ts);
    }
    ts->state = PTO_TASK_SUBMITTED;
    return PTO_OK;
}

/* ---------------------------------------------------------------------------------------
 * executing: ready queue, completion, retirement
 * ------------------------------------------------------------------------------------- */

/* Retire completed tasks in id order: free their edges, argument records and slots. */
static void retire_completed(pto_runtime *rt)
{
    while (rt->retired < rt->next_id) {
        pto_slot *s = slot_at(rt, rt->retired);
        uint32_t tail;
        if (s->state != PTO_TASK_COMPLETED) {
            break;
        }
        if (s->fanout >= 0) {
            int32_t i = s->fanout, n = 1;
            pto_edge *e = edge_at(rt, i);
            while (e->next >= 0) {
                e = edge_at(rt, e->next);
                n++;
            }
            e->next = rt->efree;
            rt->efree = s->fanout;
            rt->edges_freed += n;
        }
        rt->retired++;
        tail = rt->retired < rt->next_id ? slot_at(rt, rt->retired)->arg_begin : (uint32_t)rt->arg_count;
        rt->arg_tail = tail;
        while ((uint32_t)(tail - rt->args.start) >= ARG_CHUNK) {
            ptoi_chunks_pop(rt, &rt->args);
        }
        if (((uint32_t)rt->retired & SLOT_MASK) == 0) {
            ptoi_chunks_pop(rt, &rt->slots);
        }
    }
}

static int task_complete(pto_runtime *rt, int32_t task)
{
    pto_slot *s;
    int32_t i;
    if (rt->cfg.count_only) {
        return ptoi_fail(rt, PTO_ERR_STATE, "complete task %d: a count_only runtime keeps no tasks", task);
    }
    if (task < 0 || task >= rt->next_id) {
        return ptoi_fail(rt, PTO_ERR_UNKNOWN_TASK, "complete: unknown task id %d (%d tasks allocated)", task,
                         rt->next_id);
    }
    if (task < rt->retired) {
        return ptoi_fail(rt, PTO_ERR_STATE, "complete: task %d was already completed (it has retired)", task);
    }
    s = slot_at(rt, task);
    if (s->state != PTO_TASK_RUNNING) {
        if (s->state == PTO_TASK_COMPLETED) {
            return ptoi_fail(rt, PTO_ERR_STATE, "complete: task %d (%s) was already completed", task,
                             func_name(rt, s->func));
        }
        if (s->state == PTO_TASK_SUBMITTED) {
            return ptoi_fail(rt, PTO_ERR_STATE, "complete: task %d (%s) is not ready: %d of its %d predecessors have "
                             "not completed", task, func_name(rt, s->func), s->pending, s->fanin);
        }
        return ptoi_fail(rt, PTO_ERR_STATE, "complete: task %d (%s) is %s; only tasks handed out by pto_ready_pop "
                         "can complete", task, func_name(rt, s->func), state_name(s->state));
    }
    s->state = PTO_TASK_COMPLETED;
    rt->completed++;
    for (i = s->fanout; i >= 0;) {
        const pto_edge *e = edge_at(rt, i);
        pto_slot *ss = slot_at(rt, e->succ);
        if (--ss->pending == 0 && ss->state == PTO_TASK_SUBMITTED) {
            int st;
            ss->state = PTO_TASK_READY;
            if ((st = rq_push(rt, e->succ)) != PTO_OK) {
                return st;
            }
        }
        i = e->next;
    }
    if (rt->cfg.window > 0 && task == rt->retired) {
        retire_completed(rt);
    }
    return PTO_OK;
}

int ptoi_ready_pop(pto_runtime *rt, int32_t *ids, int32_t max, int32_t *n)
{
    int32_t k = 0;
    if (n == NULL || (ids == NULL && max > 0) || max < 0) {
        return ptoi_fail(rt, PTO_ERR_INVALID, "pto_ready_pop: NULL pointer or negative max %d", max);
    }
    while (k < max && rt->rq_head != rt->rq_tail) {
        int32_t id = rt->rq[rt->rq_head & (rt->rq_cap - 1)];
        rt->rq_head++;
        slot_at(rt, id)->state = PTO_TASK_RUNNING;
        ids[k++] = id;
    }
    *n = k;
    return PTO_OK;
}

static int ready_count(pto_runtime *rt, int32_t *n)
{
    if (n == NULL) {
        return ptoi_fail(rt, PTO_ERR_INVALID, "pto_ready_count: NULL output pointer");
    }
    *n = (int32_t)(rt->rq_tail - rt->rq_head);
    return PTO_OK;
}

int ptoi_complete_many(pto_runtime *rt, const int32_t *ids, int32_t n)
{
    int32_t k;
    int st = PTO_OK;
    if (n < 0 || (ids == NULL && n > 0)) {
        return ptoi_fail(rt, PTO_ERR_INVALID, "pto_task_complete_many: NULL ids or negative count %d", n);
    }
    for (k = 0; k < n && st == PTO_OK; k++) {
        st = task_complete(rt, ids[k]);
    }
    /* Wake a blocked pto_task_alloc: completions may have retired tasks. */
    if (rt->cfg.notify_all != NULL) {
        rt->cfg.notify_all(rt->cfg.sync_ctx);
    }
    return st;
}

/* ---------------------------------------------------------------------------------------
 * public API: the sync hooks around the functions above
 * ------------------------------------------------------------------------------------- */

/* The graph-building calls run once per task or argument, so without sync hooks they skip
 * the generic wrapper; a broken runtime has no open task, so they refuse through the
 * not-open error path, which reports the breakage. */

PTO_COLD static int alloc_slow(pto_runtime *rt, int32_t func_id, int32_t buffer_bytes, int32_t *task)
{
    if (rt != NULL && rt->cfg.lock == NULL) {
        return task_alloc_slow(rt, func_id, buffer_bytes, task);
    }
    LOCKED(rt, task_alloc_slow(rt, func_id, buffer_bytes, task));
}

/* The fast path takes a slot from the window that task_alloc_slow opened (empty in
 * count_only mode and when the task window is full). Under a lock the window stays empty
 * too, but the lock test comes first: another thread may be changing the window. */
int pto_task_alloc(pto_runtime *rt, int32_t func_id, int32_t buffer_bytes, int32_t *task)
{
    pto_slot *s;
    if (rt != NULL && rt->cfg.lock == NULL && task != NULL && (uint32_t)func_id < (uint32_t)rt->n_funcs
        && buffer_bytes >= 0 && rt->open_task < 0 && (s = rt->slot_next) != rt->slot_end) {
        int32_t id = rt->next_id;
        rt->slot_next = s + 1;
        slot_init(rt, s, id, func_id, buffer_bytes);
        rt->add_task = id;
        *task = id;
        return PTO_OK;
    }
    return alloc_slow(rt, func_id, buffer_bytes, task);
}

static int add_slow(pto_runtime *rt, int32_t task, int32_t tensor, int kind, int64_t r0, int64_t c0, int64_t nr,
                    int64_t nc)
{
    if (rt != NULL && rt->cfg.lock == NULL) {
        return ptoi_add_general(rt, task, tensor, kind, r0, c0, nr, nc);
    }
    LOCKED(rt, ptoi_add_general(rt, task, tensor, kind, r0, c0, nr, nc));
}

/* One slow entry per kind with the public signature, so the public functions reach it by a
 * plain jump. */
PTO_NOINLINE static int add_slow_in(pto_runtime *rt, int32_t task, int32_t tensor, int64_t r0, int64_t c0, int64_t nr,
                                    int64_t nc)
{
    return add_slow(rt, task, tensor, PTO_ARG_IN, r0, c0, nr, nc);
}

PTO_NOINLINE static int add_slow_out(pto_runtime *rt, int32_t task, int32_t tensor, int64_t r0, int64_t c0,
                                     int64_t nr, int64_t nc)
{
    return add_slow(rt, task, tensor, PTO_ARG_OUT, r0, c0, nr, nc);
}

PTO_NOINLINE static int add_slow_inout(pto_runtime *rt, int32_t task, int32_t tensor, int64_t r0, int64_t c0,
                                       int64_t nr, int64_t nc)
{
    return add_slow(rt, task, tensor, PTO_ARG_INOUT, r0, c0, nr, nc);
}

int pto_task_add_input(pto_runtime *rt, int32_t task, int32_t tensor, int64_t row_off, int64_t col_off,
                       int64_t rows, int64_t cols)
{
    int st = task_add(rt, task, tensor, PTO_ARG_IN, row_off, col_off, rows, cols);
    if (st == PTO_OK) {
        return PTO_OK;
    }
    if (st == ADD_EXACT_SLOW) {
        return ptoi_exact_slow(rt, task);
    }
    return add_slow_in(rt, task, tensor, row_off, col_off, rows, cols);
}

int pto_task_add_output(pto_runtime *rt, int32_t task, int32_t tensor, int64_t row_off, int64_t col_off,
                        int64_t rows, int64_t cols)
{
    int st = task_add(rt, task, tensor, PTO_ARG_OUT, row_off, col_off, rows, cols);
    if (st == PTO_OK) {
        return PTO_OK;
    }
    if (st == ADD_EXACT_SLOW) {
        return ptoi_exact_slow(rt, task);
    }
    return add_slow_out(rt, task, tensor, row_off, col_off, rows, cols);
}

int pto_task_add_inout(pto_runtime *rt, int32_t task, int32_t tensor, int64_t row_off, int64_t col_off,
                       int64_t rows, int64_t cols)
{
    int st = task_add(rt, task, tensor, PTO_ARG_INOUT, row_off, col_off, rows, cols);
    if (st == PTO_OK) {
        return PTO_OK;
    }
    if (st == ADD_EXACT_SLOW) {
        return ptoi_exact_slow(rt, task);
    }
    return add_slow_inout(rt, task, tensor, row_off, col_off, rows, cols);
}

int pto_task_add_scalar(pto_runtime *rt, int32_t task, int64_t value)
{
    if (rt != NULL && rt->cfg.lock == NULL) {
        return task_add_scalar(rt, task, value);
    }
    LOCKED(rt, task_add_scalar(rt, task, value));
}

PTO_COLD static int submit_slow(pto_runtime *rt, int32_t task)
{
    if (rt != NULL && rt->cfg.lock == NULL) {
        return task_submit(rt, task);
    }
    LOCKED(rt, task_submit(rt, task));
}

/* The fast path: the open task of an unlocked runtime (add_task). */
int pto_task_submit(pto_runtime *rt, int32_t task)
{
    if (rt != NULL && (int64_t)(uint32_t)task == rt->add_task) {
        pto_slot *ts = open_slot(rt);
        int32_t pending = ts->pending + ts->fanin;
        rt->submitted++;
        rt->open_task = -1;
        rt->add_task = -1;
        ts->pending = pending;
        if (pending != 0) {
            ts->state = PTO_TASK_SUBMITTED;
            return PTO_OK;
        }
        return submit_ready(rt, task, ts);
    }
    return submit_slow(rt, task);
}

int pto_ready_count(pto_runtime *rt, int32_t *n)
{
    LOCKED(rt, ready_count(rt, n));
}

int pto_ready_pop(pto_runtime *rt, int32_t *ids, int32_t max, int32_t *n)
{
    LOCKED(rt, ptoi_ready_pop(rt, ids, max, n));
}

int pto_task_complete(pto_runtime *rt, int32_t task)
{
    LOCKED(rt, ptoi_complete_many(rt, &task, 1));
}

int pto_task_complete_many(pto_runtime *rt, const int32_t *ids, int32_t n)
{
    LOCKED(rt, ptoi_complete_many(rt, ids, n));
}
