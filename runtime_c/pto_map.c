/* pto_map.c - the tensor map of the PTO runtime: per tensor, rectangles with their last
 * writer and the run of readers since, in a grid of cells; region arguments are resolved
 * against it into dependency edges (docs/RUNTIME.md, "The tensor map").
 *
 * pto_task.c handles the common exact-cell case inline and calls in here for everything
 * else: ptoi_exact_slow (an exact-cell argument in general), ptoi_add_general (any other
 * region, and every refused one) and ptoi_map_gc (the windowed sweep).
 */

#include "pto_runtime_internal.h"

/* ---------------------------------------------------------------------------------------
 * entries and grids
 * ------------------------------------------------------------------------------------- */

static int entry_new(pto_runtime *rt, int32_t *out)
{
    int32_t i;
    if (rt->ent_free >= 0) {
        i = rt->ent_free;
        rt->ent_free = rt->ent[i].next;
    } else {
        if (rt->ent_bump == rt->ent_cap) {
            void *p = rt->ent;
            int st = ptoi_grow_array(rt, &p, &rt->ent_cap, rt->ent_cap + 1, sizeof(pto_entry), "tensor map");
            rt->ent = p;
            if (st != PTO_OK) {
                return st;
            }
        }
        i = rt->ent_bump++;
    }
    rt->ent_live++;
    if (rt->ent_live > rt->ent_peak) {
        rt->ent_peak = rt->ent_live;
    }
    *out = i;
    return PTO_OK;
}

static void entry_free(pto_runtime *rt, int32_t i)
{
    rt->ent[i].next = rt->ent_free;
    rt->ent_free = i;
    rt->ent_live--;
}

/* Set `simple`; the exact-cell path is open while it holds (see pto_tensor). */
static void tensor_set_simple(pto_tensor *t, int simple)
{
    t->simple = (uint8_t)(simple != 0);
    t->ex_rlim = simple ? (uint64_t)(t->rows - t->ex_rows) + 1u : 0;
    t->ex_clim = simple ? (uint64_t)(t->cols - t->ex_cols) + 1u : 0;
}

/* The exact-cell geometry of the grid (see pto_tensor), set when the grid is built. */
static void tensor_set_cells(pto_tensor *t)
{
    /* A dimension of one cell (shift 31, or a cell at least the tensor) is matched only by
     * accesses of all of it: extent = the dimension, offset 0 (limit 1, mask 0). */
    if (t->shr < 31 && ((int64_t)1 << t->shr) < t->rows) {
        t->ex_rows = (int64_t)1 << t->shr;
        t->ex_rmask = (uint32_t)t->ex_rows - 1u;
    } else {
        t->ex_rows = t->rows;
        t->ex_rmask = 0;
    }
    if (t->shc < 31 && ((int64_t)1 << t->shc) < t->cols) {
        t->ex_cols = (int64_t)1 << t->shc;
        t->ex_cmask = (uint32_t)t->ex_cols - 1u;
    } else {
        t->ex_cols = t->cols;
        t->ex_cmask = 0;
    }
    /* r0 = k 2^shr and c0 = j 2^shc give (k ncc + j) 2^32 < 2^48: no overflow. */
    t->ex_rmul = (uint64_t)t->ncc << (32 - t->shr);
    t->ex_cmul = (uint64_t)1 << (32 - t->shc);
}

/* Set e->whole: whether its rectangle is one full grid cell (ex_rows x ex_cols at a multiple
 * of them; a one-cell dimension is whole when covered from 0 to its end). */
static void entry_set_whole(const pto_tensor *t, pto_entry *e)
{
    e->whole = e->r1 - e->r0 == t->ex_rows && ((uint32_t)e->r0 & t->ex_rmask) == 0
               && e->c1 - e->c0 == t->ex_cols && ((uint32_t)e->c0 & t->ex_cmask) == 0;
}

/* The list an entry with this rectangle belongs to; updates the tensor's reach when
 * `grow_reach` (insertion), leaves it alone for a lookup. */
static int32_t *entry_list(pto_tensor *t, int32_t r0, int32_t c0, int32_t r1, int32_t c1, int grow_reach)
{
    int32_t ar = r0 >> t->shr, ac = c0 >> t->shc;
    int32_t dr = ((r1 - 1) >> t->shr) - ar, dc = ((c1 - 1) >> t->shc) - ac;
    if (dr > MAX_REACH || dc > MAX_REACH) {
        if (grow_reach) {
            tensor_set_simple(t, 0);
        }
        return &t->large;
    }
    if (grow_reach && (dr > t->reach_r || dc > t->reach_c)) {
        t->reach_r = (uint8_t)(dr > t->reach_r ? dr : t->reach_r);
        t->reach_c = (uint8_t)(dc > t->reach_c ? dc : t->reach_c);
        tensor_set_simple(t, 0);
    }
    return &t->cells[(size_t)ar * (size_t)t->ncc + (size_t)ac];
}

static void entry_place(pto_runtime *rt, pto_tensor *t, int32_t i)
{
    pto_entry *e = &rt->ent[i];
    int32_t *head = entry_list(t, e->r0, e->c0, e->r1, e->c1, 1);
    e->next = *head;
    *head = i;
    entry_set_whole(t, e);
}

/* Put entry i at the front of list *head (its rectangle's cell list, known to the caller),
 * or place it by its rectangle when head is NULL. */
static void entry_link_head(pto_runtime *rt, pto_tensor *t, int32_t *head, int32_t i)
{
    pto_entry *e = &rt->ent[i];
    if (head == NULL) {
        entry_place(rt, t, i);
        return;
    }
    e->next = *head;
    *head = i;
    entry_set_whole(t, e);
}

static int32_t floor_log2(int32_t v)
{
    int32_t s = 0;
    while ((v >> 1) > 0) {
        v >>= 1;
        s++;
    }
    return s;
}

/* Grid cell holding all of the region, or -1 when it spans several. */
static PTO_INLINE int32_t cell_index(const pto_tensor *t, int32_t r0, int32_t c0, int32_t nr, int32_t nc)
{
    if (((r0 ^ (r0 + nr - 1)) & t->maskr) | ((c0 ^ (c0 + nc - 1)) & t->maskc)) {
        return -1;
    }
    return (r0 >> t->shr) * t->ncc + (c0 >> t->shc);
}

/* (Re)build a tensor's grid after its cell size changed, re-anchoring its entries. */
static int index_regrid(pto_runtime *rt, pto_tensor *t)
{
    int64_t ncr, ncc, k, old_n = (int64_t)t->ncr * t->ncc;
    int32_t *cells, chain = -1, i;
    for (;;) {
        ncr = (((int64_t)t->rows - 1) >> t->shr) + 1;
        ncc = (((int64_t)t->cols - 1) >> t->shc) + 1;
        if (ncr * ncc <= MAX_CELLS) {
            break;
        }
        /* Too many cells for this tensor: coarsen the finer dimension. */
        if (ncr >= ncc) {
            t->shr++;
        } else {
            t->shc++;
        }
    }
    cells = mem_alloc(rt, (size_t)(ncr * ncc) * sizeof *cells);
    if (cells == NULL) {
        return ptoi_oom(rt, "tensor map grid");
    }
    for (k = 0; k < ncr * ncc; k++) {
        cells[k] = -1;
    }
    /* Collect every existing entry into one chain, then place them in the new grid. */
    if (t->cells != NULL) {
        for (k = 0; k < old_n; k++) {
            while ((i = t->cells[k]) >= 0) {
                t->cells[k] = rt->ent[i].next;
                rt->ent[i].next = chain;
                chain = i;
            }
        }
        mem_free(rt, t->cells, (size_t)old_n * sizeof *t->cells);
    }
    while ((i = t->large) >= 0) {
        t->large = rt->ent[i].next;
        rt->ent[i].next = chain;
        chain = i;
    }
    rt->cells_total += ncr * ncc - (t->cells != NULL ? old_n : 0);
    t->cells = cells;
    t->ncr = (int32_t)ncr;
    t->ncc = (int32_t)ncc;
    t->reach_r = t->reach_c = 0;
    t->maskr = (int32_t)~((UINT32_C(1) << t->shr) - 1u);
    t->maskc = (int32_t)~((UINT32_C(1) << t->shc) - 1u);
    tensor_set_cells(t);
    tensor_set_simple(t, 1);
    while ((i = chain) >= 0) {
        chain = rt->ent[i].next;
        entry_place(rt, t, i);
    }
    return PTO_OK;
}

/* Called for an access with fewer rows/cols than the tensor's grid allows for (see
 * grid_rows): fixes a dimension's cell size on its first partial access. */
PTO_COLD int ptoi_index_prepare(pto_runtime *rt, pto_tensor *t, int32_t nr, int32_t nc)
{
    int regrid = t->cells == NULL;
    if (!t->fixed_r && nr < t->rows) {
        t->fixed_r = 1;
        t->shr = (uint8_t)floor_log2(nr);
        regrid = 1;
    }
    if (!t->fixed_c && nc < t->cols) {
        t->fixed_c = 1;
        t->shc = (uint8_t)floor_log2(nc);
        regrid = 1;
    }
    t->grid_rows = t->fixed_r ? 0 : t->rows;
    t->grid_cols = t->fixed_c ? 0 : t->cols;
    return regrid ? index_regrid(rt, t) : PTO_OK;
}

/* ---------------------------------------------------------------------------------------
 * dependency edges
 * ------------------------------------------------------------------------------------- */

/* One more chunk of edge nodes (a slab of them without a window, see SLAB_MAX). */
PTO_COLD static int edge_grow(pto_runtime *rt)
{
    const int32_t limit = (1 << (31 - EDGE_SHIFT)) - 1;
    const size_t bytes = sizeof(pto_edge) << EDGE_SHIFT;
    int32_t n = rt->cfg.window > 0 ? 1 : (int32_t)slab_chunks((uint32_t)rt->n_echunks), k;
    pto_edge *chunk;
    if (rt->n_echunks >= limit) {
        return ptoi_fail(rt, PTO_ERR_LIMIT, "more than %d live dependency edges", INT32_MAX - (int32_t)EDGE_MASK);
    }
    if (n > limit - rt->n_echunks) {
        n = limit - rt->n_echunks;
    }
    if (rt->n_echunks + n > rt->edir_cap) {
        void *p = rt->edir;
        int st = ptoi_grow_array(rt, &p, &rt->edir_cap, rt->n_echunks + n, sizeof(pto_edge *), "edge pool");
        rt->edir = p;
        if (st != PTO_OK) {
            return st;
        }
    }
    chunk = rt->cfg.window > 0 ? mem_alloc(rt, bytes)
                               : (pto_edge *)(void *)ptoi_slab_new(rt, &rt->eslabs, bytes, (uint32_t)n);
    if (chunk == NULL) {
        return ptoi_oom(rt, "edge pool");
    }
    for (k = 0; k < n; k++) {
        rt->edir[rt->n_echunks++] = chunk + ((size_t)k << EDGE_SHIFT);
    }
    rt->ecap = rt->n_echunks << EDGE_SHIFT;
    return PTO_OK;
}

/* edge_add when the bump window is empty: a node freed by retirement, else a fresh window
 * of the current (or a new) chunk. A failure marks the runtime broken (ptoi_set_broken); the
 * argument call that got here reports it. */
PTO_NOINLINE static void edge_add_slow(pto_runtime *rt, pto_slot *ps, int32_t task, pto_slot *ts)
{
    int32_t i = rt->efree;
    pto_edge *ed;
    if (i >= 0) {
        ed = edge_at(rt, i);
        rt->efree = ed->next;
        rt->edges_reused++;
    } else {
        if (rt->ebump == (size_t)rt->ecap) {
            int st = edge_grow(rt);
            if (st != PTO_OK) {
                ptoi_set_broken(rt, st);
                return;
            }
        }
        i = (int32_t)rt->ebump;
        ed = edge_at(rt, i);
        rt->ebase = (uintptr_t)ed - (uintptr_t)(uint32_t)i * sizeof(pto_edge);
        rt->elim = (size_t)(((uint32_t)i | EDGE_MASK) + 1u);
        rt->ebump = (size_t)i + 1u;
    }
    edge_link(ed, i, ps, task, ts);
}

/* Record pred -> task (task is the open task, ts its slot, ps pred's slot). All edges into
 * a task are added while its arguments are added, so pred's newest successor (last_succ)
 * tells whether the edge exists already: duplicates collapse in O(1). */
static PTO_INLINE void edge_add(pto_runtime *rt, pto_slot *ps, int32_t task, pto_slot *ts)
{
    size_t i;
    if (ps->last_succ == task) {
        return;
    }
    i = rt->ebump;
    if (i == rt->elim) {
        edge_add_slow(rt, ps, task, ts);
        return;
    }
    rt->ebump = i + 1u;
    edge_link(edge_window_at(rt, i), (int32_t)i, ps, task, ts);
}

/* ---------------------------------------------------------------------------------------
 * region resolution (the general path)
 * ------------------------------------------------------------------------------------- */

static PTO_INLINE pto_rect arg_rect(const pto_argrec *a)
{
    pto_rect r;
    r.r0 = a->r0;
    r.c0 = a->c0;
    r.r1 = a->r0 + a->nr;
    r.c1 = a->c0 + a->nc;
    return r;
}

static PTO_INLINE int overlaps(const pto_entry *e, const pto_rect *r)
{
    return e->r0 < r->r1 && r->r0 < e->r1 && e->c0 < r->c1 && r->c0 < e->c1;
}

static PTO_INLINE int same_rect(const pto_entry *e, const pto_rect *r)
{
    return e->r0 == r->r0 && e->c0 == r->c0 && e->r1 == r->r1 && e->c1 == r->c1;
}

static PTO_INLINE int inside(const pto_entry *e, const pto_rect *r)
{
    return e->r0 >= r->r0 && e->r1 <= r->r1 && e->c0 >= r->c0 && e->c1 <= r->c1;
}

/* Edges from the live readers of a run of two or more readers to a task writing over it. */
PTO_NOINLINE static void run_edges(pto_runtime *rt, const pto_entry *e, int32_t task, pto_slot *ts)
{
    int64_t id = e->first, last = e->last, step = e->step;
    if (id < rt->retired) {
        /* Readers that retired are satisfied: start at the first live one. */
        id += ((int64_t)rt->retired - id + step - 1) / step * step;
    }
    for (; id <= last; id += step) {
        edge_add(rt, slot_at(rt, (int32_t)id), task, ts);
    }
}

/* Edges implied by one overlapping entry: its writer always, its live readers for a write.
 * A writer of -1 (none) and a last reader of -1 (none) are below every retired mark, so one
 * compare each covers both. */
static PTO_INLINE void entry_edges(pto_runtime *rt, const pto_entry *e, int is_write, int32_t task, pto_slot *ts)
{
    if (e->writer >= rt->retired) {
        edge_add(rt, e->wslot, task, ts);
    }
    if (is_write && e->last >= rt->retired) {
        if (e->first == e->last) {
            edge_add(rt, slot_at(rt, e->last), task, ts);
        } else {
            run_edges(rt, e, task, ts);
        }
    }
}

/* Cell range a query must visit: the cells it covers plus reach cells up/left of it, where
 * entries anchored there may extend into it. */
static inline void query_cells(const pto_tensor *t, const pto_rect *r, int32_t *cr0, int32_t *cr1, int32_t *cc0,
                               int32_t *cc1)
{
    int32_t a = r->r0 >> t->shr, b = r->c0 >> t->shc;
    *cr0 = a > t->reach_r ? a - t->reach_r : 0;
    *cc0 = b > t->reach_c ? b - t->reach_c : 0;
    *cr1 = (r->r1 - 1) >> t->shr;
    *cc1 = (r->c1 - 1) >> t->shc;
}

static int add_piece(pto_runtime *rt, pto_tensor *t, const pto_entry *old, int32_t r0, int32_t c0,
                     int32_t r1, int32_t c1)
{
    int32_t i;
    pto_entry *e;
    int st = entry_new(rt, &i);
    if (st != PTO_OK) {
        return st;
    }
    e = &rt->ent[i];
    *e = *old;
    e->r0 = r0;
    e->c0 = c0;
    e->r1 = r1;
    e->c1 = c1;
    entry_place(rt, t, i);
    return PTO_OK;
}

/* Read lookup over one list: edges to the writers of overlapping entries, and in *cand the
 * first entry of exactly this rectangle (lists are newest first). */
static PTO_INLINE void read_list(pto_runtime *rt, int32_t i, const pto_rect *r, int32_t task, pto_slot *ts,
                                 int32_t *cand)
{
    while (i >= 0) {
        const pto_entry *e = &rt->ent[i];
        if (same_rect(e, r)) {
            if (*cand < 0) {
                *cand = i;
            }
        } else if (e->writer < 0 || !overlaps(e, r)) {
            i = e->next;
            continue;
        }
        if (e->writer >= rt->retired) {
            edge_add(rt, e->wslot, task, ts);
        }
        i = e->next;
    }
}

/* run_extend past its first compare: an empty run or one whose readers all retired starts
 * over, one reader becomes a run of two, and the run's newest reader is already in. */
static int run_extend_more(const pto_runtime *rt, pto_entry *e, int32_t task)
{
    if (e->last < rt->retired) {
        e->first = e->last = task;
        e->step = 0;
        return 1;
    }
    if (e->first == e->last) {
        e->step = task - e->last;
        e->last = task;
        return 1;
    }
    return e->last == task;
}

/* Record `task` as a reader in the run of entry e when it continues the run's arithmetic
 * progression; 0 when it does not fit. The common cases (the run's next term, or the one
 * reader again: step 0) take the first compare. */
static PTO_INLINE int run_extend(const pto_runtime *rt, pto_entry *e, int32_t task)
{
    if (task - e->last == e->step) {
        e->last = task;
        return 1;
    }
    return run_extend_more(rt, e, task);
}

/* A reader-only entry of rectangle r0..c1 holding `task`, at the front of *head (or placed
 * by its rectangle when head is NULL). The rectangle comes as four values: a pointer would
 * force the hot callers to keep it in memory. */
PTO_NOINLINE static int reader_new(pto_runtime *rt, pto_tensor *t, int32_t *head, int32_t r0, int32_t c0, int32_t r1,
                                   int32_t c1, int32_t task)
{
    pto_entry *e;
    int32_t i;
    int st;
    if ((st = entry_new(rt, &i)) != PTO_OK) {
        return st;
    }
    e = &rt->ent[i];
    e->r0 = r0;
    e->c0 = c0;
    e->r1 = r1;
    e->c1 = c1;
    e->writer = -1;
    e->wslot = NULL;
    e->first = e->last = task;
    e->step = 0;
    entry_link_head(rt, t, head, i);
    return PTO_OK;
}

/* Add `task` to the readers of exactly rectangle r: extend the run of the entry found by
 * read_list when the task fits it, else start a reader-only entry. */
static PTO_INLINE int reader_add(pto_runtime *rt, pto_tensor *t, int32_t *head, int32_t cand, const pto_rect *r,
                                 int32_t task)
{
    if (cand >= 0 && run_extend(rt, &rt->ent[cand], task)) {
        return PTO_OK;
    }
    return reader_new(rt, t, head, r->r0, r->c0, r->r1, r->c1, task);
}

/* Write lookup and update over one list: edges to the writer and readers of every
 * overlapping entry, then unlink them: one entry of exactly this
 * rectangle is reused in place for the new writer, other entries inside it are dropped,
 * entries partly outside are queued in rt->tmp to be cut into pieces. */
static PTO_INLINE int write_list(pto_runtime *rt, int32_t *link, const pto_rect *r, int32_t task, pto_slot *ts,
                                 int32_t *reuse, int32_t *nsplit)
{
    int32_t i;
    int st;
    while ((i = *link) >= 0) {
        pto_entry *e = &rt->ent[i];
        int same = same_rect(e, r);
        if (!same && !overlaps(e, r)) {
            link = &e->next;
            continue;
        }
        entry_edges(rt, e, 1, task, ts);
        if (same && *reuse < 0) {
            e->writer = task;
            e->wslot = ts;
            e->last = -1;
            e->step = 0;
            *reuse = i;
            link = &e->next;
            continue;
        }
        *link = e->next;
        if (same || inside(e, r)) {
            entry_free(rt, i);
            continue;
        }
        if (*nsplit == rt->tmp_cap) {
            void *p = rt->tmp;
            st = ptoi_grow_array(rt, &p, &rt->tmp_cap, *nsplit + 1, sizeof(int32_t), "tensor map scratch");
            rt->tmp = p;
            if (st != PTO_OK) {
                return st;
            }
        }
        rt->tmp[(*nsplit)++] = i;
    }
    return PTO_OK;
}

/* A writer entry of rectangle r0..c1 for `task` at the front of *head (or placed by its
 * rectangle when head is NULL). */
static int writer_new(pto_runtime *rt, pto_tensor *t, int32_t *head, int32_t r0, int32_t c0, int32_t r1, int32_t c1,
                      int32_t task, pto_slot *ts)
{
    pto_entry *e;
    int32_t i;
    int st;
    if ((st = entry_new(rt, &i)) != PTO_OK) {
        return st;
    }
    e = &rt->ent[i];
    e->r0 = r0;
    e->c0 = c0;
    e->r1 = r1;
    e->c1 = c1;
    e->writer = task;
    e->wslot = ts;
    e->first = e->last = -1;
    e->step = 0;
    entry_link_head(rt, t, head, i);
    return PTO_OK;
}

/* Cut the entries queued in rt->tmp around rectangle r (at most 4 pieces each, keeping the
 * writer and readers), then add the new writer entry unless one was reused. */
PTO_NOINLINE static int write_finish(pto_runtime *rt, pto_tensor *t, int32_t *head, int32_t r0, int32_t c0, int32_t r1,
                                     int32_t c1, int32_t task, int32_t reuse, int32_t nsplit)
{
    pto_rect rect;
    const pto_rect *r = &rect;
    int32_t k;
    int st;
    rect.r0 = r0;
    rect.c0 = c0;
    rect.r1 = r1;
    rect.c1 = c1;
    for (k = 0; k < nsplit; k++) {
        pto_entry old = rt->ent[rt->tmp[k]];
        int32_t mr0 = old.r0 > r->r0 ? old.r0 : r->r0, mr1 = old.r1 < r->r1 ? old.r1 : r->r1;
        entry_free(rt, rt->tmp[k]);
        if (old.r0 < r->r0 && (st = add_piece(rt, t, &old, old.r0, old.c0, r->r0, old.c1)) != PTO_OK) {
            return st;
        }
        if (r->r1 < old.r1 && (st = add_piece(rt, t, &old, r->r1, old.c0, old.r1, old.c1)) != PTO_OK) {
            return st;
        }
        if (old.c0 < r->c0 && (st = add_piece(rt, t, &old, mr0, old.c0, mr1, r->c0)) != PTO_OK) {
            return st;
        }
        if (r->c1 < old.c1 && (st = add_piece(rt, t, &old, mr0, r->c1, mr1, old.c1)) != PTO_OK) {
            return st;
        }
    }
    return reuse < 0 ? writer_new(rt, t, head, r0, c0, r1, c1, task, open_slot(rt)) : PTO_OK;
}

/* One read argument anywhere in the tensor: edges from the last writers, then record the
 * task as a reader. */
PTO_NOINLINE static int read_region(pto_runtime *rt, const pto_argrec *a, int32_t task, pto_slot *ts)
{
    pto_tensor *t = &rt->tensors[a->tk >> 2];
    pto_rect r = arg_rect(a);
    int32_t cr0, cr1, cc0, cc1, cr, cc, cand = -1;
    query_cells(t, &r, &cr0, &cr1, &cc0, &cc1);
    for (cr = cr0; cr <= cr1; cr++) {
        for (cc = cc0; cc <= cc1; cc++) {
            read_list(rt, t->cells[(size_t)cr * (size_t)t->ncc + (size_t)cc], &r, task, ts, &cand);
        }
    }
    read_list(rt, t->large, &r, task, ts, &cand);
    return reader_add(rt, t, NULL, cand, &r, task);
}

/* One write (or inout) argument anywhere in the tensor: edges from the last writers and the
 * readers since, then make the task the last writer of the rectangle with no readers. */
PTO_NOINLINE static int write_region(pto_runtime *rt, const pto_argrec *a, int32_t task, pto_slot *ts)
{
    pto_tensor *t = &rt->tensors[a->tk >> 2];
    pto_rect r = arg_rect(a);
    int32_t cr0, cr1, cc0, cc1, cr, cc, reuse = -1, nsplit = 0;
    int st;
    query_cells(t, &r, &cr0, &cr1, &cc0, &cc1);
    for (cr = cr0; cr <= cr1; cr++) {
        for (cc = cc0; cc <= cc1; cc++) {
            int32_t *link = &t->cells[(size_t)cr * (size_t)t->ncc + (size_t)cc];
            if ((st = write_list(rt, link, &r, task, ts, &reuse, &nsplit)) != PTO_OK) {
                return st;
            }
        }
    }
    if ((st = write_list(rt, &t->large, &r, task, ts, &reuse, &nsplit)) != PTO_OK) {
        return st;
    }
    return write_finish(rt, t, NULL, r.r0, r.c0, r.r1, r.c1, task, reuse, nsplit);
}

/* Resolve one region argument of the open task (its record `a`, just stored) against the map
 * and apply it (the general path; task_add in pto_task.c has the exact-cell one). Arguments
 * are processed one at a time, in call order: that gives the same edges as resolving all of
 * them against the state before the task, because an earlier write already linked every
 * writer and reader a later overlapping argument would need, and the task's own entries are
 * skipped through its last_succ (see slot_init). */
static int apply_region(pto_runtime *rt, const pto_argrec *a, int32_t task, pto_slot *ts)
{
    pto_tensor *t = &rt->tensors[a->tk >> 2];
    int kind = a->tk & 3;
    int32_t ci = t->simple ? cell_index(t, a->r0, a->c0, a->nr, a->nc) : -1;
    pto_rect r;
    int st;
    if (ci < 0) {
        return kind == PTO_ARG_IN ? read_region(rt, a, task, ts) : write_region(rt, a, task, ts);
    }
    r = arg_rect(a);
    if (kind == PTO_ARG_IN) {
        int32_t cand = -1;
        read_list(rt, t->cells[ci], &r, task, ts, &cand);
        return reader_add(rt, t, &t->cells[ci], cand, &r, task);
    } else {
        int32_t reuse = -1, nsplit = 0;
        st = write_list(rt, &t->cells[ci], &r, task, ts, &reuse, &nsplit);
        if (st == PTO_OK && (reuse < 0 || nsplit > 0)) {
            st = write_finish(rt, t, &t->cells[ci], r.r0, r.c0, r.r1, r.c1, task, reuse, nsplit);
        }
        return st;
    }
}

/* Everything but the exact-cell path of task_add (pto_task.c): errors, count_only, the first
 * access of a tensor (grid), regions that are not one whole cell of a simple tensor. */
int ptoi_add_general(pto_runtime *rt, int32_t task, int32_t tensor, int kind, int64_t r0, int64_t c0, int64_t nr,
                     int64_t nc)
{
    pto_tensor *t;
    pto_argrec *a = NULL;
    int st;
    if (task != rt->open_task || task < 0 || (uint32_t)tensor >= (uint32_t)rt->n_tensors) {
        return ptoi_add_error(rt, task, tensor, kind, r0, c0, nr, nc);
    }
    t = &rt->tensors[tensor];
    if (nr <= 0 || nc <= 0 || r0 < 0 || c0 < 0 || r0 > t->rows - nr || c0 > t->cols - nc) {
        return ptoi_add_error(rt, task, tensor, kind, r0, c0, nr, nc);
    }
    if (rt->cfg.count_only) {
        rt->regions++;
        return PTO_OK;
    }
    /* grid_rows/cols: extents below which the grid must be (re)built, see ptoi_index_prepare. */
    if ((nr < t->grid_rows || nc < t->grid_cols)
        && (st = ptoi_index_prepare(rt, t, (int32_t)nr, (int32_t)nc)) != PTO_OK) {
        return st;
    }
    if ((st = next_arg(rt, &a)) != PTO_OK) {
        return st;
    }
    a->tk = (tensor << 2) | kind;
    a->r0 = (int32_t)r0;
    a->c0 = (int32_t)c0;
    a->nr = (int32_t)nr;
    a->nc = (int32_t)nc;
    st = apply_region(rt, a, task, open_slot(rt));
    if (st != PTO_OK || rt->broken) {
        /* A failure inside (edges) marked the runtime broken and recorded its status. */
        ptoi_set_broken(rt, st);
        return rt->fail_st;
    }
    arg_done(rt);
    return PTO_OK;
}

/* ---------------------------------------------------------------------------------------
 * the exact-cell path past task_add
 * ------------------------------------------------------------------------------------- */

/* The exact-cell path (see pto_tensor and task_add): the region is one whole grid cell of
 * a simple tensor, so the entries that overlap it are exactly those of the cell's list, all
 * inside the cell (no overlap tests, no pieces to cut), and an entry is the cell exactly
 * when it is `whole`. task_add handles a cell of one entry needing at most
 * two edges inline; ptoi_exact_slow everything else. */

/* An exact-cell argument failed inside (out of memory or a limit): take its record back and
 * report the failure. */
PTO_COLD static int add_failed(pto_runtime *rt)
{
    rt->arg_next--;
    rt->arg_count--;
    rt->arg_end = rt->arg_next;
    return rt->fail_st;
}

/* The exact-cell argument just stored (the newest record) in general: any list, any run,
 * edges from the slow allocator. Failures mark the runtime broken (ptoi_set_broken). */
PTO_NOINLINE int ptoi_exact_slow(pto_runtime *rt, int32_t task)
{
    const pto_argrec *a = rt->arg_next - 1;
    pto_tensor *t = &rt->tensors[a->tk >> 2];
    int32_t *head = t->cells + (size_t)(((uint64_t)a->r0 * t->ex_rmul + (uint64_t)a->c0 * t->ex_cmul) >> 32);
    pto_slot *ts = open_slot(rt);
    int32_t *link = head, i, cand = -1;
    int st = PTO_OK;
    if ((a->tk & 3) == PTO_ARG_IN) {
        for (i = *head; i >= 0; i = rt->ent[i].next) {
            pto_entry *e = &rt->ent[i];
            if (e->writer >= rt->retired) {
                edge_add(rt, e->wslot, task, ts);
            }
            if (cand < 0 && e->whole) {
                cand = i;
            }
        }
        if (cand < 0 || !run_extend(rt, &rt->ent[cand], task)) {
            st = reader_new(rt, t, head, a->r0, a->c0, a->r0 + a->nr, a->c0 + a->nc, task);
        }
    } else {
        while ((i = *link) >= 0) {
            pto_entry *e = &rt->ent[i];
            entry_edges(rt, e, 1, task, ts);
            if (cand < 0 && e->whole) {
                e->writer = task;
                e->wslot = ts;
                e->last = -1;
                e->step = 0;
                cand = i;
                link = &e->next;
            } else {
                *link = e->next;
                entry_free(rt, i);
            }
        }
        if (cand < 0) {
            st = writer_new(rt, t, head, a->r0, a->c0, a->r0 + a->nr, a->c0 + a->nc, task, ts);
        }
    }
    if (st != PTO_OK) {
        ptoi_set_broken(rt, st);
    }
    return rt->broken ? add_failed(rt) : PTO_OK;
}

/* ---------------------------------------------------------------------------------------
 * sweep of retired entries (windowed runtimes)
 * ------------------------------------------------------------------------------------- */

/* Drop entries whose tasks all retired (their dependencies are satisfied) and trim the
 * retired front of reader runs, so a windowed graph keeps a bounded map. Amortized: it runs
 * when the map has grown well past its size after the previous sweep. */
static void map_gc_list(pto_runtime *rt, int32_t *link)
{
    int32_t i;
    while ((i = *link) >= 0) {
        pto_entry *e = &rt->ent[i];
        if (e->writer < rt->retired) {
            e->writer = -1;
            e->wslot = NULL;
        }
        if (e->last < rt->retired) {
            e->last = -1;
            e->step = 0;
        } else if (e->first < rt->retired) {
            /* A run of two or more (first < last, step > 0): start at the first live one. */
            int64_t k = ((int64_t)rt->retired - e->first + e->step - 1) / e->step;
            e->first += (int32_t)(k * e->step);
            if (e->first == e->last) {
                e->step = 0;
            }
        }
        if (e->writer < 0 && e->last < 0) {
            *link = e->next;
            entry_free(rt, i);
            continue;
        }
        link = &e->next;
    }
}

void ptoi_map_gc(pto_runtime *rt)
{
    int32_t ti;
    int64_t k;
    for (ti = 0; ti < rt->n_tensors; ti++) {
        pto_tensor *t = &rt->tensors[ti];
        if (t->cells == NULL) {
            continue;
        }
        for (k = 0; k < (int64_t)t->ncr * t->ncc; k++) {
            if (t->cells[k] >= 0) {
                map_gc_list(rt, &t->cells[k]);
            }
        }
        map_gc_list(rt, &t->large);
        tensor_set_simple(t, t->large < 0 && t->reach_r == 0 && t->reach_c == 0);
    }
    /* The next sweep waits for half the survivors again in new entries (at least GC_MIN), plus
     * an eighth of the grid, so the sweep's O(entries + cells) cost stays amortized over the
     * entries created in between while the map stays close to its live size. */
    rt->gc_at = rt->ent_live + (rt->ent_live / 2 > GC_MIN ? rt->ent_live / 2 : GC_MIN) + rt->cells_total / 8;
}
