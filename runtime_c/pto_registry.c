/* pto_registry.c - tensor and function names of the PTO runtime: registration and
 * lookup. Names are C identifiers kept in one string table. */

#include <inttypes.h>

#include "pto_runtime_internal.h"

static int check_name(pto_runtime *rt, const char *what, const char *name)
{
    size_t i;
    if (name == NULL) {
        return ptoi_fail(rt, PTO_ERR_INVALID, "%s name is NULL", what);
    }
    for (i = 0; name[i] != '\0'; i++) {
        char ch = name[i];
        int alpha = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_';
        int digit = ch >= '0' && ch <= '9';
        if (!(alpha || (digit && i > 0)) || i >= MAX_NAME) {
            return ptoi_fail(rt, PTO_ERR_INVALID, "%s name '%.64s' is not an identifier (letters, digits and '_', not "
                             "starting with a digit, no whitespace, at most %d characters)", what, name, MAX_NAME);
        }
    }
    if (i == 0) {
        return ptoi_fail(rt, PTO_ERR_INVALID, "%s name is empty", what);
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
            return ptoi_fail(rt, PTO_ERR_LIMIT, "names take more than 4 GiB");
        }
        p = mem_realloc(rt, rt->names, rt->names_cap, cap);
        if (p == NULL) {
            return ptoi_oom(rt, "name table");
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
        return ptoi_fail(rt, PTO_ERR_INVALID, "pto_tensor_register: NULL output pointer");
    }
    if ((st = check_name(rt, "tensor", name)) != PTO_OK) {
        return st;
    }
    if (rows <= 0 || cols <= 0 || rows > INT32_MAX || cols > INT32_MAX) {
        return ptoi_fail(rt, PTO_ERR_INVALID, "tensor '%s': shape %" PRId64 " x %" PRId64 " must be positive and at "
                         "most %d per dimension", name, rows, cols, INT32_MAX);
    }
    if (elem_size <= 0) {
        return ptoi_fail(rt, PTO_ERR_INVALID, "tensor '%s': element size %d must be positive", name, elem_size);
    }
    for (i = 0; i < rt->n_tensors; i++) {
        if (strcmp(rt->names + rt->tensors[i].name, name) == 0) {
            return ptoi_fail(rt, PTO_ERR_INVALID, "tensor '%s' is already registered (id %d)", name, i);
        }
    }
    if (rt->n_tensors >= (1 << 29) - 1) {
        return ptoi_fail(rt, PTO_ERR_LIMIT, "more than %d tensors", (1 << 29) - 1);
    }
    if (rt->n_tensors == rt->tensors_cap) {
        void *p = rt->tensors;
        st = ptoi_grow_array(rt, &p, &rt->tensors_cap, rt->n_tensors + 1, sizeof(pto_tensor), "tensor table");
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
        return ptoi_fail(rt, PTO_ERR_INVALID, "pto_func_register: NULL output pointer");
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
        return ptoi_fail(rt, PTO_ERR_LIMIT, "more than %d functions", (1 << 24) - 1);
    }
    if (rt->n_funcs == rt->funcs_cap) {
        void *p = rt->funcs;
        st = ptoi_grow_array(rt, &p, &rt->funcs_cap, rt->n_funcs + 1, sizeof(uint32_t), "function table");
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

static int tensor_get(pto_runtime *rt, int32_t id, const char **name, int64_t *rows, int64_t *cols,
                      int32_t *elem_size)
{
    const pto_tensor *t;
    if (id < 0 || id >= rt->n_tensors) {
        return ptoi_fail(rt, PTO_ERR_UNKNOWN_TENSOR, "unknown tensor id %d (%d tensors registered)", id, rt->n_tensors);
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
        return ptoi_fail(rt, PTO_ERR_UNKNOWN_FUNC, "unknown function id %d (%d functions registered)", id, rt->n_funcs);
    }
    if (name) *name = rt->names + rt->funcs[id];
    return PTO_OK;
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

int pto_tensor_get(pto_runtime *rt, int32_t id, const char **name, int64_t *rows, int64_t *cols,
                   int32_t *elem_size)
{
    LOCKED(rt, tensor_get(rt, id, name, rows, cols, elem_size));
}

int pto_func_get(pto_runtime *rt, int32_t id, const char **name)
{
    LOCKED(rt, func_get(rt, id, name));
}
