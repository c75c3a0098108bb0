"""What a runnable program is: the plugin interface behind ``pto run/codegen/estimate PROGRAM``.

A :class:`Program` owns everything about itself that the generic layers must not know: its
configurations, its own options (each an :class:`Option`, which becomes a command-line flag of
the commands that take the program), its shape parameters (each a :class:`ShapeParam`: the
sequence length of a layer, the batch and cache length of a decode step; a :class:`Shape` holds
their values), the module it builds for a :class:`Settings`, its scalar parameters as
expressions of the shape, seeded inputs, an independent torch reference and flops. Launch
parameters are data (:mod:`pto.backends.triton.schedules`), not code.

What only some programs offer is a protocol the commands ask for (``isinstance``), not a method
every program carries: exact task counts without a build (:class:`CountsTasks`), the columns and
baselines of ``pto estimate`` (:class:`Estimation`). Text generation is no program's: ``pto
generate`` asks the generation application (:mod:`pto.generation`), which uses the programs'
builders.

Programs are found through the ``pto.programs`` entry-point group (:mod:`pto.programs`), so a
package outside this repository adds one by declaring, in its ``pyproject.toml``::

    [project.entry-points."pto.programs"]
    myprog = "mypackage.myprog:PROGRAM"

The defaults follow one rule for every command (:meth:`Program.settings`): the device is the
GPU when one is visible, else the CPU; the configuration is the program's default for that
device, the dtype bf16 on a GPU and f32 on a CPU, the target the device's own.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pto.errors import UsageError
from pto.ir.dtypes import DType, dtype_of
from pto.ir.expr import evaluate
from pto.ir.nodes import Module
from pto.machine.target import Target

if TYPE_CHECKING:
    import torch

DEFAULTS_RULE = ("defaults: --device auto is cuda when a GPU is visible, else cpu; --config auto is the "
                 "program's default for that device, --dtype auto bf16 on cuda and f32 on cpu, --target the "
                 "device's own")


def without_tp(flag: str, value: Any, why: str = "") -> UsageError:
    """The error of an option that acts across tensor-parallel ranks alone (``Option.tp_only``,
    ``pto generate --allreduce-dtype``) given without ``--tp N`` above 1, where it would be
    ignored (``why``: more, after the rule)."""
    return UsageError(f"{flag} {value} applies to tensor parallelism, with --tp N above 1{why}; "
                      "one rank would ignore it")


@dataclass(frozen=True)
class Option:
    """One option of a program: a key of its :class:`Settings` and a command-line flag.

    A ``bool`` default makes a pair of flags, ``--name`` and ``--no-name`` (giving both is an
    error); otherwise ``--name VALUE``, checked against ``choices`` when given. Underscores in
    ``name`` become dashes in the flag. ``tp_only``: it acts across tensor-parallel ranks alone
    (the dtype of their sums), so the command line refuses it without ``--tp N`` above 1, where
    it would be ignored.
    """

    name: str
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None
    tp_only: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        if isinstance(self.default, bool):
            group = parser.add_mutually_exclusive_group()
            group.add_argument(self.flag, dest=self.name, action="store_true", default=None,
                               help=f"{self.help} (default: {'on' if self.default else 'off'})")
            group.add_argument("--no-" + self.name.replace("_", "-"), dest=self.name, action="store_false",
                               default=None, help=f"the opposite of {self.flag}")
            return
        kind = type(self.default)
        shown = "" if self.default in ("", None) else f" (default: {self.default})"  # no "(default: )"
        parser.add_argument(self.flag, dest=self.name, default=None, type=kind, choices=self.choices,
                            metavar=None if self.choices else self.name.upper(), help=f"{self.help}{shown}")

    def check(self, program: str, value: Any) -> Any:
        if value is None:
            return self.default
        if isinstance(self.default, bool):
            if not isinstance(value, bool):
                raise UsageError(f"{program}: {self.flag} takes true or false, got {value!r}")
            return value
        if self.choices is not None and value not in self.choices:
            raise UsageError(f"{program}: unknown {self.name} {value!r} "
                             f"(choose from {', '.join(map(str, self.choices))})")
        return value


@dataclass(frozen=True)
class ShapeParam:
    """One named dimension of a program's shape (``seq``, ``batch``, ``cache``): a positive
    integer, a command-line flag (``--seq N``) of the commands that take the program."""

    name: str
    default: int
    help: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


#: the runtime's tensor dimensions and ids are int32
_SHAPE_MAX = 2**31 - 1


@dataclass(frozen=True)
class Shape(Mapping):
    """The values of a program's shape parameters, in the program's order (a read-only mapping:
    ``shape["seq"]``); the orchestration's scalars are expressions of them."""

    values: tuple[tuple[str, int], ...]

    def __getitem__(self, name: str) -> int:
        for k, v in self.values:
            if k == name:
                return v
        raise KeyError(name)

    def __iter__(self):
        return (k for k, _ in self.values)

    def __len__(self) -> int:
        return len(self.values)

    def to_json(self) -> dict[str, int]:
        return dict(self.values)

    def __str__(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in self.values)


@dataclass(frozen=True)
class Settings:
    """Everything that changes the program a :class:`Program` builds (not how it runs)."""

    config: str
    dtype: DType
    target: Target
    options: tuple[tuple[str, Any], ...] = ()  # the program's own options, sorted by name
    tp: int = 1  # tensor-parallel ranks: the module is one rank's (every rank builds the same)

    def __getitem__(self, name: str) -> Any:
        for k, v in self.options:
            if k == name:
                return v
        raise KeyError(name)

    @property
    def key(self) -> tuple:
        """Hashable identity (caches of built programs and runners)."""
        return (self.config, self.dtype.short, self.target, self.options, self.tp)

    def to_json(self) -> dict:
        return {"config": self.config, "dtype": self.dtype.short, "target": self.target.name, "tp": self.tp,
                **dict(self.options)}


class Program:
    """Base class of runnable programs (see the module docstring)."""

    name = ""
    description = ""
    #: configuration name -> the program's description of it (first: the CPU default)
    configs: Mapping[str, Any] = {}
    #: the program's own options
    options: tuple[Option, ...] = ()
    #: output tensors (checked against the reference)
    outputs: tuple[str, ...] = ()
    #: the shape's named dimensions; the first is the one ``pto estimate`` and ``pto bench`` sweep
    shape_params: tuple[ShapeParam, ...] = (ShapeParam("seq", 128, "sequence length"),)
    #: the program has a tensor-parallel form (``--tp N``): with ``Settings.tp`` > 1, :meth:`build`
    #: makes one rank's module (the same on every rank) and :meth:`shard` gives each rank its inputs
    tensor_parallel = False
    #: folders of tuned launch settings the program ships beside its code (each holds a
    #: ``<device>/<function>.json`` database, :mod:`pto.backends.triton.schedules`); the user's
    #: own database (``pto tune``) comes first
    schedules: tuple[Path, ...] = ()

    # -- settings ---------------------------------------------------------------------------------
    def auto_executor(self, s: Settings, shape: Shape | Mapping | None = None) -> str | None:
        """The executor ``--executor auto`` means for graphs of this program under ``s`` at
        ``shape`` (None: the program's default shape) on a GPU, where measurements settle it; None
        (the default): decided per built graph (:func:`pto.exec.choose`)."""
        return None

    def default_config(self, device: str) -> str:
        """The configuration ``--config auto`` picks on ``device`` (the first one by default)."""
        return next(iter(self.configs))

    def settings(self, *, device: str = "cpu", config: str | None = None, dtype: DType | str | None = None,
                 target: Target | None = None, tp: int = 1, **options: Any) -> Settings:
        """Resolve the defaults (the module docstring's rule) and check every value; ``tp``: the
        tensor-parallel ranks the module is built for."""
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
            raise UsageError(f"{self.name}: --tp must be a positive integer, got {tp!r}")
        if tp > 1 and not self.tensor_parallel:
            raise UsageError(f"{self.name} has no tensor-parallel form (--tp {tp}); run it with --tp 1")
        if config in (None, "auto"):
            config = self.default_config(device)
        if config not in self.configs:
            raise UsageError(f"{self.name}: unknown config {config!r} (choose from {', '.join(self.configs)})")
        if dtype in (None, "auto"):
            dtype = default_dtype(device)
        dt = dtype_of(dtype) if not isinstance(dtype, DType) else dtype
        if dt.is_quantized:
            own = any(o.name == "quantize" for o in self.options)
            extra = " (its option --quantize stores the weights so)" if own else ""
            raise UsageError(f"{self.name}: --dtype {dt} is a quantized type of weights in memory; a run computes in "
                             f"f32, f16 or bf16{extra}")
        if target is None:
            from pto.machine.target import detect

            target = detect(device)
        known = {o.name: o for o in self.options}
        unknown = sorted(set(options) - set(known))
        if unknown:
            have = f" (its options: {', '.join(known)})" if known else " (it has no options of its own)"
            raise UsageError(f"{self.name} has no option {unknown[0]!r}{have}")
        vals = tuple(sorted((n, o.check(self.name, options.get(n))) for n, o in known.items()))
        s = Settings(config, dt, target, vals, tp)
        self.check_settings(s)
        return s

    def check_settings(self, s: Settings) -> None:
        """Refuse a combination of settings the program cannot build (nothing by default)."""

    def for_executor(self, s: Settings, executor: str) -> Settings:
        """The settings ``s`` as built for ``executor`` (the one :func:`pto.engine.resolve`
        chose): a program whose module differs by executor (the model's tiles) says so in its
        settings, so that each executor's module is built and cached apart; ``s`` by default."""
        return s

    @property
    def swept(self) -> ShapeParam:
        """The shape parameter ``pto estimate`` and ``pto bench`` sweep (the first)."""
        return self.shape_params[0]

    def shape(self, value: Shape | Mapping | int | None = None, **named: int | None) -> Shape:
        """A checked :class:`Shape`: ``value`` (a Shape, a mapping of names to values, or an int
        for the first parameter) and ``named`` values over the defaults; an unknown name or a
        value that is not a positive integer is one UsageError naming the flag. A Shape this
        program made is itself (checked once)."""
        if isinstance(value, Shape) and not any(v is not None for v in named.values()) \
                and tuple(value) == tuple(p.name for p in self.shape_params):
            return value
        given: dict = {}
        if isinstance(value, Mapping):
            given.update(value)
        elif value is not None:
            given[self.swept.name] = value
        given.update({k: v for k, v in named.items() if v is not None})
        known = {p.name: p for p in self.shape_params}
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise UsageError(f"{self.name} has no shape parameter {unknown[0]!r} (its shape: "
                             f"{', '.join(known)})")
        out = []
        for p in self.shape_params:
            v = given.get(p.name, p.default)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= _SHAPE_MAX:
                raise UsageError(f"{self.name}: {p.flag} must be an integer from 1 to {_SHAPE_MAX}, got {v!r}")
            out.append((p.name, int(v)))
        return Shape(tuple(out))

    # -- what the program is ----------------------------------------------------------------------
    def build(self, s: Settings, shape: Shape | None = None) -> Module:
        """The module of settings ``s``. Its scalars are expressions of the shape
        (:meth:`scalar_exprs`); a program whose tiles depend on a shape parameter (a decode
        step's batch: the rows of its tiles) builds for ``shape`` (its defaults when None)."""
        raise NotImplementedError

    def written(self, s: Settings, shape: Shape | None = None) -> Module:
        """The module as the program writes it, before the program's own rewrites (its
        ``--fuse``); :meth:`build` by default."""
        return self.build(s, shape)

    def fusion(self, s: Settings, shape: Shape | None = None):
        """What :func:`pto.passes.fusion.fuse.fuse` did to :meth:`written` for :meth:`build` (a
        :class:`pto.passes.fusion.fuse.FusionReport`), or None where the program does not fuse."""
        return None

    def input_conversions(self, s: Settings) -> list:
        """Other sets of inputs a file given to ``pto run --inputs`` may hold for this program:
        ``(settings whose module takes them, their conversion to this module's inputs)``, tried in
        order where the file does not hold this module's own; none by default."""
        return []

    def packed_inputs(self, s: Settings) -> tuple[tuple[str, ...], ...]:
        """Groups of inputs that a run allocates in one buffer, those of one shape and dtype
        stacked by rows (:func:`pto.data.buffers.placeholders`): the wave executor launches one function's
        tasks over views of one buffer as one batch (:class:`pto.exec.waves.WaveExecutor`); none
        by default."""
        return ()

    def scalar_exprs(self, s: Settings) -> dict:
        """Each scalar parameter of the entry function as an expression of the shape parameters
        (the standalone main.c that ``pto codegen`` writes evaluates them in C)."""
        raise NotImplementedError

    def scalars(self, s: Settings, shape: Shape) -> dict[str, int]:
        return {k: int(evaluate(e, dict(shape))) for k, e in self.scalar_exprs(s).items()}

    def inputs(self, s: Settings, shape: Shape, device, seed: int = 0) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def reference(self, s: Settings, shape: Shape, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The outputs from the whole inputs of :meth:`inputs` (with ``s.tp`` > 1 too: the
        reference is the single-process layer)."""
        raise NotImplementedError

    def shard(self, s: Settings, inputs: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
        """Rank ``rank``'s inputs (those of the module :meth:`build` makes) from the whole inputs
        of :meth:`inputs`, which every rank makes from the same seed; the inputs themselves with
        ``s.tp`` 1."""
        if s.tp == 1:
            return inputs
        raise NotImplementedError

    def unshard(self, s: Settings, outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The whole outputs from this rank's ``outputs`` under ``s.tp`` > 1, for the check and
        the saved files: a collective where ranks hold shares of an output (every rank calls it,
        in the same order); by default every rank holds its outputs whole."""
        return outputs

    def flops(self, s: Settings, shape: Shape) -> float:
        """Floating-point operations of one run (for TFLOP/s); 0 if not meaningful."""
        return 0.0

    def scratch_bytes(self, s: Settings, shape: Shape) -> int:
        """Bytes a run allocates beside the graph's tensors, at most (the Triton backend's sum
        buffer for collective tasks): the memory check counts them with the tensors."""
        return 0

    def check_shape(self, s: Settings, shape: Shape) -> None:
        """Refuse a shape the program cannot be built for (a decode cache that is not whole
        attention chunks): it would compute something else. ``pto estimate`` checks this alone;
        nothing to check by default."""

    def check_size(self, s: Settings, shape: Shape) -> None:
        """Refuse, before any work, a size the program cannot run: :meth:`check_shape`, and what
        a run needs beyond it (a graph the runtime can hold)."""
        self.check_shape(s, shape)


# -- what some programs offer besides (the commands ask: isinstance(program, CountsTasks)) -------


@runtime_checkable
class CountsTasks(Protocol):
    """A program that knows its graph's exact counts without building it (``pto estimate``'s
    closed form, the memory check before a run)."""

    def counts(self, s: Settings, shape: Shape, adaptive: bool = True) -> dict[str, int] | None:
        """Exact ``tasks`` and ``edges`` of the graph (and ``row_tiles`` where it has them), or
        None for settings it cannot count (then ``pto estimate`` counts by running the
        generated C)."""


@dataclass(frozen=True)
class Baseline:
    """A setting to draw beside the user's in ``pto estimate --plot`` (:meth:`Estimation.estimate_baselines`):
    its label, its settings, published task counts by sequence length (markers), and the bytes
    per task of another runtime for the same graph (a second memory line), if any."""

    label: str
    settings: Settings
    published: dict[int, int] | None = None
    other_bytes_per_task: tuple[str, float] | None = None


@runtime_checkable
class Estimation(Protocol):
    """What ``pto estimate`` shows of a program besides the counts."""

    def estimate_columns(self, s: Settings, shape: Shape) -> dict[str, int]:
        """Bytes the program itself accounts for, extra columns of the table (a decode step: its
        KV cache and the bytes each step must read)."""

    def estimate_baselines(self, s: Settings) -> list[Baseline]:
        """Other settings ``--plot`` draws beside ``s``."""


def default_dtype(device: str) -> DType:
    """The dtype ``auto`` means on ``device`` (the rule of defaults: bf16 on cuda, f32 on cpu)."""
    return DType.BF16 if device == "cuda" else DType.F32


def seeded_randn(shape, dtype: DType, device, generator: torch.Generator, scale: float = 1.0):
    """Normal random values made on the CPU from a seeded generator (the same numbers on every
    device), then moved and cast."""
    import torch

    x = torch.randn(*shape, generator=generator, dtype=torch.float32) * scale
    return x.to(device=device, dtype=dtype.torch)


__all__ = ["Program", "Option", "without_tp", "Settings", "Shape", "ShapeParam", "CountsTasks", "Estimation",
           "Baseline", "seeded_randn", "default_dtype", "DEFAULTS_RULE"]
