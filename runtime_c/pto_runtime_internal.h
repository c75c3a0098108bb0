/* pto_runtime_internal.h - private header shared by the runtime's C files (never installed
 * for callers: they include pto_runtime.h).
 *
 * The PTO task-graph runtime tracks region-overlap dependencies over 2-D tensors, hands out
 * ready tasks, and retires tasks through a window so long graphs run in bounded memory.
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
 *    path inside the public pto_task_add_* functions (see task_add in pto_task.c).
 *
 * The files, one part each:
 *
 *   pto_mem.c       errors, memory accounting, chunked FIFO storage and slabs
 *   pto_map.c       the tensor map: entries, grids, region resolution, edge recording, sweep
 *   pto_task.c      task life cycle: alloc, add, submit (the hot path), ready queue, complete
 *   pto_registry.c  tensor and function names
 *   pto_inspect.c   stats, task queries, bulk export, dump
 *   pto_runtime.c   create, destroy, reset, status names
 *   pto_native.c    the native pool: worker threads that run the tasks' compiled kernels
 *                   (pthreads, as pto_sync_posix.c; its hooks are the runtime's sync hooks)
 *
 * This header holds the data structures, the small helpers every part inlines (slot and
 * record lookup, edge linking: the hot path of pto_task.c must see them to stay free of
 * calls), and the functions one part calls in another, named ptoi_* and hidden from the
 * shared library's symbol table.
 */
#ifndef PTO_RUNTIME_INTERNAL_H
#define PTO_RUNTIME_INTERNAL_H

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
 * point (the argument kind then folds away); functions shared between the files are hidden
 * (direct calls inside a shared library, no PLT); plain functions on other compilers. */
#if defined(__GNUC__)
#define PTO_COLD __attribute__((noinline, cold))
#define PTO_NOINLINE __attribute__((noinline))
#define PTO_INLINE __attribute__((always_inline)) inline
#define PTO_INTERNAL __attribute__((visibility("hidden")))
#define PTO_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define PTO_COLD
#define PTO_NOINLINE
#define PTO_INLINE inline
#define PTO_INTERNAL
#define PTO_PRINTF(f, a)
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

/* A region argument as a half-open rectangle. */
typedef struct {
    int32_t r0, c0, r1, c1;
} pto_rect;

/* ---------------------------------------------------------------------------------------
 * functions shared between the files
 * ------------------------------------------------------------------------------------- */

/* pto_mem.c: errors, memory, chunked storage */
PTO_INTERNAL PTO_COLD PTO_PRINTF(3, 4) int ptoi_fail(pto_runtime *rt, int status, const char *fmt, ...);
PTO_INTERNAL void ptoi_set_broken(pto_runtime *rt, int status);
PTO_INTERNAL PTO_COLD int ptoi_oom(pto_runtime *rt, const char *what);
PTO_INTERNAL PTO_COLD int ptoi_broken_error(pto_runtime *rt);
PTO_INTERNAL PTO_COLD int ptoi_grow_array(pto_runtime *rt, void **arr, int32_t *cap, int32_t need, size_t elem,
                                          const char *what);
PTO_INTERNAL char *ptoi_slab_new(pto_runtime *rt, pto_slabs *sl, size_t chunk_bytes, uint32_t n);
PTO_INTERNAL void ptoi_slabs_free(pto_runtime *rt, pto_slabs *sl);
PTO_INTERNAL void ptoi_chunks_init(pto_chunks *c, uint32_t shift, size_t elem, uint32_t slab_max);
PTO_INTERNAL PTO_COLD int ptoi_chunks_push(pto_runtime *rt, pto_chunks *c, const char *what);
PTO_INTERNAL void ptoi_chunks_pop(pto_runtime *rt, pto_chunks *c);
PTO_INTERNAL void ptoi_chunks_reset(pto_runtime *rt, pto_chunks *c);
PTO_INTERNAL void ptoi_chunks_free(pto_runtime *rt, pto_chunks *c);

/* pto_task.c: the task life cycle (pop and complete unlocked: the native pool calls them with
 * its lock, the sync hooks' mutex, held) */
PTO_INTERNAL PTO_COLD int ptoi_add_error(pto_runtime *rt, int32_t task, int32_t tensor, int kind, int64_t r0,
                                         int64_t c0, int64_t nr, int64_t nc);
PTO_INTERNAL int ptoi_ready_pop(pto_runtime *rt, int32_t *ids, int32_t max, int32_t *n);
PTO_INTERNAL int ptoi_complete_many(pto_runtime *rt, const int32_t *ids, int32_t n);

/* pto_inspect.c: a task's arguments (unlocked) */
PTO_INTERNAL int ptoi_task_args(pto_runtime *rt, int32_t task, pto_arg *args, int32_t max, int32_t *n_out);

/* pto_map.c: the tensor map */
PTO_INTERNAL PTO_COLD int ptoi_index_prepare(pto_runtime *rt, pto_tensor *t, int32_t nr, int32_t nc);
PTO_INTERNAL PTO_NOINLINE int ptoi_add_general(pto_runtime *rt, int32_t task, int32_t tensor, int kind, int64_t r0,
                                               int64_t c0, int64_t nr, int64_t nc);
PTO_INTERNAL PTO_NOINLINE int ptoi_exact_slow(pto_runtime *rt, int32_t task);
PTO_INTERNAL void ptoi_map_gc(pto_runtime *rt);

/* ---------------------------------------------------------------------------------------
 * helpers every file inlines
 * ------------------------------------------------------------------------------------- */

static inline void *mem_alloc(pto_runtime *rt, size_t n)
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

static inline void *mem_realloc(pto_runtime *rt, void *p, size_t old_n, size_t n)
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

static inline void mem_free(pto_runtime *rt, void *p, size_t n)
{
    if (p != NULL) {
        free(p);
        rt->bytes -= (int64_t)n;
    }
}

/* Slab size for a pool of `total` chunks so far: about 1/SLAB_DIV of it, 1..SLAB_MAX. */
static inline uint32_t slab_chunks(uint32_t total)
{
    uint32_t n = total / SLAB_DIV;
    return n < 1 ? 1 : n > SLAB_MAX ? SLAB_MAX : n;
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

/* e is alone in its list and `whole` (next == -1, whole == 1): one 64-bit compare. */
static PTO_INLINE int alone_whole(const pto_entry *e)
{
    static const int32_t want[2] = {-1, 1};
    uint64_t have, need;
    memcpy(&have, (const unsigned char *)e + offsetof(pto_entry, next), sizeof have);
    memcpy(&need, want, sizeof need);
    return have == need;
}

/* edge_add's fast branch (pto_map.c), the caller having checked the bump window has room. */
static PTO_INLINE void edge_add_room(pto_runtime *rt, pto_slot *ps, int32_t task, pto_slot *ts)
{
    size_t i = rt->ebump;
    rt->ebump = i + 1u;
    edge_link(edge_window_at(rt, i), (int32_t)i, ps, task, ts);
}

/* Room for the next argument record of the open task in the FIFO pool (arg_done commits
 * it once the argument was applied). */
static inline int next_arg(pto_runtime *rt, pto_argrec **out)
{
    int st;
    if (rt->arg_next == rt->arg_end) {
        uint32_t head = (uint32_t)rt->arg_count;
        if (head == rt->args.end && (st = ptoi_chunks_push(rt, &rt->args, "argument records")) != PTO_OK) {
            return st;
        }
        if ((uint32_t)(head - rt->arg_tail) >= (uint32_t)INT32_MAX - ARG_CHUNK) {
            return ptoi_fail(rt, PTO_ERR_LIMIT, "more than %d live argument records", INT32_MAX - (int32_t)ARG_CHUNK);
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

static inline void rt_lock(pto_runtime *rt)
{
    if (rt->cfg.lock != NULL) {
        rt->cfg.lock(rt->cfg.sync_ctx);
    }
}

static inline void rt_unlock(pto_runtime *rt)
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
        st_ = (rt)->broken ? ptoi_broken_error(rt) : (call);   \
        rt_unlock(rt);                                         \
        return st_;                                            \
    } while (0)

#endif /* PTO_RUNTIME_INTERNAL_H */
