/* pto_runtime.c - the PTO runtime object: configuration, create, destroy, reset, and the
 * status names. pto_runtime_internal.h describes the runtime and lists its other files. */

#include "pto_runtime_internal.h"

int pto_config_init(pto_config *cfg)
{
    if (cfg == NULL) {
        return PTO_ERR_INVALID;
    }
    memset(cfg, 0, sizeof *cfg);
    cfg->window = 0;
    cfg->count_only = 0;
    cfg->sync_ctx = NULL;
    cfg->lock = NULL;
    cfg->unlock = NULL;
    cfg->wait = NULL;
    cfg->notify_all = NULL;
    return PTO_OK;
}

/* A windowed runtime sizes its tensor map (window/2 entries) and ready queue (window/4) for
 * the window up front, so its memory follows the window rather than the graph; both still
 * grow if a program keeps more live regions or ready tasks than that. */
static int presize_for_window(pto_runtime *rt)
{
    void *p = rt->ent;
    uint32_t rq = 64;
    int st = ptoi_grow_array(rt, &p, &rt->ent_cap, rt->cfg.window / 2 > 16 ? rt->cfg.window / 2 : 16,
                             sizeof(pto_entry), "tensor map");
    rt->ent = p;
    if (st != PTO_OK) {
        return st;
    }
    while (rq < (uint32_t)rt->cfg.window / 4) {
        rq *= 2;
    }
    rt->rq = mem_alloc(rt, rq * sizeof *rt->rq);
    if (rt->rq == NULL) {
        return PTO_ERR_NO_MEMORY;
    }
    rt->rq_cap = rq;
    return PTO_OK;
}

int pto_runtime_create(const pto_config *cfg, pto_runtime **out)
{
    pto_runtime *rt;
    if (out == NULL) {
        return PTO_ERR_INVALID;
    }
    *out = NULL;
    if (cfg == NULL || cfg->window < 0 || cfg->window > (1 << 30)) {
        return PTO_ERR_INVALID;
    }
    /* lock/unlock come together; wait/notify_all come together and need the lock. */
    if ((cfg->lock == NULL) != (cfg->unlock == NULL) || (cfg->wait == NULL) != (cfg->notify_all == NULL)
        || (cfg->wait != NULL && cfg->lock == NULL)) {
        return PTO_ERR_INVALID;
    }
    rt = malloc(sizeof *rt);
    if (rt == NULL) {
        return PTO_ERR_NO_MEMORY;
    }
    memset(rt, 0, sizeof *rt);
    rt->cfg = *cfg;
    rt->cfg.count_only = cfg->count_only != 0;
    rt->bytes = rt->bytes_peak = (int64_t)sizeof *rt;
    rt->open_task = -1;
    rt->efree = -1;
    rt->ent_free = -1;
    rt->add_task = -1;
    rt->gc_at = rt->cfg.window > 0 ? GC_MIN : INT64_MAX;
    ptoi_chunks_init(&rt->slots, SLOT_SHIFT, sizeof(pto_slot), rt->cfg.window > 0 ? 1 : SLAB_MAX);
    ptoi_chunks_init(&rt->args, ARG_SHIFT, sizeof(pto_argrec), rt->cfg.window > 0 ? 1 : SLAB_MAX);
    if (rt->cfg.window > 0 && !rt->cfg.count_only && presize_for_window(rt) != PTO_OK) {
        pto_runtime_destroy(rt);
        return PTO_ERR_NO_MEMORY;
    }
    *out = rt;
    return PTO_OK;
}

int pto_runtime_destroy(pto_runtime *rt)
{
    int32_t i;
    if (rt == NULL) {
        return PTO_OK;
    }
    for (i = 0; i < rt->n_tensors; i++) {
        mem_free(rt, rt->tensors[i].cells, (size_t)rt->tensors[i].ncr * (size_t)rt->tensors[i].ncc * sizeof(int32_t));
    }
    if (rt->cfg.window > 0) {
        for (i = 0; i < rt->n_echunks; i++) {
            mem_free(rt, rt->edir[i], sizeof(pto_edge) << EDGE_SHIFT);
        }
    } else {
        ptoi_slabs_free(rt, &rt->eslabs);
    }
    mem_free(rt, rt->edir, (size_t)rt->edir_cap * sizeof *rt->edir);
    ptoi_chunks_free(rt, &rt->slots);
    ptoi_chunks_free(rt, &rt->args);
    mem_free(rt, rt->names, rt->names_cap);
    mem_free(rt, rt->tensors, (size_t)rt->tensors_cap * sizeof *rt->tensors);
    mem_free(rt, rt->funcs, (size_t)rt->funcs_cap * sizeof *rt->funcs);
    mem_free(rt, rt->ent, (size_t)rt->ent_cap * sizeof *rt->ent);
    mem_free(rt, rt->tmp, (size_t)rt->tmp_cap * sizeof *rt->tmp);
    mem_free(rt, rt->rq, (size_t)rt->rq_cap * sizeof *rt->rq);
    free(rt);
    return PTO_OK;
}

/* Forget every tensor, function, task, edge and map entry but keep the allocated memory, so
 * the next graph is built without allocating (or page-faulting) again. Also clears the
 * broken state left by an earlier out-of-memory error. */
static int runtime_reset(pto_runtime *rt)
{
    int32_t i;
    for (i = 0; i < rt->n_tensors; i++) {
        mem_free(rt, rt->tensors[i].cells, (size_t)rt->tensors[i].ncr * (size_t)rt->tensors[i].ncc * sizeof(int32_t));
    }
    rt->n_tensors = rt->n_funcs = 0;
    rt->names_len = 0;
    rt->next_id = rt->retired = 0;
    rt->open_task = -1;
    ptoi_chunks_reset(rt, &rt->slots);
    ptoi_chunks_reset(rt, &rt->args);
    rt->add_task = -1;
    rt->arg_count = 0;
    rt->arg_tail = 0;
    rt->ebump = rt->elim = 0;
    rt->ebase = 0;
    rt->efree = -1;
    rt->slot_next = rt->slot_end = NULL;
    rt->arg_next = rt->arg_end = NULL;
    rt->ent_bump = 0;
    rt->ent_free = -1;
    rt->ent_live = rt->ent_peak = 0;
    rt->gc_at = rt->cfg.window > 0 ? GC_MIN : INT64_MAX;
    rt->cells_total = 0;
    rt->rq_head = rt->rq_tail = 0;
    rt->submitted = rt->completed = rt->regions = rt->scalars = rt->edges_reused = rt->edges_freed = 0;
    rt->broken = 0;
    rt->fail_st = PTO_OK;
    rt->err[0] = '\0';
    return PTO_OK;
}

int pto_runtime_reset(pto_runtime *rt)
{
    int st;
    if (rt == NULL) {
        return PTO_ERR_INVALID;
    }
    rt_lock(rt);
    st = runtime_reset(rt);
    rt_unlock(rt);
    return st;
}

const char *pto_last_error(const pto_runtime *rt)
{
    return rt == NULL ? "runtime pointer is NULL" : rt->err;
}

const char *pto_status_name(int status)
{
    switch (status) {
    case PTO_OK: return "PTO_OK";
    case PTO_ERR_INVALID: return "PTO_ERR_INVALID";
    case PTO_ERR_NO_MEMORY: return "PTO_ERR_NO_MEMORY";
    case PTO_ERR_WINDOW_FULL: return "PTO_ERR_WINDOW_FULL";
    case PTO_ERR_UNKNOWN_TENSOR: return "PTO_ERR_UNKNOWN_TENSOR";
    case PTO_ERR_UNKNOWN_FUNC: return "PTO_ERR_UNKNOWN_FUNC";
    case PTO_ERR_UNKNOWN_TASK: return "PTO_ERR_UNKNOWN_TASK";
    case PTO_ERR_REGION: return "PTO_ERR_REGION";
    case PTO_ERR_STATE: return "PTO_ERR_STATE";
    case PTO_ERR_IO: return "PTO_ERR_IO";
    case PTO_ERR_LIMIT: return "PTO_ERR_LIMIT";
    default: return "PTO_ERR_UNKNOWN_STATUS";
    }
}
