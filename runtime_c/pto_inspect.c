/* pto_inspect.c - reading the PTO runtime's graph: stats, per-task queries, the bulk
 * export (three calls for the whole graph) and the text dump (format in docs/RUNTIME.md). */

#include <inttypes.h>
#include <stdio.h>

#include "pto_runtime_internal.h"

/* Arguments of live task id: sequence numbers [*begin, *begin + *n). */
static void task_arg_range(const pto_runtime *rt, int32_t id, uint32_t *begin, uint32_t *n)
{
    uint32_t b = slot_at(rt, id)->arg_begin;
    uint32_t e = (id + 1 < rt->next_id) ? slot_at(rt, id + 1)->arg_begin : (uint32_t)rt->arg_count;
    *begin = b;
    *n = e - b;
}

/* Edges recorded so far: every node ever handed out (bump-allocated or reused). */
static int64_t edges_total(const pto_runtime *rt)
{
    return (int64_t)rt->ebump + rt->edges_reused;
}

static int64_t scalar_value(const pto_argrec *a)
{
    return (int64_t)(((uint64_t)(uint32_t)a->c0 << 32) | (uint64_t)(uint32_t)a->r0);
}

static int32_t count_fanout(const pto_runtime *rt, const pto_slot *s)
{
    int32_t n = 0, i;
    for (i = s->fanout; i >= 0; i = edge_at(rt, i)->next) {
        n++;
    }
    return n;
}

/* Live task ids [first, end): the open task (if any) is the newest and is left out. */
static void exported_range(const pto_runtime *rt, int32_t *first, int32_t *end)
{
    *first = rt->retired;
    *end = rt->open_task >= 0 ? rt->open_task : rt->next_id;
}

static int check_live(pto_runtime *rt, int32_t task, const char *what)
{
    if (rt->cfg.count_only) {
        return ptoi_fail(rt, PTO_ERR_STATE, "%s: a count_only runtime keeps no tasks", what);
    }
    if (task < 0 || task >= rt->next_id) {
        return ptoi_fail(rt, PTO_ERR_UNKNOWN_TASK, "%s: unknown task id %d (%d tasks allocated)", what, task,
                         rt->next_id);
    }
    if (task < rt->retired) {
        return ptoi_fail(rt, PTO_ERR_UNKNOWN_TASK, "%s: task %d has retired from the window", what, task);
    }
    return PTO_OK;
}

static void decode_arg(const pto_argrec *a, pto_arg *out)
{
    out->kind = a->tk & 3;
    if (out->kind == PTO_ARG_SCALAR) {
        out->tensor = -1;
        out->row0 = out->col0 = out->rows = out->cols = 0;
        out->scalar = scalar_value(a);
    } else {
        out->tensor = a->tk >> 2;
        out->row0 = a->r0;
        out->col0 = a->c0;
        out->rows = a->nr;
        out->cols = a->nc;
        out->scalar = 0;
    }
}

static int task_query(pto_runtime *rt, int32_t task, pto_task_view *out)
{
    const pto_slot *s;
    uint32_t b, n;
    int st;
    if (out == NULL) {
        return ptoi_fail(rt, PTO_ERR_INVALID, "pto_task_query: NULL output pointer");
    }
    if ((st = check_live(rt, task, "pto_task_query")) != PTO_OK) {
        return st;
    }
    s = slot_at(rt, task);
    task_arg_range(rt, task, &b, &n);
    out->func = (int32_t)s->func;
    out->buffer_bytes = s->buffer_bytes;
    out->state = (int32_t)s->state;
    out->fanin = s->fanin;
    out->pending = s->state == PTO_TASK_OPEN ? s->pending + s->fanin : s->pending;
    out->n_args = (int32_t)n;
    out->n_fanout = count_fanout(rt, s);
    return PTO_OK;
}

int ptoi_task_args(pto_runtime *rt, int32_t task, pto_arg *args, int32_t max, int32_t *n_out)
{
    uint32_t b, n, k;
    int st;
    if (n_out == NULL || (args == NULL && max > 0) || max < 0) {
        return ptoi_fail(rt, PTO_ERR_INVALID, "pto_task_args: NULL pointer or negative max %d", max);
    }
    if ((st = check_live(rt, task, "pto_task_args")) != PTO_OK) {
        return st;
    }
    task_arg_range(rt, task, &b, &n);
    for (k = 0; k < n && (int64_t)k < max; k++) {
        decode_arg(arg_at(rt, b + k), &args[k]);
    }
    *n_out = (int32_t)n;
    return PTO_OK;
}

static int export_info(pto_runtime *rt, pto_export_info *out)
{
    int32_t first, end;
    int64_t n_args = 0;
    if (out == NULL) {
        return ptoi_fail(rt, PTO_ERR_INVALID, "pto_export_info_get: NULL output pointer");
    }
    if (rt->cfg.count_only) {
        return ptoi_fail(rt, PTO_ERR_STATE, "export: a count_only runtime keeps no tasks");
    }
    exported_range(rt, &first, &end);
    if (end > first) {
        uint32_t last_b, last_n;
        task_arg_range(rt, end - 1, &last_b, &last_n);
        n_args = (int64_t)(uint32_t)(last_b + last_n - slot_at(rt, first)->arg_begin);
    }
    out->first_task = first;
    out->n_tasks = end - first;
    out->n_args = n_args;
    out->n_edges = edges_total(rt) - rt->edges_freed;
    out->n_tensors = rt->n_tensors;
    out->n_funcs = rt->n_funcs;
    return PTO_OK;
}

static int export_fill(pto_runtime *rt, const pto_export_arrays *a)
{
    int32_t first, end, id;
    int64_t ai = 0, ei = 0;
    if (a == NULL) {
        return ptoi_fail(rt, PTO_ERR_INVALID, "pto_export_fill: NULL arrays");
    }
    if (rt->cfg.count_only) {
        return ptoi_fail(rt, PTO_ERR_STATE, "export: a count_only runtime keeps no tasks");
    }
    exported_range(rt, &first, &end);
    for (id = first; id < end; id++) {
        const pto_slot *s = slot_at(rt, id);
        int64_t t = id - first;
        uint32_t b, n, k;
        int32_t nf = count_fanout(rt, s), i;
        if (a->task_func) a->task_func[t] = (int32_t)s->func;
        if (a->task_buffer_bytes) a->task_buffer_bytes[t] = s->buffer_bytes;
        if (a->task_fanin) a->task_fanin[t] = s->fanin;
        if (a->task_state) a->task_state[t] = (int8_t)s->state;
        if (a->arg_ptr) a->arg_ptr[t] = ai;
        if (a->fanout_ptr) a->fanout_ptr[t] = ei;
        task_arg_range(rt, id, &b, &n);
        for (k = 0; k < n; k++, ai++) {
            pto_arg d;
            decode_arg(arg_at(rt, b + k), &d);
            if (a->arg_kind) a->arg_kind[ai] = (int8_t)d.kind;
            if (a->arg_tensor) a->arg_tensor[ai] = d.tensor;
            if (a->arg_scalar) a->arg_scalar[ai] = d.scalar;
            if (a->arg_region) {
                a->arg_region[4 * ai + 0] = d.row0;
                a->arg_region[4 * ai + 1] = d.col0;
                a->arg_region[4 * ai + 2] = d.rows;
                a->arg_region[4 * ai + 3] = d.cols;
            }
        }
        /* The fanout list is newest first, i.e. descending ids: fill backwards. */
        if (a->fanout_ids) {
            int64_t p = ei + nf;
            for (i = s->fanout; i >= 0; i = edge_at(rt, i)->next) {
                a->fanout_ids[--p] = edge_at(rt, i)->succ;
            }
        }
        ei += nf;
    }
    if (a->arg_ptr) a->arg_ptr[end - first] = ai;
    if (a->fanout_ptr) a->fanout_ptr[end - first] = ei;
    return PTO_OK;
}

static int dump(pto_runtime *rt, const char *path)
{
    static const char *const kinds[] = {"in", "out", "inout"};
    FILE *f;
    int32_t first, end, id, i;
    int64_t edges = 0;
    int bad;
    if (path == NULL) {
        return ptoi_fail(rt, PTO_ERR_INVALID, "pto_dump: NULL path");
    }
    if (rt->cfg.count_only) {
        return ptoi_fail(rt, PTO_ERR_STATE, "dump: a count_only runtime keeps no tasks");
    }
    f = fopen(path, "w");
    if (f == NULL) {
        return ptoi_fail(rt, PTO_ERR_IO, "dump: cannot open '%.300s' for writing", path);
    }
    fprintf(f, "PTO-TASKGRAPH 1\n");
    for (i = 0; i < rt->n_tensors; i++) {
        const pto_tensor *t = &rt->tensors[i];
        fprintf(f, "TENSOR %d %s %d %d %d\n", i, rt->names + t->name, t->rows, t->cols, t->elem_size);
    }
    for (i = 0; i < rt->n_funcs; i++) {
        fprintf(f, "FUNC %d %s\n", i, rt->names + rt->funcs[i]);
    }
    exported_range(rt, &first, &end);
    for (id = first; id < end; id++) {
        const pto_slot *s = slot_at(rt, id);
        int32_t nf = count_fanout(rt, s), p;
        uint32_t b, n, k;
        if (nf > rt->tmp_cap) {
            void *q = rt->tmp;
            int st = ptoi_grow_array(rt, &q, &rt->tmp_cap, nf, sizeof(int32_t), "dump scratch");
            rt->tmp = q;
            if (st != PTO_OK) {
                fclose(f);
                return st;
            }
        }
        p = nf;
        for (i = s->fanout; i >= 0; i = edge_at(rt, i)->next) {
            rt->tmp[--p] = edge_at(rt, i)->succ;
        }
        fprintf(f, "TASK %d %u %d %d %d", id, (unsigned)s->func, s->buffer_bytes, s->fanin, nf);
        for (p = 0; p < nf; p++) {
            fprintf(f, " %d", rt->tmp[p]);
        }
        fputc('\n', f);
        edges += nf;
        task_arg_range(rt, id, &b, &n);
        for (k = 0; k < n; k++) {
            const pto_argrec *a = arg_at(rt, b + k);
            int kind = a->tk & 3;
            if (kind == PTO_ARG_SCALAR) {
                fprintf(f, "SCALAR %d %" PRId64 "\n", id, scalar_value(a));
            } else {
                fprintf(f, "ARG %d %s %d %d %d %d %d\n", id, kinds[kind], a->tk >> 2, a->r0, a->c0, a->nr, a->nc);
            }
        }
    }
    fprintf(f, "END %d %" PRId64 "\n", end - first, edges);
    bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        return ptoi_fail(rt, PTO_ERR_IO, "dump: writing '%.300s' failed", path);
    }
    return PTO_OK;
}

static int get_stats(pto_runtime *rt, pto_stats *out)
{
    if (out == NULL) {
        return ptoi_fail(rt, PTO_ERR_INVALID, "pto_get_stats: NULL output pointer");
    }
    memset(out, 0, sizeof *out);
    out->tasks_submitted = rt->submitted;
    out->tasks_completed = rt->completed;
    out->tasks_retired = rt->cfg.count_only ? 0 : rt->retired;
    out->tasks_live = rt->cfg.count_only ? (rt->open_task >= 0) : rt->next_id - rt->retired;
    out->regions = rt->cfg.count_only ? rt->regions : (int64_t)rt->arg_count - rt->scalars;
    out->scalars = rt->scalars;
    out->edges = edges_total(rt);
    out->edges_live = edges_total(rt) - rt->edges_freed;
    out->map_entries = rt->ent_live;
    out->map_entries_peak = rt->ent_peak;
    out->bytes = rt->bytes;
    out->bytes_peak = rt->bytes_peak;
    out->bytes_per_task = rt->submitted > 0 ? (double)rt->bytes_peak / (double)rt->submitted : 0.0;
    out->ready = (int64_t)(rt->rq_tail - rt->rq_head);
    out->window = rt->cfg.window;
    out->count_only = rt->cfg.count_only;
    return PTO_OK;
}

int pto_get_stats(pto_runtime *rt, pto_stats *out)
{
    /* Stats stay readable after an out-of-memory error, to report what was reached. */
    int st;
    if (rt == NULL) {
        return PTO_ERR_INVALID;
    }
    rt_lock(rt);
    st = get_stats(rt, out);
    rt_unlock(rt);
    return st;
}

int pto_task_query(pto_runtime *rt, int32_t task, pto_task_view *out)
{
    LOCKED(rt, task_query(rt, task, out));
}

int pto_task_args(pto_runtime *rt, int32_t task, pto_arg *args, int32_t max, int32_t *n)
{
    LOCKED(rt, ptoi_task_args(rt, task, args, max, n));
}

int pto_export_info_get(pto_runtime *rt, pto_export_info *out)
{
    LOCKED(rt, export_info(rt, out));
}

int pto_export_fill(pto_runtime *rt, const pto_export_arrays *arrays)
{
    LOCKED(rt, export_fill(rt, arrays));
}

int pto_dump(pto_runtime *rt, const char *path)
{
    LOCKED(rt, dump(rt, path));
}
