"""Safety and debuggability tools over a run: who made the first NaN or infinity
(:mod:`pto.safety.blame`), whether an executor's schedule kept every dependency
(:mod:`pto.safety.trace_check`), user tensors in and out (:mod:`pto.safety.tensor_io`) and the
launch settings behind bitwise determinism (:mod:`pto.safety.determinism`). docs/SAFETY.md
explains each."""

from pto.safety.blame import NonFiniteError, blame, format_nonfinite
from pto.safety.tensor_io import load_inputs, save_outputs
from pto.safety.trace_check import ScheduleReport, check_schedule, verify_schedule

__all__ = ["blame", "format_nonfinite", "NonFiniteError", "check_schedule", "verify_schedule", "ScheduleReport",
           "load_inputs", "save_outputs"]
