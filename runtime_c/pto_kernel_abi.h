/* pto_kernel_abi.h - the calling convention of InCore functions compiled to C.
 *
 * Read verbatim by cffi's cdef, before pto_runtime_api.h (declarations only: no #include, no
 * #ifdef, no macros). Generated InCore C (pto/codegen/c_incore.py) defines one pto_kernel per
 * function variant; the native pool (pto_native.c) calls them for the tasks it runs, and a
 * kernel module alone (no runtime) runs them for a batch of tasks.
 */

/* One memref argument of a task as a compiled InCore function sees it: `origin` is element
 * (row0, col0) of its tensor, whose rows are `ld` elements apart; loads and stores stay inside
 * the region's valid extent rows x cols. */
typedef struct {
    char *origin;
    int64_t ld;
    int64_t rows, cols;
    int64_t row0, col0;          /* where the region starts in its tensor */
    int64_t trows, tcols;        /* the tensor's shape */
} pto_region;

/* A compiled InCore function (one variant): the task's memref arguments and scalars in
 * parameter order, and `scratch`, 64-byte aligned room for its tiles. 0, or a status. */
typedef int (*pto_kernel)(const pto_region *mems, const int64_t *scalars, float *scratch);

typedef struct {
    pto_kernel fn;
    int32_t n_mems, n_scalars;
    int64_t scratch_floats;      /* the tiles' room */
    const char *name;            /* the variant's name */
} pto_kernel_info;
