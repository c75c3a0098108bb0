"""Code generation from the IR: the orchestration as portable C (:mod:`.c_orch`, its expressions
:mod:`.c_expr`, the standalone ``main.c`` :mod:`.c_main`) and the InCore functions as Triton kernels
(:mod:`.triton`)."""
