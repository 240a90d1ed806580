"""Device provenance: which values live on a device, which on the host, which loops step
through batches.

The rules ask three questions of a file, all answered here from evidence in the code:

- **Where does a value live?** :meth:`FileFacts.fact` evaluates an expression at a line of its
  function: a :class:`Fact` says ``"device"`` (a result of ``.to(device)``/``.cuda()``, a
  factory given ``device=``, a call of a moved model, arithmetic, losses and methods of such
  values, a batch that was moved) or ``"host"`` (a Python number, ``.item()``/``.cpu()``
  results, NumPy, a factory without ``device=``), and where it came from. ``None`` means
  nothing in the code says. Moving data to a ``device`` variable is evidence even when that
  variable may hold the CPU at run time: the code is written for a device.
- **Which loop steps through batches?** :meth:`FileFacts.loop_kind` classifies a loop by its
  own statements: ``"batch"`` when it calls ``.backward()``/an optimizer step, moves what it
  iterates to a device, runs a moved model or calls a training step; ``"rows"`` when it iterates
  a device value element by element. A loop whose batch evidence is all inside a nested loop
  (or a called function that has its own batch loop) runs once per epoch.
- **Who runs per batch?** :meth:`FileFacts.per_batch` says whether a function runs once per
  batch (a training-framework step hook, a function called inside a batch loop of the file, or
  one called by such a function) and what its parameters hold at those calls.

Facts are computed on first use for one function at a time and cached; files are read once
per process (:func:`facts_for_file`).

One module per concept: :mod:`.values` (a :class:`Fact` and what one expression says by its
shape), :mod:`.flow` (names followed through a function), :mod:`.loops` (loop
classification), :mod:`.callers` (per-batch functions through their callers), :mod:`.forward`
(a module's ``forward`` that no caller in sight runs), :mod:`.given`
(what every caller of a function hands its parameters), :mod:`.cycles` (answers that ask each
other in a cycle, cached so that the verdicts do not depend on which was asked first) and
:mod:`.files` (:class:`FileFacts`, which ties them together and caches their answers).
"""

from torchplace.lint.provenance.callers import PerBatch
from torchplace.lint.provenance.files import FileFacts, facts_for_file, file_facts, scope_node
from torchplace.lint.provenance.values import Fact, LoopKind, is_device_expr, moves_to_device

__all__ = [
    "Fact",
    "FileFacts",
    "LoopKind",
    "PerBatch",
    "facts_for_file",
    "file_facts",
    "is_device_expr",
    "moves_to_device",
    "scope_node",
]
