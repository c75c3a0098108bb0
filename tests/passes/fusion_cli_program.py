"""A program for the command-line test of fusion's refusals (test_fusion_property.py registers it
as ``fusecases`` through an entry point, as any plugin registers): a re-associating reduction over
an adaptive loop whose input advances by twice the base height, so fusion may not step it over
merged tiles (binary expansion's placement rule) and fuses it over base tiles instead, saying why;
and a reduction into a row that lies in its tensor only where its loop has a trip (``S - 10``
over ``S - 9`` trips), fused to run only then.
"""

from __future__ import annotations

from pto import Orchestration, Var, cdiv, f32
from pto.passes.fusion import fuse
from pto.program import Program, Settings, ShapeParam
from tests.passes.fusion_programs import KERNELS


def build_module():
    o = Orchestration("fusecases")
    S = o.scalar("S")
    x, acc = o.input("x", 2 * S + 8, 4, f32), o.inout("acc", 1, 4, f32)
    with o.for_loop("j", 0, cdiv(S, 2), tile_levels={0: 2, 2: 4}, reassociate=True) as j:
        o.call(KERNELS["colsum_acc"], {"x": (x, j * 4, 0, j.rows, 4), "acc": (acc, 0, 0, 1, 4)},
               dims={"R": j.rows, "W": 4})
    late = o.inout("late", 8, 4, f32)
    with o.for_loop("k", 0, S - 9) as k:
        o.call(KERNELS["colsum_acc"], {"x": (x, k * 2, 0, 2, 4), "acc": (late, S - 10, 0, 1, 4)},
               dims={"R": 2, "W": 4})
    return o.module()


class FuseCases(Program):
    name = "fusecases"
    description = "a reduction fusion may not merge (tests/passes/fusion_cli_program.py)"
    configs = {"tiny": None}
    outputs = ("acc",)
    shape_params = (ShapeParam("seq", 9, "rows of the reduction"),)

    def written(self, s: Settings, shape=None):
        return build_module()

    def build(self, s: Settings, shape=None):
        return fuse(build_module())[0]

    def fusion(self, s: Settings, shape=None):
        return fuse(build_module())[1]

    def scalar_exprs(self, s):
        return {"S": Var("seq")}


PROGRAM = FuseCases()
