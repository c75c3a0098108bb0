"""The one exception family of pto.

Every error a user can cause (a malformed program, a bad binding, a runtime status code, a bad
command-line value) is raised as a subclass of :class:`PTOError`; the command line prints its
message as one line and exits non-zero.
"""

from __future__ import annotations


class PTOError(Exception):
    """Base class of every error pto raises on purpose."""


class BuildError(PTOError):
    """An InCore or orchestration function is malformed (shapes, dtypes, names, regions)."""


class ParseError(PTOError):
    """The text form of a module could not be parsed."""


class RuntimeStatusError(PTOError):
    """The C runtime returned a non-zero status; ``status`` holds the code."""

    def __init__(self, message: str, status: int = -1):
        super().__init__(message)
        self.status = status


class SramError(BuildError):
    """The live tiles of an InCore function do not fit the target's on-chip memory."""


class RegionError(PTOError):
    """A call's region lies outside its tensor or exceeds what the callee accesses."""


class ExecutionError(PTOError):
    """A graph could not be executed (no backend, deadlock, wrong inputs)."""


class ResourceError(ExecutionError):
    """A kernel needs more of a device resource (shared memory, registers) than the device has;
    the message names the kernel, the resource and the setting that asked for it."""


class UsageError(PTOError):
    """A command-line or API argument has a value pto cannot accept."""
