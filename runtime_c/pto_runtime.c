/* pto_runtime.c - the PTO task-graph runtime: region-overlap dependency tracking over
 * 2-D tensors, a ready queue, and a task window with retirement so long graphs run in
 * bounded memory.
 *
 * Plain C99 plus the C standard library only (stdio for the dump file and messages); the
 * optional thread support comes in through the sync hooks of pto_config, never through a
 * platform header. docs/RUNTIME.md documents the design; the short version:
 *
 *  - tasks live in chunked FIFO storage (slot chunks, argument-record chunks) indexed by
 *    task id / argument sequence number; retiring tasks give whole chunks back (without a
 *    window, chunks come in contiguous slabs);
 *  - edges are 8-byte nodes of per-predecessor singly linked fanout lists in a pooled array;
 *  - the tensor map keeps, per tensor, rectangles with their last writer (disjoint) and the
 *    readers since (run-length encoded arithmetic progressions of task ids) in a grid of
 *    cells, so an overlap query visits only nearby entries;
 *  - each region argument is resolved and applied when it is added, so pto_task_submit only
 *    decides whether the task is ready; an argument that is exactly one grid cell holding
 *    one entry of that cell (the common case of tile programs) is handled by a straight-line
 *    path inside the public pto_task_add_* functions (see task_add).
 */

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pto_runtime.h"

/* Chunk sizes (log2 of elements per chunk): 8-10 KiB chunks, small enough that a small
 * graph or window costs little memory, large enough that chunk bookkeeping is noise.
 * Without a window (the whole graph is kept, chunks are never given back one by one) new
 * chunks come in slabs of up to SLAB_MAX consecutive ones, about 1/16 of the pool so far:
 * the three record streams then run through long contiguous stretches, which builds about
 * 10% faster than a stream that jumps every 8 KiB (docs/PERF.md), while the unused tail of
 * the last slab stays a small fraction of the memory. */
enum {
    SLOT_SHIFT = 8,
    ARG_SHIFT = 9,
    EDGE_SHIFT = 10,
    SLAB_MAX = 16,
    SLAB_DIV = 16,
    MAX_SPARE = 2,     /* released chunks kept for reuse before they are freed */
    MAX_REACH = 2,     /* an entry anchored in the grid spans at most MAX_REACH+1 cells */
    MAX_CELLS = 1 << 16,
    MAX_NAME = 255,
    GC_MIN = 1024
};

/* Slow paths (errors, growth, first touches) stay out of line so the hot paths around them
 * need no register saves, and the per-argument path is inlined into each public entry
 * point (the argument kind then folds away); plain functions on other compilers. */
#if defined(__GNUC__)
#define PTO_COLD __attribute__((noinline, cold))
#define PTO_NOINLINE __attribute__((noinline))
#define PTO_INLINE __attribute__((always_inline)) inline
#else
#define PTO_COLD
#define PTO_NOINLINE
#define PTO_INLINE inline
#endif

/* GCC's -O2 packs small struct stores into vector registers ("SLP vectorization"); for
 * these few scattered int32 fields that costs more instructions than it saves. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-tree-slp-vectorize")
#endif

#define SLOT_MASK ((1u << SLOT_SHIFT) - 1u)
#define ARG_MASK ((1u << ARG_SHIFT) - 1u)
#define EDGE_MASK ((1u << EDGE_SHIFT) - 1u)
#define ARG_CHUNK (1u << ARG_SHIFT)

/* One task slot (32 bytes: a power of two, so a slot never straddles a cache line and its
 * address is a shift away). fanin counts every recorded predecessor; pending those not
 * completed yet, so the task becomes ready when pending reaches 0. While the task is open,
 * pending holds minus the number of its predecessors that completed (so adding an edge only
 * counts fanin); pto_task_submit adds fanin. */
typedef struct {
    int32_t func;
    int32_t state;
    int32_t buffer_bytes;
    uint32_t arg_begin; /* sequence number of its first argument record */
    int32_t fanout;     /* head edge index of its successor list, newest first; -1 none */
    int32_t last_succ;  /* newest successor (initially the task itself), see edge_add */
    int32_t fanin;
    int32_t pending;
} pto_slot;

/* One stored argument (20 bytes): tk = tensor << 2 | kind. Scalars keep the value's low
 * 32 bits in r0 and high 32 bits in c0. Tensor shapes are limited to 2^31-1 per dimension,
 * so a region fits in four int32. */
typedef struct {
    int32_t tk;
    int32_t r0, c0, nr, nc;
} pto_argrec;

typedef struct {
    int32_t succ;
    int32_t next;
} pto_edge;

/* One tensor-map rectangle [r0, r1) x [c0, c1) (48 bytes): `writer` wrote these elements
 * last (-1: no live writer; `wslot` is its slot, valid while it is live), and tasks first,
 * first+step, ..., last read every element since that write (last = -1: no readers; one
 * reader: first == last and step 0, so a run is extended by one compare, see run_extend).
 * Writer rectangles are disjoint; reader-only entries (writer -1) may overlap others.
 * Tile-shaped programs keep one entry per tile: its writer and the run of tasks that read it
 * (a weight read by every row tile is one entry). `whole`: the rectangle is exactly one full
 * cell of its tensor's grid (kept by entry_place/entry_link_head and the regrid). */
typedef struct {
    int32_t r0, c0, r1, c1;
    int32_t next;
    int32_t whole;      /* 0 or 1, right after next: see alone_whole */
    int32_t writer;
    int32_t first;
    int32_t step;
    int32_t last;
    pto_slot *wslot;
} pto_entry;

/* `whole` follows `next` with no padding (a negative array size otherwise). */
typedef char pto_entry_layout_check[offsetof(pto_entry, whole) == offsetof(pto_entry, next) + 4 ? 1 : -1];

/* Per tensor: shape, name and its part of the tensor map. The grid has ncr x ncc cells of
 * 2^shr rows by 2^shc cols; an entry is anchored in the cell of its top-left element unless
 * it spans more than MAX_REACH+1 cells in a dimension, then it goes to the `large` list.
 * A dimension's cell size is fixed by the first access that does not cover the whole
 * dimension (shift 31 = one cell until then). reach_* is the largest span seen, so a query
 * looks that many cells up/left of itself.
 *
 * The first 64 bytes serve the exact-cell path of task_add: while the tensor is `simple`
 * (every entry lies inside its anchor cell), an access of exactly one whole cell (ex_rows x
 * ex_cols at a multiple of them, r0 < ex_rlim, c0 < ex_clim) overlaps exactly the entries of
 * that cell, found at cells[(r0 * ex_rmul + c0 * ex_cmul) >> 32]. ex_rlim = ex_clim = 0
 * turns the path off. 128 bytes in all on 64-bit targets, so a tensor's address is a shift
 * away. */
typedef struct {
    int32_t *cells;
    int64_t ex_rows, ex_cols;
    uint64_t ex_rlim, ex_clim;
    uint64_t ex_rmul, ex_cmul;
    uint32_t ex_rmask, ex_cmask;
    int32_t rows, cols, elem_size;
    uint32_t name;
    int32_t large;
    int32_t ncr, ncc;
    int32_t maskr, maskc;         /* ~(cell rows - 1), ~(cell cols - 1): same-cell tests */
    int64_t grid_rows, grid_cols; /* accesses with fewer rows/cols (re)build the grid */
    uint8_t shr, shc, fixed_r, fixed_c, reach_r, reach_c;
    uint8_t simple;               /* reach 0 and no large entries: see apply_region */
} pto_tensor;

/* Blocks of several consecutive chunks (runtimes without a window, see SLAB_MAX): freed
 * only when the runtime is destroyed. */
typedef struct {
    char **ptr;
    size_t *bytes;
    uint32_t n, cap;
} pto_slabs;

/* Chunked FIFO storage: chunk number k (a counter that only grows) is dir[k & mask];
 * sequence numbers are uint32 and wrap, which stays consistent because the directory size
 * divides 2^(32 - shift). [start, end) is the range of sequence numbers with storage. */
typedef struct {
    void **dir;
    uint32_t cap; /* directory capacity, a power of two (0 before the first chunk) */
    size_t mask;   /* cap - 1 (a size_t: stores through int32 pointers cannot alias it) */
    uint32_t lo, hi;
    uint32_t start, end;
    uint32_t shift;
    size_t chunk_bytes;
    void **spare; /* released chunks kept for reuse */
    uint32_t nspare, spare_cap;
    uint32_t slab_max; /* > 1: new chunks come in slabs and are never freed one by one */
    uint32_t total;    /* chunks allocated so far (slab mode) */
    pto_slabs slabs;
} pto_chunks;

struct pto_runtime {
    pto_config cfg;
    int broken;
    int64_t bytes, bytes_peak;

    char *names;
    size_t names_len, names_cap;
    pto_tensor *tensors;
    int32_t n_tensors, tensors_cap;
    uint32_t *funcs;
    int32_t n_funcs, funcs_cap;

    int32_t next_id;   /* ids handed out so far */
    int32_t retired;   /* every id below has retired */
    int32_t open_task; /* the allocated, not yet submitted task, or -1 */
    /* The open task's id when the unlocked fast paths may add to and submit it, else -1;
     * 64 bits wide so that no int32 argument, zero-extended, equals -1. */
    int64_t add_task;
    /* Bump-allocation windows into the current chunk of each pool: [next, end) is free
     * (empty: take the slow path, which refills it). The slot window is kept empty while a
     * lock or count_only is configured and never reaches past the task window. */
    pto_slot *slot_next, *slot_end;
    pto_argrec *arg_next, *arg_end;
    pto_chunks slots, args;
    uint64_t arg_count; /* argument records ever stored: the next one's sequence number */
    uint32_t arg_tail;

    /* Edge nodes: ids [ebump, elim) are the bump window, node i at address ebase + 8 i (the
     * window's chunk minus its first id's offset, as an integer: see edge_window_at). */
    uintptr_t ebase;
    size_t ebump, elim;
    pto_edge **edir;
    int32_t edir_cap, n_echunks, efree, ecap; /* ecap = n_echunks << EDGE_SHIFT */
    pto_slabs eslabs;                         /* edge chunks of a runtime without a window */
    int fail_st;       /* status of the failure that set `broken` inside a fast path */

    pto_entry *ent;
    int32_t ent_cap, ent_bump, ent_free;
    int64_t ent_live, ent_peak, gc_at, cells_total;
    int32_t *tmp;
    int32_t tmp_cap;

    int32_t *rq;
    uint32_t rq_cap, rq_head, rq_tail;

    int64_t submitted, completed, regions, scalars, edges_reused, edges_freed; /* regions: count_only */
    int32_t count_func; /* count_only: the open task's function (no slots are kept) */
    char err[512];
};

/* ---------------------------------------------------------------------------------------
 * errors and memory accounting
 * ------------------------------------------------------------------------------------- */

PTO_COLD static int fail(pto_runtime *rt, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rt->err, sizeof rt->err, fmt, ap);
    va_end(ap);
    return status;
}

/* Mark the runtime unusable: no open task, and empty bump windows, so every fast path
 * refuses and the checks of the slow paths report it. */
static void set_broken(pto_runtime *rt, int status)
{
    if (!rt->broken) {
        rt->fail_st = status;
    }
    rt->broken = 1;
    rt->open_task = -1;
    rt->add_task = -1;
    rt->slot_end = rt->slot_next;
    rt->arg_end = rt->arg_next;
}

PTO_COLD static int oom(pto_runtime *rt, const char *what)
{
    set_broken(rt, PTO_ERR_NO_MEMORY);
    return fail(rt, PTO_ERR_NO_MEMORY, "out of memory growing the %s (runtime holds %" PRId64
                " bytes); the runtime is unusable now, destroy it", what, rt->bytes);
}

PTO_COLD static int broken_error(pto_runtime *rt)
{
    return fail(rt, PTO_ERR_NO_MEMORY, "the runtime is unusable after an earlier out-of-memory or limit error; "
                "destroy it");
}

static void *mem_alloc(pto_runtime *rt, size_t n)
{
    void *p = malloc(n);
    if (p != NULL) {
        rt->bytes += (int64_t)n;
        if (rt->bytes > rt->bytes_peak) {
            rt->bytes_peak = rt->bytes;
        }
    }
    return p;
}

static void *mem_realloc(pto_runtime *rt, void *p, size_t old_n, size_t n)
{
    void *q = realloc(p, n);
    if (q != NULL) {
        rt->bytes += (int64_t)n - (int64_t)old_n;
        if (rt->bytes > rt->bytes_peak) {
            rt->bytes_peak = rt->bytes;
        }
    }
    return q;
}

static void mem_free(pto_runtime *rt, void *p, size_t n)
{
    if (p != NULL) {
        free(p);
        rt->bytes -= (int64_t)n;
    }
}

/* Grow a plain array to hold at least `need` elements (geometric, so appends stay O(1)). */
PTO_COLD static int grow_array(pto_runtime *rt, void **arr, int32_t *cap, int32_t need, size_t elem,
                      const char *what)
{
    int64_t n = *cap > 0 ? *cap : 16;
    void *p;
    while (n < need) {
        n *= 2;
    }
    if (n > INT32_MAX) {
        return fail(rt, PTO_ERR_LIMIT, "the %s would exceed %d elements", what, INT32_MAX);
    }
    p = mem_realloc(rt, *arr, (size_t)*cap * elem, (size_t)n * elem);
    if (p == NULL) {
        return oom(rt, what);
    }
    *arr = p;
    *cap = (int32_t)n;
    return PTO_OK;
}

/* ---------------------------------------------------------------------------------------
 * chunked FIFO storage
 * ------------------------------------------------------------------------------------- */

/* Slab size for a pool of `total` chunks so far: about 1/SLAB_DIV of it, 1..SLAB_MAX. */
static uint32_t slab_chunks(uint32_t total)
{
    uint32_t n = total / SLAB_DIV;
    return n < 1 ? 1 : n > SLAB_MAX ? SLAB_MAX : n;
}

/* A new slab of n chunks of chunk_bytes each, recorded in sl; NULL when out of memory. */
static char *slab_new(pto_runtime *rt, pto_slabs *sl, size_t chunk_bytes, uint32_t n)
{
    char *p;
    if (sl->n == sl->cap) {
        uint32_t ncap = sl->cap ? sl->cap * 2 : 8;
        char **np = mem_realloc(rt, sl->ptr, sl->cap * sizeof *np, ncap * sizeof *np);
        size_t *nb;
        if (np == NULL) {
            return NULL;
        }
        sl->ptr = np;
        nb = mem_realloc(rt, sl->bytes, sl->cap * sizeof *nb, ncap * sizeof *nb);
        if (nb == NULL) {
            return NULL;
        }
        sl->bytes = nb;
        sl->cap = ncap;
    }
    p = mem_alloc(rt, chunk_bytes * n);
    if (p != NULL) {
        sl->ptr[sl->n] = p;
        sl->bytes[sl->n] = chunk_bytes * n;
        sl->n++;
    }
    return p;
}

static void slabs_free(pto_runtime *rt, pto_slabs *sl)
{
    uint32_t k;
    for (k = 0; k < sl->n; k++) {
        mem_free(rt, sl->ptr[k], sl->bytes[k]);
    }
    mem_free(rt, sl->ptr, sl->cap * sizeof *sl->ptr);
    mem_free(rt, sl->bytes, sl->cap * sizeof *sl->bytes);
}

static void chunks_init(pto_chunks *c, uint32_t shift, size_t elem, uint32_t slab_max)
{
    memset(c, 0, sizeof *c);
    c->shift = shift;
    c->slab_max = slab_max;
    c->chunk_bytes = ((size_t)1 << shift) * elem;
}

/* Add storage for the next chunk of sequence numbers [end, end + chunk). */
PTO_COLD static int chunks_push(pto_runtime *rt, pto_chunks *c, const char *what)
{
    void *p;
    if (c->hi - c->lo == c->cap) {
        uint32_t ncap = c->cap ? c->cap * 2 : 8;
        uint32_t k;
        void **nd;
        if (ncap > (1u << (32 - c->shift))) {
            return fail(rt, PTO_ERR_LIMIT, "the %s would exceed 2^32 live records", what);
        }
        nd = mem_alloc(rt, ncap * sizeof *nd);
        if (nd == NULL) {
            return oom(rt, what);
        }
        for (k = c->lo; k != c->hi; k++) {
            nd[k & (ncap - 1)] = c->dir[k & (c->cap - 1)];
        }
        mem_free(rt, c->dir, c->cap * sizeof *c->dir);
        c->dir = nd;
        c->cap = ncap;
        c->mask = ncap - 1;
    }
    if (c->nspare > 0) {
        p = c->spare[--c->nspare];
    } else if (c->slab_max > 1) {
        /* A slab: its first chunk now, the others to the spares in address order. The spare
         * array is sized for every chunk, so chunks_reset can always keep them all. */
        uint32_t n = slab_chunks(c->total), k;
        char *slab;
        if (c->spare_cap < c->total + n) {
            uint32_t ncap = c->spare_cap ? c->spare_cap : 4;
            void **ns;
            while (ncap < c->total + n) {
                ncap *= 2;
            }
            ns = mem_realloc(rt, c->spare, c->spare_cap * sizeof *ns, ncap * sizeof *ns);
            if (ns == NULL) {
                return oom(rt, what);
            }
            c->spare = ns;
            c->spare_cap = ncap;
        }
        if ((slab = slab_new(rt, &c->slabs, c->chunk_bytes, n)) == NULL) {
            return oom(rt, what);
        }
        for (k = n - 1; k >= 1; k--) {
            c->spare[c->nspare++] = slab + (size_t)k * c->chunk_bytes;
        }
        c->total += n;
        p = slab;
    } else if ((p = mem_alloc(rt, c->chunk_bytes)) == NULL) {
        return oom(rt, what);
    }
    c->dir[c->hi & (c->cap - 1)] = p;
    c->hi++;
    c->end += 1u << c->shift;
    return PTO_OK;
}

/* Keep a released chunk for reuse (up to `keep` of them), else free it. */
static void chunks_keep(pto_runtime *rt, pto_chunks *c, void *p, uint32_t keep)
{
    if (c->nspare < keep && c->nspare == c->spare_cap) {
        uint32_t ncap = c->spare_cap ? c->spare_cap * 2 : 4;
        void **ns = mem_realloc(rt, c->spare, c->spare_cap * sizeof *ns, ncap * sizeof *ns);
        if (ns != NULL) {
            c->spare = ns;
            c->spare_cap = ncap;
        }
    }
    if (c->nspare < keep && c->nspare < c->spare_cap) {
        c->spare[c->nspare++] = p;
    } else if (c->slab_max <= 1) {
        mem_free(rt, p, c->chunk_bytes);
    } /* else it belongs to a slab (not reached: the spare array holds every chunk) */
}

/* Give back the oldest chunk (every record in it has retired). */
static void chunks_pop(pto_runtime *rt, pto_chunks *c)
{
    void *p = c->dir[c->lo & (c->cap - 1)];
    c->lo++;
    c->start += 1u << c->shift;
    chunks_keep(rt, c, p, MAX_SPARE);
}

/* Forget every record but keep the memory for the next graph (pto_runtime_reset). The
 * spares are taken from the top, so pushing the chunks newest first hands them out again in
 * the order the last graph used them (consecutive slab chunks stay consecutive). */
static void chunks_reset(pto_runtime *rt, pto_chunks *c)
{
    uint32_t k;
    for (k = c->hi; k != c->lo; k--) {
        chunks_keep(rt, c, c->dir[(k - 1) & (c->cap - 1)], UINT32_MAX);
    }
    c->lo = c->hi = 0;
    c->start = c->end = 0;
}

static void chunks_free(pto_runtime *rt, pto_chunks *c)
{
    uint32_t k;
    if (c->slab_max > 1) {
        slabs_free(rt, &c->slabs);
    } else {
        for (k = c->lo; k != c->hi; k++) {
            mem_free(rt, c->dir[k & (c->cap - 1)], c->chunk_bytes);
        }
        for (k = 0; k < c->nspare; k++) {
            mem_free(rt, c->spare[k], c->chunk_bytes);
        }
    }
    mem_free(rt, c->spare, c->spare_cap * sizeof *c->spare);
    mem_free(rt, c->dir, c->cap * sizeof *c->dir);
}

static PTO_INLINE pto_slot *slot_at(const pto_runtime *rt, int32_t id)
{
    uint32_t s = (uint32_t)id;
    return (pto_slot *)rt->slots.dir[(s >> SLOT_SHIFT) & rt->slots.mask] + (s & SLOT_MASK);
}

static PTO_INLINE pto_argrec *arg_at(const pto_runtime *rt, uint32_t seq)
{
    return (pto_argrec *)rt->args.dir[(seq >> ARG_SHIFT) & rt->args.mask] + (seq & ARG_MASK);
}

static PTO_INLINE pto_edge *edge_at(const pto_runtime *rt, int32_t i)
{
    return rt->edir[(uint32_t)i >> EDGE_SHIFT] + ((uint32_t)i & EDGE_MASK);
}

/* Slot of the open task: the newest slot handed out (not in count_only mode). */
static PTO_INLINE pto_slot *open_slot(const pto_runtime *rt)
{
    return rt->slot_next - 1;
}

/* Arguments of live task id: sequence numbers [*begin, *begin + *n). */
static void task_arg_range(const pto_runtime *rt, int32_t id, uint32_t *begin, uint32_t *n)
{
    uint32_t b = slot_at(rt, id)->arg_begin;
    uint32_t e = (id + 1 < rt->next_id) ? slot_at(rt, id + 1)->arg_begin : (uint32_t)rt->arg_count;
    *begin = b;
    *n = e - b;
}

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
            return oom(rt, "ready queue");
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
 * tensor map: entry pool, grid placement
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
            int st = grow_array(rt, &p, &rt->ent_cap, rt->ent_cap + 1, sizeof(pto_entry), "tensor map");
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
        return oom(rt, "tensor map grid");
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
PTO_COLD static int index_prepare(pto_runtime *rt, pto_tensor *t, int32_t nr, int32_t nc)
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
 * dependency resolution
 * ------------------------------------------------------------------------------------- */

/* One more chunk of edge nodes (a slab of them without a window, see SLAB_MAX). */
PTO_COLD static int edge_grow(pto_runtime *rt)
{
    const int32_t limit = (1 << (31 - EDGE_SHIFT)) - 1;
    const size_t bytes = sizeof(pto_edge) << EDGE_SHIFT;
    int32_t n = rt->cfg.window > 0 ? 1 : (int32_t)slab_chunks((uint32_t)rt->n_echunks), k;
    pto_edge *chunk;
    if (rt->n_echunks >= limit) {
        return fail(rt, PTO_ERR_LIMIT, "more than %d live dependency edges", INT32_MAX - (int32_t)EDGE_MASK);
    }
    if (n > limit - rt->n_echunks) {
        n = limit - rt->n_echunks;
    }
    if (rt->n_echunks + n > rt->edir_cap) {
        void *p = rt->edir;
        int st = grow_array(rt, &p, &rt->edir_cap, rt->n_echunks + n, sizeof(pto_edge *), "edge pool");
        rt->edir = p;
        if (st != PTO_OK) {
            return st;
        }
    }
    chunk = rt->cfg.window > 0 ? mem_alloc(rt, bytes) : (pto_edge *)(void *)slab_new(rt, &rt->eslabs, bytes, (uint32_t)n);
    if (chunk == NULL) {
        return oom(rt, "edge pool");
    }
    for (k = 0; k < n; k++) {
        rt->edir[rt->n_echunks++] = chunk + ((size_t)k << EDGE_SHIFT);
    }
    rt->ecap = rt->n_echunks << EDGE_SHIFT;
    return PTO_OK;
}

/* Edges recorded so far: every node ever handed out (bump-allocated or reused). */
static int64_t edges_total(const pto_runtime *rt)
{
    return (int64_t)rt->ebump + rt->edges_reused;
}

/* Node i of the bump window: an address computed as an integer (the window's chunk minus
 * the offset of its first id), so no out-of-range pointer is ever formed. */
static PTO_INLINE pto_edge *edge_window_at(const pto_runtime *rt, size_t i)
{
    return (pto_edge *)(rt->ebase + (uintptr_t)i * sizeof(pto_edge));
}

/* Fill edge node i (ed) as pred -> task, pred's slot ps, task's slot ts (the open task). */
static PTO_INLINE void edge_link(pto_edge *ed, int32_t i, pto_slot *ps, int32_t task, pto_slot *ts)
{
    ed->succ = task;
    ed->next = ps->fanout;
    ps->fanout = i;
    ps->last_succ = task;
    ts->fanin++;
    if (ps->state == PTO_TASK_COMPLETED) {
        ts->pending--; /* see pto_slot: submit adds fanin */
    }
}

/* edge_add when the bump window is empty: a node freed by retirement, else a fresh window
 * of the current (or a new) chunk. A failure marks the runtime broken (set_broken); the
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
                set_broken(rt, st);
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

/* A region argument as a half-open rectangle. */
typedef struct {
    int32_t r0, c0, r1, c1;
} pto_rect;

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
            st = grow_array(rt, &p, &rt->tmp_cap, *nsplit + 1, sizeof(int32_t), "tensor map scratch");
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

/* An exact-cell argument failed inside (out of memory or a limit): take its record back and
 * report the failure. */
PTO_COLD static int add_failed(pto_runtime *rt)
{
    rt->arg_next--;
    rt->arg_count--;
    rt->arg_end = rt->arg_next;
    return rt->fail_st;
}

/* The exact-cell path (see pto_tensor and task_add): the region is one whole grid cell of
 * a simple tensor, so the entries that overlap it are exactly those of the cell's list, all
 * inside the cell (no overlap tests, no pieces to cut), and an entry is the cell exactly
 * when it is `whole`. task_add handles a cell of one entry needing at most
 * two edges inline; exact_slow everything else. */

/* e is alone in its list and `whole` (next == -1, whole == 1): one 64-bit compare. */
static PTO_INLINE int alone_whole(const pto_entry *e)
{
    static const int32_t want[2] = {-1, 1};
    uint64_t have, need;
    memcpy(&have, (const unsigned char *)e + offsetof(pto_entry, next), sizeof have);
    memcpy(&need, want, sizeof need);
    return have == need;
}

/* edge_add's fast branch, the caller having checked the bump window has room. */
static PTO_INLINE void edge_add_room(pto_runtime *rt, pto_slot *ps, int32_t task, pto_slot *ts)
{
    size_t i = rt->ebump;
    rt->ebump = i + 1u;
    edge_link(edge_window_at(rt, i), (int32_t)i, ps, task, ts);
}

/* The exact-cell argument just stored (the newest record) in general: any list, any run,
 * edges from the slow allocator. Failures mark the runtime broken (set_broken). */
PTO_NOINLINE static int exact_slow(pto_runtime *rt, int32_t task)
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
        set_broken(rt, st);
    }
    return rt->broken ? add_failed(rt) : PTO_OK;
}

/* ---------------------------------------------------------------------------------------
 * tensor map garbage collection
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

static void map_gc(pto_runtime *rt)
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

/* ---------------------------------------------------------------------------------------
 * task life cycle
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
        return broken_error(rt);
    }
    if (task < 0 || task >= rt->next_id) {
        return fail(rt, PTO_ERR_UNKNOWN_TASK, "%s: unknown task id %d (%d tasks allocated)", what, task,
                    rt->next_id);
    }
    if (task < rt->retired) {
        return fail(rt, PTO_ERR_STATE, "%s: task %d was already submitted (it has retired)", what, task);
    }
    if (rt->cfg.count_only) {
        return fail(rt, PTO_ERR_STATE, "%s: task %d was already submitted", what, task);
    }
    return fail(rt, PTO_ERR_STATE, "%s: task %d (%s) was already submitted; its state is %s", what, task,
                func_name(rt, slot_at(rt, task)->func), state_name(slot_at(rt, task)->state));
}

PTO_COLD static int alloc_error(pto_runtime *rt, int32_t func, int32_t buffer_bytes, int32_t *out)
{
    if (rt->broken) {
        return broken_error(rt);
    }
    if (out == NULL) {
        return fail(rt, PTO_ERR_INVALID, "pto_task_alloc: NULL output pointer");
    }
    if (func < 0 || func >= rt->n_funcs) {
        return fail(rt, PTO_ERR_UNKNOWN_FUNC, "pto_task_alloc: unknown function id %d (%d functions registered)",
                    func, rt->n_funcs);
    }
    if (buffer_bytes < 0) {
        return fail(rt, PTO_ERR_INVALID, "pto_task_alloc: negative buffer_bytes %d for function '%s'",
                    buffer_bytes, func_name(rt, func));
    }
    if (rt->open_task >= 0) {
        return fail(rt, PTO_ERR_STATE, "pto_task_alloc: task %d (%s) is still open; submit it before allocating "
                    "another task", rt->open_task,
                    func_name(rt, rt->cfg.count_only ? rt->count_func : slot_at(rt, rt->open_task)->func));
    }
    return fail(rt, PTO_ERR_LIMIT, "pto_task_alloc: task ids exhausted (%d tasks)", INT32_MAX);
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
        map_gc(rt);
    }
    while (rt->cfg.window > 0 && rt->next_id - rt->retired >= rt->cfg.window) {
        if (rt->cfg.wait == NULL) {
            return fail(rt, PTO_ERR_WINDOW_FULL, "pto_task_alloc: task window full: all %d slots hold live tasks "
                        "(ids %d..%d); oldest task %d is %s; complete tasks to retire them (a task retires when "
                        "it and every earlier task completed)", rt->cfg.window, rt->retired, rt->next_id - 1,
                        rt->retired, state_name(slot_at(rt, rt->retired)->state));
        }
        rt->cfg.wait(rt->cfg.sync_ctx);
    }
    id = rt->next_id;
    if ((uint32_t)id == rt->slots.end && (st = chunks_push(rt, &rt->slots, "task slots")) != PTO_OK) {
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

PTO_COLD static int add_error(pto_runtime *rt, int32_t task, int32_t tensor, int kind, int64_t r0, int64_t c0, int64_t nr,
                     int64_t nc)
{
    static const char *const kinds[] = {"input", "output", "inout"};
    const pto_tensor *t;
    const char *f, *tn;
    char r1[24], c1[24];
    if (task != rt->open_task || task < 0) {
        return not_open_error(rt, task, "add region");
    }
    if (tensor < 0 || tensor >= rt->n_tensors) {
        return fail(rt, PTO_ERR_UNKNOWN_TENSOR, "task %d: unknown tensor id %d (%d tensors registered)", task,
                    tensor, rt->n_tensors);
    }
    t = &rt->tensors[tensor];
    f = func_name(rt, rt->cfg.count_only ? rt->count_func : slot_at(rt, task)->func);
    tn = rt->names + t->name;
    if (nr <= 0 || nc <= 0) {
        return fail(rt, PTO_ERR_REGION, "task %d (%s) %s on tensor '%s': region extent %" PRId64 " x %" PRId64
                    " must be positive", task, f, kinds[kind], tn, nr, nc);
    }
    return fail(rt, PTO_ERR_REGION, "task %d (%s) %s on tensor '%s': region rows %" PRId64 "..%s x cols %" PRId64
                "..%s is outside the tensor (%d x %d)", task, f, kinds[kind], tn, r0,
                region_end(r1, sizeof r1, r0, nr), c0, region_end(c1, sizeof c1, c0, nc), t->rows, t->cols);
}

/* Room for the next argument record of the open task in the FIFO pool (arg_done commits
 * it once the argument was applied). */
static int next_arg(pto_runtime *rt, pto_argrec **out)
{
    int st;
    if (rt->arg_next == rt->arg_end) {
        uint32_t head = (uint32_t)rt->arg_count;
        if (head == rt->args.end && (st = chunks_push(rt, &rt->args, "argument records")) != PTO_OK) {
            return st;
        }
        if ((uint32_t)(head - rt->arg_tail) >= (uint32_t)INT32_MAX - ARG_CHUNK) {
            return fail(rt, PTO_ERR_LIMIT, "more than %d live argument records", INT32_MAX - (int32_t)ARG_CHUNK);
        }
        rt->arg_next = arg_at(rt, head);
        rt->arg_end = rt->arg_next + (rt->args.end - head);
    }
    *out = rt->arg_next;
    return PTO_OK;
}

/* Commit the record next_arg handed out. */
static PTO_INLINE void arg_done(pto_runtime *rt)
{
    rt->arg_next++;
    rt->arg_count++;
}

/* Resolve one region argument of the open task against the map and apply it (the general
 * path; task_add has the exact-cell one). Arguments are processed one at a time, in call
 * order: that gives the same edges as resolving all of them against the state before the
 * task, because an earlier write already linked every writer and reader a later
 * overlapping argument would need, and the task's own entries are skipped through its
 * last_succ (see slot_init). */
static int apply_region(pto_runtime *rt, pto_tensor *t, int kind, int32_t r0, int32_t c0, int32_t nr, int32_t nc,
                        const pto_argrec *a, int32_t task, pto_slot *ts)
{
    int32_t ci = t->simple ? cell_index(t, r0, c0, nr, nc) : -1;
    pto_rect r;
    int st;
    if (ci < 0) {
        return kind == PTO_ARG_IN ? read_region(rt, a, task, ts) : write_region(rt, a, task, ts);
    }
    r.r0 = r0;
    r.c0 = c0;
    r.r1 = r0 + nr;
    r.c1 = c0 + nc;
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

/* Everything but task_add's exact-cell path: errors, count_only, the first access of a
 * tensor (grid), regions that are not one whole cell of a simple tensor. */
PTO_NOINLINE static int task_add_general(pto_runtime *rt, int32_t task, int32_t tensor, int kind, int64_t r0,
                                         int64_t c0, int64_t nr, int64_t nc)
{
    pto_tensor *t;
    pto_argrec *a = NULL;
    int st;
    if (task != rt->open_task || task < 0 || (uint32_t)tensor >= (uint32_t)rt->n_tensors) {
        return add_error(rt, task, tensor, kind, r0, c0, nr, nc);
    }
    t = &rt->tensors[tensor];
    if (nr <= 0 || nc <= 0 || r0 < 0 || c0 < 0 || r0 > t->rows - nr || c0 > t->cols - nc) {
        return add_error(rt, task, tensor, kind, r0, c0, nr, nc);
    }
    if (rt->cfg.count_only) {
        rt->regions++;
        return PTO_OK;
    }
    /* grid_rows/cols: extents below which the grid must be (re)built, see index_prepare. */
    if ((nr < t->grid_rows || nc < t->grid_cols) && (st = index_prepare(rt, t, (int32_t)nr, (int32_t)nc)) != PTO_OK) {
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
    st = apply_region(rt, t, kind, (int32_t)r0, (int32_t)c0, (int32_t)nr, (int32_t)nc, a, task, open_slot(rt));
    if (st != PTO_OK || rt->broken) {
        /* A failure inside (edges) marked the runtime broken and recorded its status. */
        set_broken(rt, st);
        return rt->fail_st;
    }
    arg_done(rt);
    return PTO_OK;
}

/* task_add's answers past PTO_OK: the caller goes on with exact_slow or with add_slow (a
 * plain jump either way, as both take the caller's arguments or fewer). */
enum { ADD_EXACT_SLOW = 1, ADD_NOT_FAST = 2 };

/* Called once per region argument; inlined into each public entry point, so `kind` is a
 * constant. The fast path takes a region that is one whole grid cell of a simple tensor
 * (see pto_tensor): its checks also prove the region inside the tensor, and the cell's list
 * is all the map work. When that list is one entry of exactly the cell (the tile it was
 * written or read as before) and at most two edges are due, it is handled here, straight
 * through with no call (so the public entry points need no stack frame); other exact-cell
 * arguments return ADD_EXACT_SLOW, and everything else (and any call under a lock, where
 * add_task stays -1) ADD_NOT_FAST. The record is committed first: exact_slow reads
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
        set_broken(rt, st);
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

static int64_t scalar_value(const pto_argrec *a)
{
    return (int64_t)(((uint64_t)(uint32_t)a->c0 << 32) | (uint64_t)(uint32_t)a->r0);
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
            chunks_pop(rt, &rt->args);
        }
        if (((uint32_t)rt->retired & SLOT_MASK) == 0) {
            chunks_pop(rt, &rt->slots);
        }
    }
}

static int task_complete(pto_runtime *rt, int32_t task)
{
    pto_slot *s;
    int32_t i;
    if (rt->cfg.count_only) {
        return fail(rt, PTO_ERR_STATE, "complete task %d: a count_only runtime keeps no tasks", task);
    }
    if (task < 0 || task >= rt->next_id) {
        return fail(rt, PTO_ERR_UNKNOWN_TASK, "complete: unknown task id %d (%d tasks allocated)", task,
                    rt->next_id);
    }
    if (task < rt->retired) {
        return fail(rt, PTO_ERR_STATE, "complete: task %d was already completed (it has retired)", task);
    }
    s = slot_at(rt, task);
    if (s->state != PTO_TASK_RUNNING) {
        if (s->state == PTO_TASK_COMPLETED) {
            return fail(rt, PTO_ERR_STATE, "complete: task %d (%s) was already completed", task,
                        func_name(rt, s->func));
        }
        if (s->state == PTO_TASK_SUBMITTED) {
            return fail(rt, PTO_ERR_STATE, "complete: task %d (%s) is not ready: %d of its %d predecessors have "
                        "not completed", task, func_name(rt, s->func), s->pending, s->fanin);
        }
        return fail(rt, PTO_ERR_STATE, "complete: task %d (%s) is %s; only tasks handed out by pto_ready_pop "
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

static int ready_pop(pto_runtime *rt, int32_t *ids, int32_t max, int32_t *n)
{
    int32_t k = 0;
    if (n == NULL || (ids == NULL && max > 0) || max < 0) {
        return fail(rt, PTO_ERR_INVALID, "pto_ready_pop: NULL pointer or negative max %d", max);
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

/* ---------------------------------------------------------------------------------------
 * names
 * ------------------------------------------------------------------------------------- */

static int check_name(pto_runtime *rt, const char *what, const char *name)
{
    size_t i;
    if (name == NULL) {
        return fail(rt, PTO_ERR_INVALID, "%s name is NULL", what);
    }
    for (i = 0; name[i] != '\0'; i++) {
        char ch = name[i];
        int alpha = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_';
        int digit = ch >= '0' && ch <= '9';
        if (!(alpha || (digit && i > 0)) || i >= MAX_NAME) {
            return fail(rt, PTO_ERR_INVALID, "%s name '%.64s' is not an identifier (letters, digits and '_', not "
                        "starting with a digit, no whitespace, at most %d characters)", what, name, MAX_NAME);
        }
    }
    if (i == 0) {
        return fail(rt, PTO_ERR_INVALID, "%s name is empty", what);
    }
    return PTO_OK;
}

static int store_name(pto_runtime *rt, const char *name, uint32_t *off)
{
    size_t n = strlen(name) + 1;
    if (rt->names_len + n > rt->names_cap) {
        size_t cap = rt->names_cap ? rt->names_cap : 256;
        char *p;
        while (cap < rt->names_len + n) {
            cap *= 2;
        }
        if (cap > UINT32_MAX) {
            return fail(rt, PTO_ERR_LIMIT, "names take more than 4 GiB");
        }
        p = mem_realloc(rt, rt->names, rt->names_cap, cap);
        if (p == NULL) {
            return oom(rt, "name table");
        }
        rt->names = p;
        rt->names_cap = cap;
    }
    memcpy(rt->names + rt->names_len, name, n);
    *off = (uint32_t)rt->names_len;
    rt->names_len += n;
    return PTO_OK;
}

static int tensor_register(pto_runtime *rt, const char *name, int64_t rows, int64_t cols, int32_t elem_size,
                           int32_t *id)
{
    pto_tensor *t;
    uint32_t off;
    int32_t i;
    int st;
    if (id == NULL) {
        return fail(rt, PTO_ERR_INVALID, "pto_tensor_register: NULL output pointer");
    }
    if ((st = check_name(rt, "tensor", name)) != PTO_OK) {
        return st;
    }
    if (rows <= 0 || cols <= 0 || rows > INT32_MAX || cols > INT32_MAX) {
        return fail(rt, PTO_ERR_INVALID, "tensor '%s': shape %" PRId64 " x %" PRId64 " must be positive and at "
                    "most %d per dimension", name, rows, cols, INT32_MAX);
    }
    if (elem_size <= 0) {
        return fail(rt, PTO_ERR_INVALID, "tensor '%s': element size %d must be positive", name, elem_size);
    }
    for (i = 0; i < rt->n_tensors; i++) {
        if (strcmp(rt->names + rt->tensors[i].name, name) == 0) {
            return fail(rt, PTO_ERR_INVALID, "tensor '%s' is already registered (id %d)", name, i);
        }
    }
    if (rt->n_tensors >= (1 << 29) - 1) {
        return fail(rt, PTO_ERR_LIMIT, "more than %d tensors", (1 << 29) - 1);
    }
    if (rt->n_tensors == rt->tensors_cap) {
        void *p = rt->tensors;
        st = grow_array(rt, &p, &rt->tensors_cap, rt->n_tensors + 1, sizeof(pto_tensor), "tensor table");
        rt->tensors = p;
        if (st != PTO_OK) {
            return st;
        }
    }
    if ((st = store_name(rt, name, &off)) != PTO_OK) {
        return st;
    }
    t = &rt->tensors[rt->n_tensors];
    memset(t, 0, sizeof *t);
    t->rows = (int32_t)rows;
    t->cols = (int32_t)cols;
    t->elem_size = elem_size;
    t->name = off;
    t->large = -1;
    t->shr = t->shc = 31;
    t->grid_rows = t->grid_cols = INT64_MAX;
    *id = rt->n_tensors++;
    return PTO_OK;
}

static int func_register(pto_runtime *rt, const char *name, int32_t *id)
{
    int32_t i;
    int st;
    if (id == NULL) {
        return fail(rt, PTO_ERR_INVALID, "pto_func_register: NULL output pointer");
    }
    if ((st = check_name(rt, "function", name)) != PTO_OK) {
        return st;
    }
    /* Registering a name again returns its id, so generated code may register per call site. */
    for (i = 0; i < rt->n_funcs; i++) {
        if (strcmp(rt->names + rt->funcs[i], name) == 0) {
            *id = i;
            return PTO_OK;
        }
    }
    if (rt->n_funcs >= (1 << 24) - 1) {
        return fail(rt, PTO_ERR_LIMIT, "more than %d functions", (1 << 24) - 1);
    }
    if (rt->n_funcs == rt->funcs_cap) {
        void *p = rt->funcs;
        st = grow_array(rt, &p, &rt->funcs_cap, rt->n_funcs + 1, sizeof(uint32_t), "function table");
        rt->funcs = p;
        if (st != PTO_OK) {
            return st;
        }
    }
    if ((st = store_name(rt, name, &rt->funcs[rt->n_funcs])) != PTO_OK) {
        return st;
    }
    *id = rt->n_funcs++;
    return PTO_OK;
}

/* ---------------------------------------------------------------------------------------
 * inspection: stats, per-task queries, export, dump
 * ------------------------------------------------------------------------------------- */

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
        return fail(rt, PTO_ERR_STATE, "%s: a count_only runtime keeps no tasks", what);
    }
    if (task < 0 || task >= rt->next_id) {
        return fail(rt, PTO_ERR_UNKNOWN_TASK, "%s: unknown task id %d (%d tasks allocated)", what, task,
                    rt->next_id);
    }
    if (task < rt->retired) {
        return fail(rt, PTO_ERR_UNKNOWN_TASK, "%s: task %d has retired from the window", what, task);
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
        return fail(rt, PTO_ERR_INVALID, "pto_task_query: NULL output pointer");
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

static int task_args(pto_runtime *rt, int32_t task, pto_arg *args, int32_t max, int32_t *n_out)
{
    uint32_t b, n, k;
    int st;
    if (n_out == NULL || (args == NULL && max > 0) || max < 0) {
        return fail(rt, PTO_ERR_INVALID, "pto_task_args: NULL pointer or negative max %d", max);
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
        return fail(rt, PTO_ERR_INVALID, "pto_export_info_get: NULL output pointer");
    }
    if (rt->cfg.count_only) {
        return fail(rt, PTO_ERR_STATE, "export: a count_only runtime keeps no tasks");
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
        return fail(rt, PTO_ERR_INVALID, "pto_export_fill: NULL arrays");
    }
    if (rt->cfg.count_only) {
        return fail(rt, PTO_ERR_STATE, "export: a count_only runtime keeps no tasks");
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
        return fail(rt, PTO_ERR_INVALID, "pto_dump: NULL path");
    }
    if (rt->cfg.count_only) {
        return fail(rt, PTO_ERR_STATE, "dump: a count_only runtime keeps no tasks");
    }
    f = fopen(path, "w");
    if (f == NULL) {
        return fail(rt, PTO_ERR_IO, "dump: cannot open '%.300s' for writing", path);
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
            int st = grow_array(rt, &q, &rt->tmp_cap, nf, sizeof(int32_t), "dump scratch");
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
        return fail(rt, PTO_ERR_IO, "dump: writing '%.300s' failed", path);
    }
    return PTO_OK;
}

static int get_stats(pto_runtime *rt, pto_stats *out)
{
    if (out == NULL) {
        return fail(rt, PTO_ERR_INVALID, "pto_get_stats: NULL output pointer");
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

/* ---------------------------------------------------------------------------------------
 * public API: argument checks and the sync hooks around the static functions above
 * ------------------------------------------------------------------------------------- */

static void rt_lock(pto_runtime *rt)
{
    if (rt->cfg.lock != NULL) {
        rt->cfg.lock(rt->cfg.sync_ctx);
    }
}

static void rt_unlock(pto_runtime *rt)
{
    if (rt->cfg.unlock != NULL) {
        rt->cfg.unlock(rt->cfg.sync_ctx);
    }
}


/* Runs `call` under the lock, refusing when an earlier allocation failure left the runtime
 * half-updated. */
#define LOCKED(rt, call)                                       \
    do {                                                       \
        int st_;                                               \
        if ((rt) == NULL) {                                    \
            return PTO_ERR_INVALID;                            \
        }                                                      \
        rt_lock(rt);                                           \
        st_ = (rt)->broken ? broken_error(rt) : (call);        \
        rt_unlock(rt);                                         \
        return st_;                                            \
    } while (0)

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
    int st = grow_array(rt, &p, &rt->ent_cap, rt->cfg.window / 2 > 16 ? rt->cfg.window / 2 : 16,
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
    chunks_init(&rt->slots, SLOT_SHIFT, sizeof(pto_slot), rt->cfg.window > 0 ? 1 : SLAB_MAX);
    chunks_init(&rt->args, ARG_SHIFT, sizeof(pto_argrec), rt->cfg.window > 0 ? 1 : SLAB_MAX);
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
        slabs_free(rt, &rt->eslabs);
    }
    mem_free(rt, rt->edir, (size_t)rt->edir_cap * sizeof *rt->edir);
    chunks_free(rt, &rt->slots);
    chunks_free(rt, &rt->args);
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
    chunks_reset(rt, &rt->slots);
    chunks_reset(rt, &rt->args);
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

int pto_tensor_register(pto_runtime *rt, const char *name, int64_t rows, int64_t cols, int32_t elem_size,
                        int32_t *id)
{
    LOCKED(rt, tensor_register(rt, name, rows, cols, elem_size, id));
}

int pto_func_register(pto_runtime *rt, const char *name, int32_t *id)
{
    LOCKED(rt, func_register(rt, name, id));
}

static int tensor_get(pto_runtime *rt, int32_t id, const char **name, int64_t *rows, int64_t *cols,
                      int32_t *elem_size)
{
    const pto_tensor *t;
    if (id < 0 || id >= rt->n_tensors) {
        return fail(rt, PTO_ERR_UNKNOWN_TENSOR, "unknown tensor id %d (%d tensors registered)", id, rt->n_tensors);
    }
    t = &rt->tensors[id];
    if (name) *name = rt->names + t->name;
    if (rows) *rows = t->rows;
    if (cols) *cols = t->cols;
    if (elem_size) *elem_size = t->elem_size;
    return PTO_OK;
}

static int func_get(pto_runtime *rt, int32_t id, const char **name)
{
    if (id < 0 || id >= rt->n_funcs) {
        return fail(rt, PTO_ERR_UNKNOWN_FUNC, "unknown function id %d (%d functions registered)", id, rt->n_funcs);
    }
    if (name) *name = rt->names + rt->funcs[id];
    return PTO_OK;
}

int pto_tensor_get(pto_runtime *rt, int32_t id, const char **name, int64_t *rows, int64_t *cols,
                   int32_t *elem_size)
{
    LOCKED(rt, tensor_get(rt, id, name, rows, cols, elem_size));
}

int pto_func_get(pto_runtime *rt, int32_t id, const char **name)
{
    LOCKED(rt, func_get(rt, id, name));
}

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
        return task_add_general(rt, task, tensor, kind, r0, c0, nr, nc);
    }
    LOCKED(rt, task_add_general(rt, task, tensor, kind, r0, c0, nr, nc));
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
        return exact_slow(rt, task);
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
        return exact_slow(rt, task);
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
        return exact_slow(rt, task);
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

static int ready_count(pto_runtime *rt, int32_t *n)
{
    if (n == NULL) {
        return fail(rt, PTO_ERR_INVALID, "pto_ready_count: NULL output pointer");
    }
    *n = (int32_t)(rt->rq_tail - rt->rq_head);
    return PTO_OK;
}

int pto_ready_count(pto_runtime *rt, int32_t *n)
{
    LOCKED(rt, ready_count(rt, n));
}

int pto_ready_pop(pto_runtime *rt, int32_t *ids, int32_t max, int32_t *n)
{
    LOCKED(rt, ready_pop(rt, ids, max, n));
}

static int complete_many(pto_runtime *rt, const int32_t *ids, int32_t n)
{
    int32_t k;
    int st = PTO_OK;
    if (n < 0 || (ids == NULL && n > 0)) {
        return fail(rt, PTO_ERR_INVALID, "pto_task_complete_many: NULL ids or negative count %d", n);
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

int pto_task_complete(pto_runtime *rt, int32_t task)
{
    LOCKED(rt, complete_many(rt, &task, 1));
}

int pto_task_complete_many(pto_runtime *rt, const int32_t *ids, int32_t n)
{
    LOCKED(rt, complete_many(rt, ids, n));
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
    LOCKED(rt, task_args(rt, task, args, max, n));
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
