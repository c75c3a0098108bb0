/* pto_standalone.h - run a generated program's task graph on data from a file, with no Python:
 * what `graph SEQ --run IN.safetensors --out OUT.safetensors` (main.c, `pto codegen`) does.
 *
 * Header-only (static), C99 plus the native pool (pto_native.c, pthreads). The program is a
 * table (pto_program): its orchestration's entry points, its kernels' (pto_NAME_kernel), and its
 * tensors' names, roles and dtypes. The inputs (and inouts) are read by name from a safetensors
 * file (`pto run --save-inputs FILE` writes one), the other tensors start at zero; the pool's
 * workers run the kernels while this thread builds the graph (then works too), and the outputs
 * (and inouts) are written to a safetensors file. Every failure is one line on stderr and a
 * non-zero status.
 */
#ifndef PTO_STANDALONE_H
#define PTO_STANDALONE_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "pto_runtime.h"
#include "pto_safetensors.h"

enum { PTO_ROLE_INPUT, PTO_ROLE_OUTPUT, PTO_ROLE_INOUT, PTO_ROLE_TEMP };

typedef struct {
    int (*info)(int32_t *n_scalars, int32_t *n_tensors, int32_t *n_funcs);
    int (*setup)(pto_runtime *rt, const int64_t *scalars, int32_t *tensor_ids, int32_t *func_ids);
    int (*build)(pto_runtime *rt, const int64_t *scalars, const int32_t *tensor_ids, const int32_t *func_ids,
                 int32_t *failed_call);
    const char *(*call_site)(int32_t k);
    const pto_kernel_info *(*kernel)(int32_t k);
    const char *const *names; /* the tensors, in the orchestration's order */
    const int *roles;         /* PTO_ROLE_* */
    const int *dtypes;        /* pto_safetensors.h's: 0 f32, 1 f16, 2 bf16 */
} pto_program;

typedef struct {
    int32_t *tids, *fids;
    void **data;
    int64_t *rows, *cols;
    int n_tensors;
} pto_run_state;

static void pto_run_free(pto_run_state *s)
{
    int k;
    for (k = 0; s->data != NULL && k < s->n_tensors; k++) {
        free(s->data[k]);
    }
    free(s->tids);
    free(s->fids);
    free(s->data);
    free(s->rows);
    free(s->cols);
}

/* the tensors: allocated, the inputs read from `in`, bound to the pool */
static int pto_run_tensors(const pto_program *p, pto_runtime *rt, pto_native *nt, pto_run_state *s,
                           const pto_st_file *in, char *err, size_t n)
{
    int k;
    for (k = 0; k < s->n_tensors; k++) {
        const char *name;
        int32_t es;
        int st = pto_tensor_get(rt, s->tids[k], &name, &s->rows[k], &s->cols[k], &es);
        if (st != PTO_OK) {
            return st;
        }
        s->data[k] = calloc((size_t)(s->rows[k] * s->cols[k]), (size_t)es);
        if (s->data[k] == NULL) {
            snprintf(err, n, "no memory for tensor `%s` (%lld x %lld)", p->names[k], (long long)s->rows[k],
                     (long long)s->cols[k]);
            return PTO_ERR_NO_MEMORY;
        }
        if ((p->roles[k] == PTO_ROLE_INPUT || p->roles[k] == PTO_ROLE_INOUT)
            && pto_st_get(in, p->names[k], p->dtypes[k], s->rows[k], s->cols[k], s->data[k], err, n) != 0) {
            return PTO_ERR_INVALID;
        }
        if ((st = pto_native_bind_tensor(nt, s->tids[k], s->data[k], s->cols[k])) != PTO_OK) {
            return st;
        }
    }
    return PTO_OK;
}

/* the outputs and inouts, by name, into `path` */
static int pto_run_save(const pto_program *p, const pto_run_state *s, const char *path, char *err, size_t n)
{
    const char **names = malloc(sizeof *names * (size_t)s->n_tensors);
    int *dtypes = malloc(sizeof *dtypes * (size_t)s->n_tensors);
    int64_t *rows = malloc(sizeof *rows * (size_t)s->n_tensors), *cols = malloc(sizeof *cols * (size_t)s->n_tensors);
    void **data = malloc(sizeof *data * (size_t)s->n_tensors);
    int k, m = 0, st = -1;
    if (names != NULL && dtypes != NULL && rows != NULL && cols != NULL && data != NULL) {
        for (k = 0; k < s->n_tensors; k++) {
            if (p->roles[k] == PTO_ROLE_OUTPUT || p->roles[k] == PTO_ROLE_INOUT) {
                names[m] = p->names[k];
                dtypes[m] = p->dtypes[k];
                rows[m] = s->rows[k];
                cols[m] = s->cols[k];
                data[m++] = s->data[k];
            }
        }
        st = pto_st_write(path, m, names, dtypes, rows, cols, data, err, n);
    }
    free(names);
    free(dtypes);
    free(rows);
    free(cols);
    free(data);
    return st;
}

/* Build and run the graph for `scalars` on `threads` threads through a window of `window`
 * slots; 0 when it ran (and `out`, if given, was written), else 1 with a line on stderr. */
/* Before any work: --out may not be the --run file (the outputs would overwrite the inputs), and
 * its folder must take the file (a file that was not there is removed again). 0, or 2 with the
 * line printed. */
static int pto_check_out(const char *in_path, const char *out_path)
{
    struct stat si, so;
    FILE *f;
    int existed;
    if (out_path == NULL) return 0;
    existed = stat(out_path, &so) == 0;
    if (existed && stat(in_path, &si) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino) {
        fprintf(stderr, "graph: --out %s is the --run file %s: the outputs would overwrite the inputs\n", out_path,
                in_path);
        return 2;
    }
    if (existed && S_ISDIR(so.st_mode)) {
        fprintf(stderr, "graph: --out %s is a folder, not a file\n", out_path);
        return 2;
    }
    f = fopen(out_path, "ab");
    if (f == NULL) {
        fprintf(stderr, "graph: cannot write --out %s (%s)\n", out_path, strerror(errno));
        return 2;
    }
    fclose(f);
    if (!existed) remove(out_path);
    return 0;
}

static int pto_run_graph(const pto_program *p, const int64_t *scalars, const char *in_path, const char *out_path,
                         int threads, int window)
{
    pto_config cfg;
    pto_native *nt = NULL;
    pto_runtime *rt = NULL;
    pto_st_file in;
    pto_run_state s;
    int32_t n_scalars, n_funcs, failed = -1, k;
    char err[512] = "";
    struct timespec t0, t1;
    int st, work;
    memset(&s, 0, sizeof s);
    if (pto_check_out(in_path, out_path) != 0) return 2;
    p->info(&n_scalars, &s.n_tensors, &n_funcs);
    if (pto_st_open(&in, in_path, err, sizeof err) != 0) {
        fprintf(stderr, "graph: %s\n", err);
        pto_st_close(&in);
        return 1;
    }
    s.tids = malloc(sizeof *s.tids * (size_t)(s.n_tensors + 1));
    s.fids = malloc(sizeof *s.fids * (size_t)(n_funcs + 1));
    s.data = calloc((size_t)(s.n_tensors + 1), sizeof *s.data);
    s.rows = malloc(sizeof *s.rows * (size_t)(s.n_tensors + 1));
    s.cols = malloc(sizeof *s.cols * (size_t)(s.n_tensors + 1));
    pto_config_init(&cfg);
    cfg.window = window;
    st = s.tids && s.fids && s.data && s.rows && s.cols ? pto_native_create(&cfg, threads, &nt) : PTO_ERR_NO_MEMORY;
    if (st == PTO_OK) st = pto_runtime_create(&cfg, &rt);
    if (st == PTO_OK) st = pto_native_attach(nt, rt);
    if (st == PTO_OK) st = p->setup(rt, scalars, s.tids, s.fids);
    if (st == PTO_OK) st = pto_run_tensors(p, rt, nt, &s, &in, err, sizeof err);
    for (k = 0; st == PTO_OK && k < n_funcs; k++) {
        st = pto_native_bind_kernel(nt, s.fids[k], p->kernel(k));
    }
    if (st == PTO_OK) st = pto_native_start(nt);
    if (st == PTO_OK) {
        clock_gettime(CLOCK_MONOTONIC, &t0);
        st = p->build(rt, scalars, s.tids, s.fids, &failed);
        if (st != PTO_OK) { /* the tasks submitted so far drain */
            snprintf(err, sizeof err, "%s%s%s", failed >= 0 ? p->call_site(failed) : "", failed >= 0 ? ": " : "",
                     pto_last_error(rt));
            pto_native_cancel(nt);
        }
        work = pto_native_work(nt);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (st == PTO_OK && work != PTO_OK) {
            int64_t done;
            int32_t task, func, status;
            pto_native_progress(nt, &done, &task, &func, &status);
            snprintf(err, sizeof err, "task %d (function %d) failed: %s", task, func, pto_status_name(work));
            st = work;
        }
        if (st == PTO_OK) {
            pto_stats stats;
            pto_get_stats(rt, &stats);
            printf("tasks %lld ms %.3f threads %d\n", (long long)stats.tasks_submitted,
                   (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6, threads);
            if (out_path != NULL && pto_run_save(p, &s, out_path, err, sizeof err) != 0) {
                st = PTO_ERR_IO;
            }
        }
    }
    if (st != PTO_OK) {
        fprintf(stderr, "graph: %s\n", err[0] ? err : rt != NULL ? pto_last_error(rt) : pto_status_name(st));
    }
    if (rt != NULL) {
        pto_runtime_destroy(rt);
    }
    if (nt != NULL) {
        pto_native_destroy(nt);
    }
    pto_run_free(&s);
    pto_st_close(&in);
    return st == PTO_OK ? 0 : 1;
}

#endif /* PTO_STANDALONE_H */
