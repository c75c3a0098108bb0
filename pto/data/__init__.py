"""The data of a run on torch tensors: :mod:`.buffers` (each tensor of an orchestration
function at its shape, allocated or checked) and :mod:`.batch` (a batch of tasks of one
specialized InCore function: what an executor hands a backend and the evaluator runs). Above the
IR only.
"""
