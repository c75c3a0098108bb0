/* pto_mem.c - errors, memory accounting and the chunked FIFO storage of the PTO runtime.
 *
 * Every byte the runtime mallocs is counted here (pto_stats.bytes); task slots and argument
 * records live in chunks found through a ring directory, handed out in slabs without a
 * window (docs/RUNTIME.md, "Tasks and arguments").
 */

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include "pto_runtime_internal.h"

/* ---------------------------------------------------------------------------------------
 * errors
 * ------------------------------------------------------------------------------------- */

PTO_COLD int ptoi_fail(pto_runtime *rt, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rt->err, sizeof rt->err, fmt, ap);
    va_end(ap);
    return status;
}

/* Mark the runtime unusable: no open task, and empty bump windows, so every fast path
 * refuses and the checks of the slow paths report it. */
void ptoi_set_broken(pto_runtime *rt, int status)
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

PTO_COLD int ptoi_oom(pto_runtime *rt, const char *what)
{
    ptoi_set_broken(rt, PTO_ERR_NO_MEMORY);
    return ptoi_fail(rt, PTO_ERR_NO_MEMORY, "out of memory growing the %s (runtime holds %" PRId64
                     " bytes); the runtime is unusable now, destroy it", what, rt->bytes);
}

PTO_COLD int ptoi_broken_error(pto_runtime *rt)
{
    return ptoi_fail(rt, PTO_ERR_NO_MEMORY, "the runtime is unusable after an earlier out-of-memory or limit error; "
                     "destroy it");
}

/* Grow a plain array to hold at least `need` elements (geometric, so appends stay O(1)). */
PTO_COLD int ptoi_grow_array(pto_runtime *rt, void **arr, int32_t *cap, int32_t need, size_t elem,
                             const char *what)
{
    int64_t n = *cap > 0 ? *cap : 16;
    void *p;
    while (n < need) {
        n *= 2;
    }
    if (n > INT32_MAX) {
        return ptoi_fail(rt, PTO_ERR_LIMIT, "the %s would exceed %d elements", what, INT32_MAX);
    }
    p = mem_realloc(rt, *arr, (size_t)*cap * elem, (size_t)n * elem);
    if (p == NULL) {
        return ptoi_oom(rt, what);
    }
    *arr = p;
    *cap = (int32_t)n;
    return PTO_OK;
}

/* ---------------------------------------------------------------------------------------
 * chunked FIFO storage
 * ------------------------------------------------------------------------------------- */

/* A new slab of n chunks of chunk_bytes each, recorded in sl; NULL when out of memory. */
char *ptoi_slab_new(pto_runtime *rt, pto_slabs *sl, size_t chunk_bytes, uint32_t n)
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

void ptoi_slabs_free(pto_runtime *rt, pto_slabs *sl)
{
    uint32_t k;
    for (k = 0; k < sl->n; k++) {
        mem_free(rt, sl->ptr[k], sl->bytes[k]);
    }
    mem_free(rt, sl->ptr, sl->cap * sizeof *sl->ptr);
    mem_free(rt, sl->bytes, sl->cap * sizeof *sl->bytes);
}

void ptoi_chunks_init(pto_chunks *c, uint32_t shift, size_t elem, uint32_t slab_max)
{
    memset(c, 0, sizeof *c);
    c->shift = shift;
    c->slab_max = slab_max;
    c->chunk_bytes = ((size_t)1 << shift) * elem;
}

/* Add storage for the next chunk of sequence numbers [end, end + chunk). */
PTO_COLD int ptoi_chunks_push(pto_runtime *rt, pto_chunks *c, const char *what)
{
    void *p;
    if (c->hi - c->lo == c->cap) {
        uint32_t ncap = c->cap ? c->cap * 2 : 8;
        uint32_t k;
        void **nd;
        if (ncap > (1u << (32 - c->shift))) {
            return ptoi_fail(rt, PTO_ERR_LIMIT, "the %s would exceed 2^32 live records", what);
        }
        nd = mem_alloc(rt, ncap * sizeof *nd);
        if (nd == NULL) {
            return ptoi_oom(rt, what);
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
         * array is sized for every chunk, so ptoi_chunks_reset can always keep them all. */
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
                return ptoi_oom(rt, what);
            }
            c->spare = ns;
            c->spare_cap = ncap;
        }
        if ((slab = ptoi_slab_new(rt, &c->slabs, c->chunk_bytes, n)) == NULL) {
            return ptoi_oom(rt, what);
        }
        for (k = n - 1; k >= 1; k--) {
            c->spare[c->nspare++] = slab + (size_t)k * c->chunk_bytes;
        }
        c->total += n;
        p = slab;
    } else if ((p = mem_alloc(rt, c->chunk_bytes)) == NULL) {
        return ptoi_oom(rt, what);
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
void ptoi_chunks_pop(pto_runtime *rt, pto_chunks *c)
{
    void *p = c->dir[c->lo & (c->cap - 1)];
    c->lo++;
    c->start += 1u << c->shift;
    chunks_keep(rt, c, p, MAX_SPARE);
}

/* Forget every record but keep the memory for the next graph (pto_runtime_reset). The
 * spares are taken from the top, so pushing the chunks newest first hands them out again in
 * the order the last graph used them (consecutive slab chunks stay consecutive). */
void ptoi_chunks_reset(pto_runtime *rt, pto_chunks *c)
{
    uint32_t k;
    for (k = c->hi; k != c->lo; k--) {
        chunks_keep(rt, c, c->dir[(k - 1) & (c->cap - 1)], UINT32_MAX);
    }
    c->lo = c->hi = 0;
    c->start = c->end = 0;
}

void ptoi_chunks_free(pto_runtime *rt, pto_chunks *c)
{
    uint32_t k;
    if (c->slab_max > 1) {
        ptoi_slabs_free(rt, &c->slabs);
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
