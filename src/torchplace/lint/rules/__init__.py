"""The rule families, one module each; ``TPL<family><number>`` codes.

=======  ==========================================  =======================
family   concern                                     module
=======  ==========================================  =======================
TPL0xx   files that cannot be read or parsed         :mod:`.meta`
TPL1xx   transfers and placement                     :mod:`.placement`
TPL2xx   host syncs inside loops                     :mod:`.sync`
TPL3xx   timing device work                          :mod:`.timing`
TPL4xx   checkpoints and model loading               :mod:`.loading`
TPL5xx   module state hidden from ``.to()``          :mod:`.state`
TPL6xx   CUDA availability                           :mod:`.availability`
TPL7xx   pinned memory and asynchronous copies       :mod:`.pinned`
TPL8xx   training setup order                        :mod:`.optimizer`
=======  ==========================================  =======================

The placement family's TPL103 lives in :mod:`.factories` (factories in ``forward``) and
:mod:`.factory_match` (factories built to match a tensor parameter, in any function). What the
rules know about PyTorch is data in :mod:`.facts`; which calls load a model (the loaders, and
the linted code's own functions and classes that run one) is :mod:`.model_loads`, and which
calls save a checkpoint to the path their caller hands them is :mod:`.model_saves`; which modules
hold nothing a plain container could hide from ``.to()`` (pooling, activations, the file's
classes built only of them) is :mod:`.stateless`; which of the project's helpers read their
argument back to the host (``to_cpu(x)``) is :mod:`.read_helpers`; which of a file's top-level
functions only its module classes' methods call (their hard-coded ``.cuda()`` is a module's) is
:mod:`.module_helpers`.
"""

from __future__ import annotations

from torchplace.lint.base import Family, Rule
from torchplace.lint.rules import (
    availability,
    loading,
    meta,
    optimizer,
    pinned,
    placement,
    state,
    sync,
    timing,
)

__all__ = ["ALL_RULES", "FAMILIES"]

FAMILIES: tuple[Family, ...] = (
    meta.FAMILY,
    placement.FAMILY,
    sync.FAMILY,
    timing.FAMILY,
    loading.FAMILY,
    state.FAMILY,
    availability.FAMILY,
    pinned.FAMILY,
    optimizer.FAMILY,
)

# code -> rule, in code order.
ALL_RULES: dict[str, Rule] = {
    rule.code: rule
    for rule in sorted((r for family in FAMILIES for r in family.rules), key=lambda r: r.code)
}
