"""The random region programs of tests/runtime/test_runtime_fuzz.py executed by the native pool:
kernels that read and write their regions run on the pool's worker threads while this thread
submits, at 1, 2 and 4 threads, with the whole graph kept and through windows of 1 to 6 slots
(2,000 programs, a few seconds).

Each task's kernel (C, below) hashes everything it reads with its task index and writes every
element of its output and inout regions from that hash (inout: mixed with the old value), so the
final memory is a function of the order in which tasks that touch common elements ran. Running
the same kernels one after another in program order gives the reference; the pool must leave
exactly that memory. The programs' own scalars create no dependencies: the kernel's scalars are
its task index and its regions' kinds instead.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from pto.backends.c.backend import REGION
from pto.cache.cbuild import load_cffi_module
from pto.runtime import Runtime, runtime_cdef, runtime_include_dir, runtime_sources
from tests.runtime.test_runtime_fuzz import IN, INOUT, OUT, SCALAR, random_program

KERNEL_C = r"""
#include "pto_runtime.h"

static uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 0x100000001b3u; }

/* s[0]: the task's index, s[1]: the kinds of its n regions, 2 bits each */
static int mixing(const pto_region *m, const int64_t *s, int n)
{
    uint64_t h = mix(0xcbf29ce484222325u, (uint64_t)s[0]);
    int a;
    int64_t i, j;
    for (a = 0; a < n; a++) {
        const int64_t *p = (const int64_t *)(void *)m[a].origin;
        if (((s[1] >> (2 * a)) & 3) == PTO_ARG_OUT) continue;
        for (i = 0; i < m[a].rows; i++)
            for (j = 0; j < m[a].cols; j++) h = mix(h, (uint64_t)p[i * m[a].ld + j]);
    }
    for (a = 0; a < n; a++) {
        const int kind = (int)((s[1] >> (2 * a)) & 3);
        int64_t *p = (int64_t *)(void *)m[a].origin;
        if (kind == PTO_ARG_IN) continue;
        for (i = 0; i < m[a].rows; i++)
            for (j = 0; j < m[a].cols; j++) {
                const uint64_t old = kind == PTO_ARG_INOUT ? (uint64_t)p[i * m[a].ld + j] : 0;
                p[i * m[a].ld + j] = (int64_t)mix(h + (uint64_t)(i * 131 + j), old);
            }
    }
    return 0;
}

static int k1(const pto_region *m, const int64_t *s, float *x) { (void)x; return mixing(m, s, 1); }
static int k2(const pto_region *m, const int64_t *s, float *x) { (void)x; return mixing(m, s, 2); }
static int k3(const pto_region *m, const int64_t *s, float *x) { (void)x; return mixing(m, s, 3); }
static int k4(const pto_region *m, const int64_t *s, float *x) { (void)x; return mixing(m, s, 4); }
static const pto_kernel_info infos[4] = {{k1, 1, 2, 16, "k1"}, {k2, 2, 2, 16, "k2"}, {k3, 3, 2, 16, "k3"},
                                         {k4, 4, 2, 16, "k4"}};

const pto_kernel_info *fuzz_kernel(int32_t n) { return n >= 1 && n <= 4 ? &infos[n - 1] : NULL; }
"""
CDEF = "const pto_kernel_info *fuzz_kernel(int32_t n);\n"
PROGRAMS = 2000


@pytest.fixture(scope="module")
def mod():
    return load_cffi_module("native_fuzz", runtime_cdef() + CDEF, KERNEL_C, sources=runtime_sources(),
                            include_dirs=[runtime_include_dir()])


def regions_only(program):
    """The tasks' region arguments (at least one per task: a task of scalars alone is dropped)."""
    return [[a for a in args if a[0] != SCALAR] for args in program if any(a[0] != SCALAR for a in args)]


def initial(shapes, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(-2**63, 2**63 - 1, size=s, dtype=np.int64, endpoint=True) for s in shapes]


def task_regions(tensors, args) -> np.ndarray:
    out = np.zeros(len(args), REGION)
    for k, (_kind, t, r0, c0, nr, nc) in enumerate(args):
        a = tensors[t]
        out[k] = (a.ctypes.data + (r0 * a.shape[1] + c0) * 8, a.shape[1], nr, nc, r0, c0, *a.shape)
    return out


def kinds(args) -> int:
    return sum(kind << (2 * k) for k, (kind, *_rest) in enumerate(args))


def run_in_order(mod, tensors, program) -> None:
    ffi = mod.ffi
    for t, args in enumerate(program):
        info = mod.lib.fuzz_kernel(len(args))
        regions, scalars = task_regions(tensors, args), np.array([t, kinds(args)], np.int64)
        assert info.fn(ffi.from_buffer("pto_region[]", regions), ffi.from_buffer("int64_t[]", scalars), ffi.NULL) == 0


def run_native(mod, tensors, program, threads: int, window: int) -> None:
    lib, ffi = mod.lib, mod.ffi
    out = ffi.new("pto_native **")

    def install(cfg):
        assert lib.pto_native_create(cfg, threads, out) == 0

    rt = Runtime(window=window, lib=mod, hooks=install)
    nt = out[0]
    try:
        assert lib.pto_native_attach(nt, rt.ptr) == 0
        tids = [rt.register_tensor(f"t{i}", *a.shape, 8) for i, a in enumerate(tensors)]
        for i, a in enumerate(tensors):
            assert lib.pto_native_bind_tensor(nt, tids[i], ffi.cast("void *", a.ctypes.data), a.shape[1]) == 0
        fids = [rt.register_func(f"k{n}") for n in range(1, 5)]
        for n, fid in enumerate(fids, 1):
            assert lib.pto_native_bind_kernel(nt, fid, lib.fuzz_kernel(n)) == 0
        assert lib.pto_native_start(nt) == 0
        adds = {IN: rt.add_input, OUT: rt.add_output, INOUT: rt.add_inout}
        for t, args in enumerate(program):  # submitted here while the workers run them
            task = rt.task(fids[len(args) - 1])
            for kind, tensor, r0, c0, nr, nc in args:
                adds[kind](task, tids[tensor], r0, c0, nr, nc)
            rt.add_scalar(task, t)
            rt.add_scalar(task, kinds(args))
            rt.submit(task)
        assert lib.pto_native_work(nt) == 0
        done = ffi.new("int64_t *"), ffi.new("int32_t *"), ffi.new("int32_t *"), ffi.new("int32_t *")
        lib.pto_native_progress(nt, *done)
        assert done[0][0] == len(program)
    finally:
        rt.close()
        lib.pto_native_destroy(nt)


@pytest.mark.timeout(300)
def test_random_programs_run_natively(mod):
    rng = random.Random(48)
    for seed in range(PROGRAMS):
        shapes, program = random_program(seed)
        program = regions_only(program)
        want = initial(shapes, seed)
        run_in_order(mod, want, program)
        threads, window = rng.choice((1, 2, 4)), rng.choice((0, 0, 1, 2, 3, 6))
        got = initial(shapes, seed)
        run_native(mod, got, program, threads, window)
        for t, (g, w) in enumerate(zip(got, want)):
            what = f"program {seed} ({len(program)} tasks, {threads} threads, window {window})"
            assert np.array_equal(g, w), f"{what}: tensor {t} differs"
