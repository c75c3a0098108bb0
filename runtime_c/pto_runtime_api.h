/* pto_runtime_api.h - declarations of the PTO task-graph runtime's public C API.
 *
 * This file is read verbatim by cffi's cdef (runtime_c/build_runtime.py), so it holds
 * declarations only: no #include, no #ifdef, no macros. C code includes pto_runtime.h,
 * which includes <stdint.h>/<stddef.h> first and then this file. docs/RUNTIME.md describes
 * the semantics behind every declaration here.
 *
 * The types of compiled InCore functions (pto_region, pto_kernel, pto_kernel_info) are in
 * pto_kernel_abi.h, which comes first (pto_runtime.h includes both; the cdef reads both).
 *
 * Conventions: every function returns an int status (PTO_OK = 0, errors negative) and
 * passes results through pointers; pto_last_error() explains the latest failure with the
 * offending names, ids and limits. Nothing aborts, exits or prints.
 */

/* Status codes returned by every function (pto_last_error() says more). */
typedef enum {
    PTO_OK = 0,
    PTO_ERR_INVALID = -1,        /* bad argument: NULL pointer, bad name, bad config, bad size */
    PTO_ERR_NO_MEMORY = -2,      /* malloc failed; the runtime is unusable afterwards (destroy it) */
    PTO_ERR_WINDOW_FULL = -3,    /* every task slot of the window is live and no sync hooks to wait */
    PTO_ERR_UNKNOWN_TENSOR = -4, /* tensor id never registered */
    PTO_ERR_UNKNOWN_FUNC = -5,   /* function id never registered */
    PTO_ERR_UNKNOWN_TASK = -6,   /* task id never allocated, or already retired from the window */
    PTO_ERR_REGION = -7,         /* region outside its tensor, or a zero/negative extent */
    PTO_ERR_STATE = -8,          /* call not allowed in the task's/runtime's state (add after submit...) */
    PTO_ERR_IO = -9,             /* the dump file could not be written */
    PTO_ERR_LIMIT = -10          /* an id space or size limit of the runtime was exceeded */
} pto_status;

/* Kind (direction) of one task argument. */
typedef enum {
    PTO_ARG_IN = 0,
    PTO_ARG_OUT = 1,
    PTO_ARG_INOUT = 2,
    PTO_ARG_SCALAR = 3
} pto_arg_kind;

/* Life cycle of a task: OPEN (allocated, args being added) -> SUBMITTED (waits for
 * predecessors) -> READY (in the ready queue) -> RUNNING (handed out by pto_ready_pop)
 * -> COMPLETED -> RETIRED (slot reclaimed; only with a window). */
typedef enum {
    PTO_TASK_OPEN = 1,
    PTO_TASK_SUBMITTED = 2,
    PTO_TASK_READY = 3,
    PTO_TASK_RUNNING = 4,
    PTO_TASK_COMPLETED = 5,
    PTO_TASK_RETIRED = 6
} pto_task_state;

typedef struct pto_runtime pto_runtime;

/* Caller-owned configuration; fill with pto_config_init() first. */
typedef struct {
    int32_t window;      /* task slots in the ring; 0 = unbounded (whole graph kept) */
    int32_t count_only;  /* non-zero: only count tasks and regions (no graph, O(1) memory) */
    /* Sync hooks, all NULL for single-threaded use. lock/unlock guard every public call;
     * wait (called with the lock held, returns with it held) blocks pto_task_alloc while the
     * window is full; notify_all wakes waiters after completions. pto_sync_posix_init
     * installs a pthread implementation. */
    void *sync_ctx;
    void (*lock)(void *ctx);
    void (*unlock)(void *ctx);
    void (*wait)(void *ctx);
    void (*notify_all)(void *ctx);
} pto_config;

/* Counters; memory counts every byte the runtime itself malloc'd. */
typedef struct {
    int64_t tasks_submitted;
    int64_t tasks_completed;
    int64_t tasks_retired;
    int64_t tasks_live;          /* allocated and not yet retired */
    int64_t regions;             /* region arguments (in/out/inout) of submitted tasks */
    int64_t scalars;             /* scalar arguments of submitted tasks */
    int64_t edges;               /* dependency edges recorded (0 in count_only mode) */
    int64_t edges_live;          /* edges still stored (edges of retired tasks are freed) */
    int64_t map_entries;         /* tensor-map rectangles now */
    int64_t map_entries_peak;
    int64_t bytes;               /* bytes malloc'd now */
    int64_t bytes_peak;
    double bytes_per_task;       /* bytes_peak / tasks_submitted (0 with no tasks) */
    int64_t ready;               /* tasks in the ready queue now */
    int32_t window;              /* configured window (0 = unbounded) */
    int32_t count_only;
} pto_stats;

/* One task argument as handed out by pto_task_args (scalars: tensor = -1, region 0). */
typedef struct {
    int32_t kind;                /* pto_arg_kind */
    int32_t tensor;
    int64_t row0, col0, rows, cols;
    int64_t scalar;
} pto_arg;

/* One live task as seen by pto_task_query. */
typedef struct {
    int32_t func;
    int32_t buffer_bytes;
    int32_t state;               /* pto_task_state */
    int32_t fanin;               /* predecessors recorded */
    int32_t pending;             /* predecessors not completed yet */
    int32_t n_args;
    int32_t n_fanout;
} pto_task_view;

/* Sizes of a bulk export: the live submitted tasks first_task .. first_task + n_tasks - 1. */
typedef struct {
    int32_t first_task;
    int32_t n_tasks;
    int64_t n_args;
    int64_t n_edges;
    int32_t n_tensors;
    int32_t n_funcs;
} pto_export_info;

/* Caller-allocated arrays that pto_export_fill writes, sized from pto_export_info; any
 * pointer may be NULL to skip that array. Task i is task id first_task + i. Args of task i
 * are records arg_ptr[i] .. arg_ptr[i+1]-1 in call order; successors of task i are
 * fanout_ids[fanout_ptr[i] .. fanout_ptr[i+1]-1], ascending (CSR). */
typedef struct {
    int32_t *task_func;          /* [n_tasks] */
    int32_t *task_buffer_bytes;  /* [n_tasks] */
    int32_t *task_fanin;         /* [n_tasks] predecessors recorded */
    int8_t *task_state;          /* [n_tasks] pto_task_state */
    int64_t *arg_ptr;            /* [n_tasks + 1] */
    int8_t *arg_kind;            /* [n_args] pto_arg_kind */
    int32_t *arg_tensor;         /* [n_args], -1 for scalars */
    int64_t *arg_region;         /* [n_args * 4]: row0, col0, rows, cols (0 for scalars) */
    int64_t *arg_scalar;         /* [n_args], the value for scalars, 0 otherwise */
    int64_t *fanout_ptr;         /* [n_tasks + 1] */
    int32_t *fanout_ids;         /* [n_edges] */
} pto_export_arrays;

/* --- lifetime --------------------------------------------------------------------------- */
int pto_config_init(pto_config *cfg);
int pto_runtime_create(const pto_config *cfg, pto_runtime **out);
int pto_runtime_destroy(pto_runtime *rt);
int pto_runtime_reset(pto_runtime *rt);  /* forget the graph and names, keep the memory */
const char *pto_last_error(const pto_runtime *rt);
const char *pto_status_name(int status);

/* --- names ------------------------------------------------------------------------------ */
int pto_tensor_register(pto_runtime *rt, const char *name, int64_t rows, int64_t cols,
                        int32_t elem_size, int32_t *id);
int pto_func_register(pto_runtime *rt, const char *name, int32_t *id);
int pto_tensor_get(pto_runtime *rt, int32_t id, const char **name, int64_t *rows, int64_t *cols,
                   int32_t *elem_size);
int pto_func_get(pto_runtime *rt, int32_t id, const char **name);

/* --- building the graph ----------------------------------------------------------------- */
int pto_task_alloc(pto_runtime *rt, int32_t func_id, int32_t buffer_bytes, int32_t *task);
int pto_task_add_input(pto_runtime *rt, int32_t task, int32_t tensor, int64_t row_off,
                       int64_t col_off, int64_t rows, int64_t cols);
int pto_task_add_output(pto_runtime *rt, int32_t task, int32_t tensor, int64_t row_off,
                        int64_t col_off, int64_t rows, int64_t cols);
int pto_task_add_inout(pto_runtime *rt, int32_t task, int32_t tensor, int64_t row_off,
                       int64_t col_off, int64_t rows, int64_t cols);
int pto_task_add_scalar(pto_runtime *rt, int32_t task, int64_t value);
int pto_task_submit(pto_runtime *rt, int32_t task);

/* --- executing it ----------------------------------------------------------------------- */
int pto_ready_count(pto_runtime *rt, int32_t *n);
int pto_ready_pop(pto_runtime *rt, int32_t *ids, int32_t max, int32_t *n);
int pto_task_complete(pto_runtime *rt, int32_t task);
int pto_task_complete_many(pto_runtime *rt, const int32_t *ids, int32_t n);

/* --- inspecting it ---------------------------------------------------------------------- */
int pto_get_stats(pto_runtime *rt, pto_stats *out);
int pto_task_query(pto_runtime *rt, int32_t task, pto_task_view *out);
int pto_task_args(pto_runtime *rt, int32_t task, pto_arg *args, int32_t max, int32_t *n);
int pto_export_info_get(pto_runtime *rt, pto_export_info *out);
int pto_export_fill(pto_runtime *rt, const pto_export_arrays *arrays);
int pto_dump(pto_runtime *rt, const char *path);

/* --- native execution (pto_native.c): InCore functions compiled to C, run by worker threads --- */

typedef struct pto_native pto_native;

/* Create a pool of `threads` workers (the thread that calls pto_native_work is one of them)
 * and install its sync hooks into `cfg` (before pto_runtime_create; the pool owns them). */
int pto_native_create(pto_config *cfg, int32_t threads, pto_native **out);
/* The runtime the workers execute (created from that cfg). */
int pto_native_attach(pto_native *nt, pto_runtime *rt);
/* Tensor `tensor` of the runtime lives at `data`, rows `ld` elements apart. */
int pto_native_bind_tensor(pto_native *nt, int32_t tensor, void *data, int64_t ld);
/* Tensor `tensor` is rows of packed blocks (a block-quantized one) at `data`, `row_bytes` bytes
 * apart: a task's region's origin is its first row's first byte (the kernel finds its columns). */
int pto_native_bind_rows(pto_native *nt, int32_t tensor, void *data, int64_t row_bytes);
/* Tasks of function `func` run `info`'s kernel. */
int pto_native_bind_kernel(pto_native *nt, int32_t func, const pto_kernel_info *info);
/* Start the workers: they run ready tasks while the caller submits (pto_*_build). */
int pto_native_start(pto_native *nt);
/* Building is done: the caller works too until every submitted task has completed, then the
 * workers park. The status of the first failure (a kernel's, the runtime's), or PTO_OK. */
int pto_native_work(pto_native *nt);
/* After a run (pto_native_work returned, its runtime destroyed): install the pool's hooks into a
 * fresh `cfg` for the next runtime, whose tensors and kernels are bound again; the workers and
 * their scratch are kept. PTO_ERR_STATE while a run is under way. */
int pto_native_reuse(pto_native *nt, pto_config *cfg);
/* Record every task that runs (before pto_native_start): `capacity` records of five int64 (task,
 * function, thread: 0 the caller of pto_native_work, 1.. the workers, start and end in ns of a
 * monotonic clock); 0 turns recording off. The tasks past `capacity` are not recorded. */
int pto_native_record(pto_native *nt, int64_t capacity);
/* The records so far, in the order the tasks ended: up to `max` into `out`; *n all of them. */
int pto_native_records(pto_native *nt, int64_t *out, int64_t max, int64_t *n);
/* From any thread: tasks not yet started complete without running (a build still under way
 * goes on to its end through the window), and pto_native_work returns PTO_ERR_STATE. */
int pto_native_cancel(pto_native *nt);
/* Tasks completed so far, and the first failure: its task, function and status (-1, -1, 0). */
int pto_native_progress(pto_native *nt, int64_t *completed, int32_t *task, int32_t *func, int32_t *status);
/* After pto_native_work and pto_runtime_destroy (the runtime calls the pool's hooks): the
 * workers stop. */
int pto_native_destroy(pto_native *nt);

/* --- optional platform adapter (pto_sync_posix.c): pthread mutex + condition variable --- */
int pto_sync_posix_init(pto_config *cfg);
int pto_sync_posix_free(pto_config *cfg);
