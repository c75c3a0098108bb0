"""The IR: dtypes, the op vocabulary, scalar expressions, nodes, derived facts, the name
registry and the verifiers (:func:`verify_module`).

Nothing in pto/ir imports from above it (builders, text, passes, codegen): only pto.ir and
pto.errors.
"""

from pto.ir.verify import verify_incore, verify_module, verify_orch

__all__ = ["verify_module", "verify_incore", "verify_orch"]
