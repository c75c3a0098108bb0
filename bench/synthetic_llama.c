/* synthetic_llama.c - builds a LLaMA-layer-shaped task graph in C for the runtime benchmark.
 *
 * bench/runtime_build.py compiles this file together with the runtime (pto.cache.cbuild) and calls
 * bench_llama_build once per graph, because per-task calls from Python would measure
 * Python, not the runtime. The access pattern follows one LLaMA layer with split flash
 * attention over n row tiles of 32 rows (non-causal):
 *
 *   per row tile i (7 tasks):  rmsnorm, q/k/v projections (read shared weights), rope q,
 *                              rope k, flash init (o, m, l)
 *   per pair (i, j) (3 tasks): score (q_i, k_j -> s_i), softmax update (s_i, m_i, l_i),
 *                              output update (s_i, v_j -> o_i)
 *   per row tile i (9 tasks):  flash finalize, o projection, residual, rmsnorm, gate, up,
 *                              swiglu, down, residual
 *
 * so 16 n + 3 n^2 tasks. With drain != 0 (a window is configured) the driver plays the
 * executor single-threaded: whenever pto_task_alloc reports a full window it pops and
 * completes every ready task, then retries; at the end it completes the rest.
 */

#include "pto_runtime.h"

enum { TILE = 32, HID = 4096, FFN = 11008, DRAIN_BATCH = 1024 };

enum {
    F_RMSNORM, F_QPROJ, F_KPROJ, F_VPROJ, F_ROPE_Q, F_ROPE_K, F_FLASH_INIT, F_SCORE, F_SOFTMAX, F_OUTPUT,
    F_FINALIZE, F_OPROJ, F_RESID, F_RMSNORM2, F_GATE, F_UP, F_SWIGLU, F_DOWN, F_RESID2, F_COUNT
};

static const char *const func_names[F_COUNT] = {
    "rmsnorm_tile", "q_proj_tile", "k_proj_tile", "v_proj_tile", "rope_q_tile", "rope_k_tile",
    "flash_init_tile", "flash_score_block", "flash_softmax_update", "flash_output_update",
    "flash_finalize_tile", "o_proj_tile", "residual_tile", "rmsnorm2_tile", "gate_tile", "up_tile",
    "swiglu_tile", "down_tile", "residual2_tile"
};

typedef struct {
    int32_t x, xn, q, k, v, o, m, l, s, attn, h, hn, g, u, a, dn, y;
    int32_t wq, wk, wv, wo, wg, wu, wd;
    int32_t f[F_COUNT];
    int32_t drain;
} llama;

/* Pop and complete until nothing is ready (single-threaded executor). */
static int drain_ready(pto_runtime *rt)
{
    int32_t ids[DRAIN_BATCH], n;
    do {
        PTO_TRY(pto_ready_pop(rt, ids, DRAIN_BATCH, &n));
        PTO_TRY(pto_task_complete_many(rt, ids, n));
    } while (n > 0);
    return PTO_OK;
}

static int task_new(pto_runtime *rt, const llama *L, int func, int32_t *task)
{
    int st;
    while ((st = pto_task_alloc(rt, L->f[func], 0, task)) == PTO_ERR_WINDOW_FULL && L->drain) {
        PTO_TRY(drain_ready(rt));
    }
    return st;
}

/* Tile i of an activation tensor with `cols` columns. */
static int in_tile(pto_runtime *rt, int32_t task, int32_t tensor, int32_t i, int64_t cols)
{
    return pto_task_add_input(rt, task, tensor, (int64_t)i * TILE, 0, TILE, cols);
}

static int out_tile(pto_runtime *rt, int32_t task, int32_t tensor, int32_t i, int64_t cols)
{
    return pto_task_add_output(rt, task, tensor, (int64_t)i * TILE, 0, TILE, cols);
}

static int inout_tile(pto_runtime *rt, int32_t task, int32_t tensor, int32_t i, int64_t cols)
{
    return pto_task_add_inout(rt, task, tensor, (int64_t)i * TILE, 0, TILE, cols);
}

static int register_all(pto_runtime *rt, llama *L, int64_t rows)
{
    int k;
    PTO_TRY(pto_tensor_register(rt, "x", rows, HID, 2, &L->x));
    PTO_TRY(pto_tensor_register(rt, "x_norm", rows, HID, 2, &L->xn));
    PTO_TRY(pto_tensor_register(rt, "q", rows, HID, 2, &L->q));
    PTO_TRY(pto_tensor_register(rt, "k", rows, HID, 2, &L->k));
    PTO_TRY(pto_tensor_register(rt, "v", rows, HID, 2, &L->v));
    PTO_TRY(pto_tensor_register(rt, "attn_o", rows, HID, 4, &L->o));
    PTO_TRY(pto_tensor_register(rt, "attn_m", rows, 1, 4, &L->m));
    PTO_TRY(pto_tensor_register(rt, "attn_l", rows, 1, 4, &L->l));
    PTO_TRY(pto_tensor_register(rt, "scores", rows, TILE, 4, &L->s));
    PTO_TRY(pto_tensor_register(rt, "attn_proj", rows, HID, 2, &L->attn));
    PTO_TRY(pto_tensor_register(rt, "h", rows, HID, 2, &L->h));
    PTO_TRY(pto_tensor_register(rt, "h_norm", rows, HID, 2, &L->hn));
    PTO_TRY(pto_tensor_register(rt, "gate", rows, FFN, 2, &L->g));
    PTO_TRY(pto_tensor_register(rt, "up", rows, FFN, 2, &L->u));
    PTO_TRY(pto_tensor_register(rt, "act", rows, FFN, 2, &L->a));
    PTO_TRY(pto_tensor_register(rt, "down", rows, HID, 2, &L->dn));
    PTO_TRY(pto_tensor_register(rt, "y", rows, HID, 2, &L->y));
    PTO_TRY(pto_tensor_register(rt, "w_q", HID, HID, 2, &L->wq));
    PTO_TRY(pto_tensor_register(rt, "w_k", HID, HID, 2, &L->wk));
    PTO_TRY(pto_tensor_register(rt, "w_v", HID, HID, 2, &L->wv));
    PTO_TRY(pto_tensor_register(rt, "w_o", HID, HID, 2, &L->wo));
    PTO_TRY(pto_tensor_register(rt, "w_gate", HID, FFN, 2, &L->wg));
    PTO_TRY(pto_tensor_register(rt, "w_up", HID, FFN, 2, &L->wu));
    PTO_TRY(pto_tensor_register(rt, "w_down", FFN, HID, 2, &L->wd));
    for (k = 0; k < F_COUNT; k++) {
        PTO_TRY(pto_func_register(rt, func_names[k], &L->f[k]));
    }
    return PTO_OK;
}

/* One task reading tile i of `in` and the whole weight `w`, writing tile i of `out`. */
static int proj(pto_runtime *rt, const llama *L, int func, int32_t i, int32_t in, int64_t in_cols, int32_t w,
                int64_t w_rows, int64_t w_cols, int32_t out)
{
    int32_t t;
    PTO_TRY(task_new(rt, L, func, &t));
    PTO_TRY(in_tile(rt, t, in, i, in_cols));
    PTO_TRY(pto_task_add_input(rt, t, w, 0, 0, w_rows, w_cols));
    PTO_TRY(out_tile(rt, t, out, i, w_cols));
    return pto_task_submit(rt, t);
}

/* Elementwise-style task: up to two input tiles, one output tile (same cols). */
static int tile_op(pto_runtime *rt, const llama *L, int func, int32_t i, int32_t in1, int32_t in2, int32_t out,
                   int64_t cols)
{
    int32_t t;
    PTO_TRY(task_new(rt, L, func, &t));
    PTO_TRY(in_tile(rt, t, in1, i, cols));
    if (in2 >= 0) {
        PTO_TRY(in_tile(rt, t, in2, i, cols));
    }
    PTO_TRY(out_tile(rt, t, out, i, cols));
    return pto_task_submit(rt, t);
}

static int pre_attention(pto_runtime *rt, const llama *L, int32_t i)
{
    int32_t t;
    PTO_TRY(tile_op(rt, L, F_RMSNORM, i, L->x, -1, L->xn, HID));
    PTO_TRY(proj(rt, L, F_QPROJ, i, L->xn, HID, L->wq, HID, HID, L->q));
    PTO_TRY(proj(rt, L, F_KPROJ, i, L->xn, HID, L->wk, HID, HID, L->k));
    PTO_TRY(proj(rt, L, F_VPROJ, i, L->xn, HID, L->wv, HID, HID, L->v));
    PTO_TRY(task_new(rt, L, F_ROPE_Q, &t));
    PTO_TRY(inout_tile(rt, t, L->q, i, HID));
    PTO_TRY(pto_task_submit(rt, t));
    PTO_TRY(task_new(rt, L, F_ROPE_K, &t));
    PTO_TRY(inout_tile(rt, t, L->k, i, HID));
    PTO_TRY(pto_task_submit(rt, t));
    PTO_TRY(task_new(rt, L, F_FLASH_INIT, &t));
    PTO_TRY(out_tile(rt, t, L->o, i, HID));
    PTO_TRY(out_tile(rt, t, L->m, i, 1));
    PTO_TRY(out_tile(rt, t, L->l, i, 1));
    return pto_task_submit(rt, t);
}

static int attention_pair(pto_runtime *rt, const llama *L, int32_t i, int32_t j)
{
    int32_t t;
    PTO_TRY(task_new(rt, L, F_SCORE, &t));
    PTO_TRY(in_tile(rt, t, L->q, i, HID));
    PTO_TRY(in_tile(rt, t, L->k, j, HID));
    PTO_TRY(out_tile(rt, t, L->s, i, TILE));
    PTO_TRY(pto_task_submit(rt, t));
    PTO_TRY(task_new(rt, L, F_SOFTMAX, &t));
    PTO_TRY(inout_tile(rt, t, L->s, i, TILE));
    PTO_TRY(inout_tile(rt, t, L->m, i, 1));
    PTO_TRY(inout_tile(rt, t, L->l, i, 1));
    PTO_TRY(pto_task_submit(rt, t));
    PTO_TRY(task_new(rt, L, F_OUTPUT, &t));
    PTO_TRY(in_tile(rt, t, L->s, i, TILE));
    PTO_TRY(in_tile(rt, t, L->v, j, HID));
    PTO_TRY(inout_tile(rt, t, L->o, i, HID));
    return pto_task_submit(rt, t);
}

static int post_attention(pto_runtime *rt, const llama *L, int32_t i)
{
    int32_t t;
    PTO_TRY(task_new(rt, L, F_FINALIZE, &t));
    PTO_TRY(inout_tile(rt, t, L->o, i, HID));
    PTO_TRY(in_tile(rt, t, L->l, i, 1));
    PTO_TRY(pto_task_submit(rt, t));
    PTO_TRY(proj(rt, L, F_OPROJ, i, L->o, HID, L->wo, HID, HID, L->attn));
    PTO_TRY(tile_op(rt, L, F_RESID, i, L->x, L->attn, L->h, HID));
    PTO_TRY(tile_op(rt, L, F_RMSNORM2, i, L->h, -1, L->hn, HID));
    PTO_TRY(proj(rt, L, F_GATE, i, L->hn, HID, L->wg, HID, FFN, L->g));
    PTO_TRY(proj(rt, L, F_UP, i, L->hn, HID, L->wu, HID, FFN, L->u));
    PTO_TRY(tile_op(rt, L, F_SWIGLU, i, L->g, L->u, L->a, FFN));
    PTO_TRY(proj(rt, L, F_DOWN, i, L->a, FFN, L->wd, FFN, HID, L->dn));
    return tile_op(rt, L, F_RESID2, i, L->h, L->dn, L->y, HID);
}

/* Build the whole graph into rt (fresh, no tensors registered). Returns a pto status. */
int bench_llama_build(pto_runtime *rt, int32_t n_tiles, int32_t drain)
{
    llama L;
    int32_t i, j;
    L.drain = drain;
    PTO_TRY(register_all(rt, &L, (int64_t)n_tiles * TILE));
    for (i = 0; i < n_tiles; i++) {
        PTO_TRY(pre_attention(rt, &L, i));
    }
    for (i = 0; i < n_tiles; i++) {
        for (j = 0; j < n_tiles; j++) {
            PTO_TRY(attention_pair(rt, &L, i, j));
        }
    }
    for (i = 0; i < n_tiles; i++) {
        PTO_TRY(post_attention(rt, &L, i));
    }
    return drain ? drain_ready(rt) : PTO_OK;
}
