"""Who runs per batch: a function is per-batch when a training framework calls it per batch,
when it is called inside a batch loop of its file or of a sibling module that imports it, or
when a per-batch function calls it. Calls are found through a text index of the file.
"""

from __future__ import annotations

import ast
import bisect
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING

from torchplace.lint.base import call_name
from torchplace.lint.nodes import kept, own_nodes, store_targets, walk
from torchplace.lint.provenance.loops import (
    _chain_root,
    _iterates_batches,
    _split_own,
    below_restarted_mark,
    branch_trains,
    calls_backward,
    counter_names,
    guard_test,
    has_own_batch_loop,
    rare_test,
    remainder_nonzero,
    restarts_mark,
    step_parts,
    steps_optimizer,
)
from torchplace.lint.provenance.values import (
    _FUNCTIONS,
    _LOOPS,
    Fact,
    _device_target,
    _is_cpu,
    _is_move_call,
    _target_names,
)
from torchplace.lint.resolver import base_names, dotted_name, is_autograd_function, module_file
from torchplace.lint.sources import read_neighbour

if TYPE_CHECKING:
    from torchplace.lint.provenance.files import FileFacts

__all__ = [
    "CallWords",
    "PerBatch",
    "call_sites",
    "call_words",
    "calls_in",
    "decode_hook",
    "engine_step",
    "find_per_batch",
    "mentioning",
    "scoped_call_sites",
    "siblings",
    "text_of",
]

# Methods a training framework calls once per batch, with the batch already on the device.
_LIGHTNING_STEPS = frozenset({"training_step", "validation_step", "test_step", "predict_step"})
_STEP_HOOKS = _LIGHTNING_STEPS | frozenset(
    # the same steps of other trainers' tasks and models (ClassyVision's and vissl's
    # `train_step`/`eval_step`, MMEngine's `val_step`, fairseq's `valid_step`)
    {"train_step", "eval_step", "val_step", "valid_step"}
)
_TRAINING_STEPS = frozenset({"training_step", "train_step"})
# Lightning's hooks (of a module or a callback) run once per batch, around its step: a batch
# and the step's outputs they are handed are on the device.
_BATCH_HOOKS = frozenset(
    f"on_{stage}_batch_{when}"
    for stage in ("train", "validation", "test", "predict")
    for when in ("start", "end")
) | {"on_before_backward", "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad"}
_HOOK_ARGUMENTS = ("batch", "outputs", "loss")
# Lightning 1.x's hooks that get what the step returned (on the device), once per batch.
_STEP_END_HOOKS = frozenset(
    f"{stage}_step_end" for stage in ("training", "validation", "test", "predict")
)
# OpenMMLab's training methods of a model or a head (2.x `loss` and a head's `loss_by_feat`,
# 1.x `forward_train`), and the packages whose import marks a file as OpenMMLab code.
_MM_LOSS_HOOKS = frozenset({"loss", "loss_by_feat", "forward_train"})
_MM_ITER_HOOKS = frozenset(
    f"{when}_{stage}_iter" for when in ("before", "after") for stage in ("train", "val", "test")
)
_MM_PACKAGES = frozenset(
    {
        "mmengine",
        "mmcv",
        "mmdet",
        "mmdet3d",
        "mmpose",
        "mmseg",
        "mmocr",
        "mmaction",
        "mmpretrain",
        "mmcls",
        "mmrotate",
        "mmtrack",
        "mmagic",
        "mmedit",
    }
)
# The Hugging Face `Trainer`'s per-batch methods a subclass overrides, `(self, model, inputs)`.
_TRAINER_HOOKS = frozenset({"compute_loss", "training_step"})
# Hugging Face `generate` calls `__call__(input_ids, scores)` of these once per generated
# token, with both on the model's device.
_DECODE_HOOKS = frozenset({"StoppingCriteria", "LogitsProcessor", "LogitsWarper"})
# Engines that call the function they are built from once per iteration, with the batch as
# the loader gave it (ignite's `Engine(process_function)`).
_ENGINES = frozenset({"Engine", "DeterministicEngine"})


#: the seed that says a method runs on an instance the caller moved (not a parameter name:
#: only the module's own buffers and parameters follow it, not every value of ``self``)
MOVED_SELF = "<moved self>"


@dataclass(frozen=True, slots=True)
class PerBatch:
    """A function that runs once per batch: why, what its parameters hold, whether it is part
    of a training step (a loop that calls ``.backward()``)."""

    how: str
    seeds: dict[str, Fact]
    trains: bool
    #: found by the function's own body (a whole training step), not by its callers: what
    #: its parameters hold is unknown
    itself: bool = False
    #: found through a model's ``forward`` three calls or more from the batch loop: it counts
    #: only for the device values handed down that far, not as part of a training step
    far: bool = False
    #: a module's own ``forward``, found by no caller, in a project that runs models: its
    #: explicit reads (``.item()``, ``.cpu()``) count as a training step's would, whatever
    #: the value is
    forward: bool = False


def find_per_batch(
    facts: FileFacts, function: ast.FunctionDef | ast.AsyncFunctionDef, depth: int
) -> PerBatch | None:
    """Whether ``function`` runs once per batch (see :meth:`~.files.FileFacts.per_batch`)."""
    if function.name in _TRAINER_HOOKS and _trainer_hook(facts, function):
        # `compute_loss(self, model, inputs)` of a `Trainer` subclass: the Trainer calls it
        # on every training step (and evaluation batch) with the inputs it moved
        seeds = {
            name: Fact("device", name, "placed on the device by the training framework")
            for name in ("model", "inputs")
        }
        how = f"`{function.name}` runs once per batch (a `Trainer` hook)"
        return PerBatch(how, seeds, True)
    if openmmlab_step(facts, function):
        params = [a.arg for a in function.args.args]
        if function.name in _MM_ITER_HOOKS:
            # `after_train_iter(self, runner, batch_idx, data_batch, outputs)` of a hook: the
            # runner calls it around every iteration, `outputs` what the step returned
            seeds = {
                name: Fact("device", name, "what the step returned, handed on by the runner")
                for name in params
                if name == "outputs"
            }
            how = f"`{function.name}` runs once per iteration (an OpenMMLab hook)"
            return PerBatch(how, seeds, "_train_" in function.name)
        # `loss(self, feats, batch_data_samples)` of an OpenMMLab model or head: the runner's
        # `train_step` runs it on every iteration, with the features computed on the device
        seeds = {
            name: Fact("device", name, "computed on the device by the model's forward")
            for name in params[1:2]
        }
        how = f"`{function.name}` runs once per batch (OpenMMLab's training step)"
        return PerBatch(how, seeds, True)
    if (
        function.name in _STEP_HOOKS
        and _is_hook(facts, function)
        and (function.name in _LIGHTNING_STEPS or _framework_step(facts, function))
    ):
        params = [a.arg for a in function.args.args]
        seeds = {}
        if len(params) > 1:
            seeds[params[1]] = Fact(
                "device", params[1], "moved to the device by the training framework"
            )
        how = f"`{function.name}` runs once per batch (a training-framework hook)"
        seeds = _framework_moved(facts, function, seeds)
        return PerBatch(how, seeds, function.name in _TRAINING_STEPS)
    cls = facts.parent.get(id(function))
    if (
        function.name in {"forward", "backward"}
        and isinstance(cls, ast.ClassDef)
        and is_autograd_function(cls, facts.qualname)
    ):
        how = f"`{function.name}` of an autograd `Function` runs each time a model applies it"
        return PerBatch(how, {}, False)
    if function.name == "step" and _optimizer_class(facts, function):
        how = "an optimizer's `step` runs once per batch (a training step)"
        # what it reads comes from its parameter groups, the model's parameters, wherever
        # the model runs: not the values of unknown place a step's own body is handed
        return PerBatch(how, {}, True)
    if function.name in _STEP_END_HOOKS and _is_hook(facts, function):
        params = [a.arg for a in function.args.args]
        seeds = {
            name: Fact("device", name, "what the step returned, handed on by the framework")
            for name in params[1:2]
        }
        how = f"`{function.name}` runs once per batch (a training-framework hook)"
        return PerBatch(how, seeds, function.name == "training_step_end")
    if function.name in _BATCH_HOOKS and _is_hook(facts, function):
        seeds = {
            a.arg: Fact("device", a.arg, "handed to the hook by the training framework")
            for a in function.args.args
            if a.arg in _HOOK_ARGUMENTS
        }
        how = f"`{function.name}` runs once per batch (a training-framework hook)"
        trains = not function.name.startswith(("on_validation", "on_test", "on_predict"))
        return PerBatch(how, _framework_moved(facts, function, seeds), trains)
    if function.name == "__call__" and decode_hook(facts, function):
        cls = facts.parent[id(function)]
        assert isinstance(cls, ast.ClassDef)
        seeds = {
            a.arg: Fact("device", a.arg, "handed to the hook by `generate`, on the model's device")
            for a in function.args.args[1:3]
            if a.annotation is None or "Tensor" in ast.unparse(a.annotation)
        }
        how = f"`{cls.name}.__call__` runs once per generated token (a `generate` hook)"
        return PerBatch(how, seeds, False)
    if engine_step(facts, function.name):
        how = f"`{function.name}` is an `Engine`'s process function, run once per iteration"
        return PerBatch(how, {}, calls_backward(function))
    result: PerBatch | None = None
    if call_words(facts).called.get(function.name, 0) > 1:
        result = _from_callers(facts, function, depth, facts, None)
    if result is None and depth == 0 and facts.parent.get(id(function)) is facts.tree:
        result = _from_importers(facts, function)
    if result is None and (depth < 3 or function.name in _RUN_METHODS):
        # a model's `forward` run by the batch loop, three calls above a helper of a
        # submodule's `forward` (`get_mask_from_lengths(lengths)` in a decoder)
        result = _from_instances(facts, function, depth)
        if result is not None and depth >= 3:
            result = _helper_step(replace(result, far=True))
    if result is None and depth <= 1:
        result = _from_base_loop(facts, function)
    if result is None and depth <= 1:
        result = _from_base_calls(facts, function, depth)
    if result is None and depth <= 1 and function.name == "forward":
        result = _from_base_fit(facts, function)
    if result is not None and has_own_batch_loop(function):
        result = None
    if (
        result is None
        and depth <= 1
        and (steps_optimizer(function) or _class_step(facts, function))
    ):
        # the step itself, or a helper it calls (found at depth 1); a deeper chain runs on
        # branches of the step's own (`if self.cache is None or self.step < warmup:`)
        how = f"`{function.name}` runs one training step (`.backward()` and an optimizer step)"
        result = PerBatch(how, {}, True, itself=True)
    if result is None and depth == 0:
        helper = _step_helper(facts, function)
        if helper is not None:
            how = (
                f"`{function.name}` runs one training step (its `self.{helper}(...)` calls "
                "`.backward()` and an optimizer step)"
            )
            result = PerBatch(how, {}, True, itself=True)
    return result


def _class_step(facts: FileFacts, function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A method that steps an optimizer outside any loop of its own, in a class another method
    of which backpropagates (a mixed-precision trainer's ``backward(loss)`` calling
    ``loss.backward()``, or its ``forward_backward(batch)`` doing so per micro-batch, and its
    ``optimize(opt)`` calling ``opt.step()``): one training step split in methods, and each
    call of the one that steps is one step of training."""
    cls = facts.parent.get(id(function))
    if not isinstance(cls, ast.ClassDef) or not step_parts(function)[1]:
        return False
    return any(
        isinstance(item, _FUNCTIONS) and item is not function and calls_backward(item)
        for item in cls.body
    )


def _step_helper(facts: FileFacts, function: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The method of the class (or of a base class, in this file or a module of the linted
    tree) that ``function`` calls on ``self`` outside any loop of its own and that is one
    whole training step by its body: an agent's ``learn()`` computing the loss, then
    ``self.take_optimisation_step(optimizer, net, loss)`` of its base class. Each call of
    ``function`` is one training step too."""
    cls = facts.parent.get(id(function))
    if not isinstance(cls, ast.ClassDef):
        return None
    own, _ = _split_own(list(function.body))
    names = {
        call.func.attr
        for call in own
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id == "self"
        and call.func.attr != function.name
    }
    for name in sorted(names):
        method = _method_of(facts, cls, name)
        if method is not None and steps_optimizer(method):
            return None if has_own_batch_loop(function) else name
    return None


def _method_of(
    facts: FileFacts, cls: ast.ClassDef, name: str
) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The method ``name`` of ``cls`` or of its bases, two classes up at most: a base of this
    file, or one imported from a module of the linted tree."""
    for owner in (cls, *(base for _, base in _bases(facts, cls))):
        for item in owner.body:
            if isinstance(item, _FUNCTIONS) and item.name == name:
                return item
    return None


def _bases(
    facts: FileFacts, cls: ast.ClassDef, depth: int = 0
) -> Iterator[tuple[FileFacts, ast.ClassDef]]:
    """The bases of ``cls``, two classes up at most: classes of this file, or classes imported
    from a module of the linted tree (as :func:`_method_of` finds them)."""
    from torchplace.lint.provenance.files import facts_for_file  # files builds on this module

    if depth >= 2:
        return
    for base in cls.bases:
        found: ast.ClassDef | None = None
        owner = facts
        if isinstance(base, ast.Name):
            found = facts.defs_class(base.id)
        if found is None:
            qualified = facts.qualname(base) or _sibling_import(facts, base)
            module, _, last = (qualified or "").rpartition(".")
            path = module_file(facts.path, module) if module else None
            owner_facts = facts_for_file(path) if path else None
            if owner_facts is not None:
                owner = owner_facts
                found = owner.defs_class(last)
        if found is not None and found is not cls:
            yield owner, found
            yield from _bases(owner, found, depth + 1)


def _sibling_import(facts: FileFacts, base: ast.expr) -> str | None:
    """``module.Name`` for a base imported from the file's own folder with ``from .module
    import Name`` where the folder is no package the resolver knows (a namespace package, no
    ``__init__.py``): the module beside the file."""
    if not isinstance(base, ast.Name):
        return None
    for node in facts.tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            for alias in node.names:
                if (alias.asname or alias.name) == base.id:
                    return f"{node.module}.{alias.name}"
    return None


def _from_base_loop(
    facts: FileFacts, function: ast.FunctionDef | ast.AsyncFunctionDef
) -> PerBatch | None:
    """A method that overrides the hook a base class calls once per item of a loader: the
    base's ``train()`` walks ``self.train_loader`` and calls ``self.train_on_batch(batch,
    i)``, which the subclass (in this file or a module of the linted tree) implements by
    moving the batch it is handed to the device, or by stepping an optimizer. The base's loop
    says nothing of the device (its own hook is abstract); the override is one step of it."""
    cls = facts.parent.get(id(function))
    if not isinstance(cls, ast.ClassDef) or facts.parent.get(id(cls)) is not facts.tree:
        return None
    params = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
    if not params or params[0] != "self":
        return None
    trains = steps_optimizer(function)
    moved = _moved_params(function, params[1:])
    if not (trains or moved):
        return None  # neither a step nor a move of what it is handed: no base is looked up
    for owner, base in _bases(facts, cls):
        for item in base.body:
            if not isinstance(item, _FUNCTIONS) or item.name == function.name:
                continue
            for loop, call in _hook_calls(item, function.name):
                handed = _handed_param(call, loop, params)
                if handed is None or not (trains or handed in moved):
                    continue
                where = "" if owner is facts else f" of {os.path.basename(owner.path)}"
                how = (
                    f"`{cls.name}.{function.name}` is the hook `{base.name}.{item.name}`{where} "
                    f"calls on each item of its loader (line {call.lineno})"
                )
                return PerBatch(how, {}, trains or calls_backward(function))
    return None


def _from_base_calls(
    facts: FileFacts, function: ast.FunctionDef | ast.AsyncFunctionDef, depth: int
) -> PerBatch | None:
    """A method that overrides one its base class (of this file or a module of the linted
    tree, two classes up at most) defines and calls on ``self`` once per batch: DPO's
    ``FSDPTrainer.clip_gradient`` overriding ``BasicTrainer.clip_gradient``, which
    ``BasicTrainer.train`` calls after every optimizer step. On an instance of the subclass
    the base's loop runs the override, so it is per batch as the base's method is."""
    cls = facts.parent.get(id(function))
    if not isinstance(cls, ast.ClassDef) or facts.parent.get(id(cls)) is not facts.tree:
        return None
    if _first_param(function) != "self" or function.name.startswith("__"):
        return None
    for owner, base in _bases(facts, cls):
        if not any(
            isinstance(item, _FUNCTIONS) and item.name == function.name for item in base.body
        ):
            continue  # an abstract hook the base only calls: `_from_base_loop`'s case
        if owner.text.count(function.name + "(") < 2:
            continue
        found = _from_callers(facts, function, depth, owner, None, base=base)
        if found is not None:
            return found
    return None


def _from_base_fit(
    facts: FileFacts, function: ast.FunctionDef | ast.AsyncFunctionDef
) -> PerBatch | None:
    """A model's ``forward`` that its own class or a base class (of this file or a module of
    the linted tree) runs on every batch: DeepCTR's ``BaseModel.fit`` binds ``model =
    self.train()`` and calls ``model(x)`` in its batch loop, so each ``DIEN.forward`` is one
    step of that loop, with the batch the loop moved; a Lightning module's ``training_step``
    runs ``self(inputs, sizes)`` on the batch the framework moved."""
    cls = facts.parent.get(id(function))
    if not isinstance(cls, ast.ClassDef) or facts.parent.get(id(cls)) is not facts.tree:
        return None
    for owner, base in [(facts, cls), *_bases(facts, cls)]:
        for item in base.body:
            if not isinstance(item, _FUNCTIONS) or item.name in _RUN_METHODS:
                continue
            for alias in sorted(_self_aliases(item)):
                for scope, call, loops in owner.calls_of(alias):
                    if scope is not item or not isinstance(call.func, ast.Name):
                        continue
                    found = _runs_model(owner, item, call, loops)
                    if found is None:
                        continue
                    outer, trains, where = found
                    seeds = {
                        param: fact
                        for param, fact in owner.arg_facts(
                            call, function, item, outer, bound=True
                        ).items()
                        if fact.on_device
                    }
                    in_file = "" if owner is facts else f" of {os.path.basename(owner.path)}"
                    how = (
                        f"`{cls.name}.forward` runs in {where} `{base.name}.{item.name}`"
                        f"{in_file} (line {call.lineno})"
                    )
                    return PerBatch(how, seeds, trains)
    return None


def _runs_model(
    owner: FileFacts,
    method: ast.FunctionDef | ast.AsyncFunctionDef,
    call: ast.Call,
    loops: tuple[ast.AST, ...],
) -> tuple[dict[str, Fact], bool, str] | None:
    """``(seeds, trains, where)`` when ``call`` (the model run on itself) runs once per batch:
    in a batch loop of ``method`` (not under a branch taken on few steps), or in a
    training-framework hook outside any loop."""
    batch = [
        loop
        for loop in loops
        if (k := owner.loop_kind(loop, method)) is not None and k[0] == "batch"
    ]
    if batch:
        if _in_rare_branch(loops, batch):
            return None
        return {}, any(calls_backward(loop) for loop in batch), "the batch loop of"
    if loops or method.name not in _STEP_HOOKS or not _is_hook(owner, method):
        return None
    hook = owner.per_batch(method, 1)
    if hook is None:
        return None
    return hook.seeds, hook.trains, "the per-batch hook"


def _self_aliases(method: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """``self`` and the names ``method`` binds to the instance itself: ``model = self`` or
    ``model = self.train()`` (``train`` and ``eval`` hand back the module they set)."""
    if _first_param(method) != "self":
        return set()
    found = {"self"}
    for node in own_nodes(method):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target, value = node.targets[0], node.value
        if (
            isinstance(value, ast.Call)
            and not value.args
            and not value.keywords
            and isinstance(value.func, ast.Attribute)
            and value.func.attr in {"train", "eval"}
        ):
            value = value.func.value  # `self.train()` hands back the module itself
        if isinstance(target, ast.Name) and isinstance(value, ast.Name) and value.id == "self":
            found.add(target.id)
    return found


def _hook_calls(
    method: ast.FunctionDef | ast.AsyncFunctionDef, name: str
) -> Iterator[tuple[ast.For | ast.AsyncFor, ast.Call]]:
    """``self.name(...)`` calls in ``method``'s loops over a loader, not under a branch taken
    on few steps (``if step % n == 0:``)."""

    def visit(
        body: list[ast.stmt], loop: ast.For | ast.AsyncFor | None
    ) -> Iterator[tuple[ast.For | ast.AsyncFor, ast.Call]]:
        for stmt in body:
            if isinstance(stmt, (*_FUNCTIONS, ast.ClassDef)):
                continue
            if isinstance(stmt, ast.If) and loop is not None and _rare_condition(stmt.test, method):
                continue
            inner = loop
            if isinstance(stmt, (ast.For, ast.AsyncFor)) and _iterates_batches(stmt):
                inner = stmt
            blocks = _blocks(stmt)
            if inner is not None and not blocks:
                for sub in walk(stmt):
                    if (
                        isinstance(sub, ast.Call)
                        and isinstance(sub.func, ast.Attribute)
                        and sub.func.attr == name
                        and isinstance(sub.func.value, ast.Name)
                        and sub.func.value.id == "self"
                    ):
                        yield inner, sub
            for block in blocks:
                yield from visit(block, inner)

    yield from visit(list(method.body), None)


def _blocks(stmt: ast.stmt) -> list[list[ast.stmt]]:
    """The statement lists nested in ``stmt`` (bodies, ``else`` blocks, handlers)."""
    out: list[list[ast.stmt]] = []
    for field in ("body", "orelse", "finalbody"):
        block = getattr(stmt, field, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            out.append(block)
    for handler in getattr(stmt, "handlers", []):
        out.append(handler.body)
    return out


def _handed_param(call: ast.Call, loop: ast.For | ast.AsyncFor, params: list[str]) -> str | None:
    """The override's parameter that receives an item the loop walks (``batch`` of ``for i,
    batch in enumerate(loader)``), by position (after ``self``) or by keyword."""
    targets = set(_target_names(loop.target))
    for index, arg in enumerate(call.args):
        if isinstance(arg, ast.Name) and arg.id in targets and index + 1 < len(params):
            return params[index + 1]
    for kw in call.keywords:
        if isinstance(kw.value, ast.Name) and kw.value.id in targets and kw.arg in params:
            return kw.arg
    return None


def _moved_params(function: ast.FunctionDef | ast.AsyncFunctionDef, params: list[str]) -> set[str]:
    """The parameters the function moves (or an item of) to a device: ``batch["image"].to(d)``."""
    return {
        root
        for sub in walk(function)
        if isinstance(sub, ast.Call)
        and _is_move_call(sub)
        and isinstance(sub.func, ast.Attribute)
        and (root := _chain_root(sub.func.value)) in params
        and not _is_cpu(_device_target(sub))
    }


def _is_hook(facts: FileFacts, function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A step hook is a method the framework calls with one batch; a module-level
    ``def test_step(data_loader, model, ...)`` of a tutorial is the file's own function (it
    may loop over the whole loader), found per batch only through its callers."""
    return isinstance(facts.parent.get(id(function)), ast.ClassDef)


def _framework_moved(
    facts: FileFacts, function: ast.FunctionDef | ast.AsyncFunctionDef, seeds: dict[str, Fact]
) -> dict[str, Fact]:
    """``seeds``, and the hook's own module moved (its buffers on the device) when its class
    is an ``nn.Module`` (a Lightning module, not a callback): the framework moved it."""
    cls = facts.parent.get(id(function))
    if not (isinstance(cls, ast.ClassDef) and facts.resolver.is_module_class(cls)):
        return seeds
    moved = Fact("device", "self", "moved to the device by the training framework")
    return {**seeds, MOVED_SELF: moved}


def _optimizer_class(facts: FileFacts, function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A method of a class derived from ``torch.optim.Optimizer`` (LARS, a project's own
    optimizer): its ``step`` is called once per training step."""
    cls = facts.parent.get(id(function))
    return isinstance(cls, ast.ClassDef) and any(
        name == "Optimizer" or (name.startswith("torch.optim") and name.endswith(".Optimizer"))
        for name in base_names(cls, facts.qualname)
    )


def _framework_step(facts: FileFacts, function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Another trainer's step method (``train_step``, ``eval_step``, ...) its framework calls:
    not one the file itself calls only on a few steps (a trainer's ``train()`` running
    ``self.valid_step()`` under ``if not (step % self.validate_every_step):``)."""
    calls = [
        node
        for node in walk(facts.tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == function.name
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "self"
    ]
    if not calls:
        return True
    rare = kept("rare-branch-nodes", facts.tree, _in_rare_branches)
    return not all(id(call) in rare for call in calls)


def _in_rare_branches(tree: ast.AST) -> frozenset[int]:
    """The ids of the nodes of ``tree`` in the body of an ``if`` taken on few steps."""
    return frozenset(
        id(sub)
        for node in walk(tree)
        if isinstance(node, ast.If) and rare_test(node.test)
        for stmt in node.body
        for sub in walk(stmt)
    )


def openmmlab_step(facts: FileFacts, function: ast.AST) -> bool:
    """``function`` is the training method (``loss``, ``forward_train``) or an iteration
    hook (``before_train_iter``, ``after_val_iter``, ...) of a class in a file that imports an
    OpenMMLab package (``mmengine``, ``mmdet``, ``mmpose``, ...): the runner calls it on every
    iteration."""
    if not (
        isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
        and function.name in _MM_LOSS_HOOKS | _MM_ITER_HOOKS
        and isinstance(facts.parent.get(id(function)), ast.ClassDef)
        and len(function.args.args) >= 2
    ):
        return False
    return any(name.split(".")[0] in _MM_PACKAGES for name in facts.resolver.names.values())


def _trainer_hook(facts: FileFacts, function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A method of a class derived from a trainer (``class RewardTrainer(Trainer):``, a base
    named ``...Trainer``) with the Hugging Face signature, ``(self, model, inputs, ...)``."""
    cls = facts.parent.get(id(function))
    if not isinstance(cls, ast.ClassDef):
        return False
    params = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
    if params[1:3] != ["model", "inputs"]:
        return False
    return any((dotted_name(base) or "").endswith("Trainer") for base in cls.bases)


def decode_hook(facts: FileFacts, function: ast.AST) -> bool:
    """``function`` is ``__call__`` of a stopping criterion or logits processor (``class
    StopOnTokens(StoppingCriteria)``): ``generate`` calls it once per generated token, with
    the ids and scores on the model's device."""
    cls = facts.parent.get(id(function))
    return (
        getattr(function, "name", None) == "__call__"
        and isinstance(cls, ast.ClassDef)
        and any(
            name.rpartition(".")[2] in _DECODE_HOOKS for name in base_names(cls, facts.qualname)
        )
    )


@dataclass(frozen=True, slots=True)
class CallWords:
    """What a file's text says of its names, read in one pass: how often each is followed by
    ``(`` (called, or defined), and which are followed by ``)`` or ``,`` (handed on). Asking
    the text once per function made a file of 10,000 functions take 5 s."""

    called: dict[str, int]
    handed: frozenset[str]


_WORD_BEFORE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)([(),])")


def call_words(facts: FileFacts) -> CallWords:
    """The :class:`CallWords` of ``facts``' file, found once per file."""
    return kept("call-words", facts.tree, lambda _: _read_call_words(facts.text))


def _read_call_words(text: str) -> CallWords:
    called: dict[str, int] = {}
    handed: set[str] = set()
    for match in _WORD_BEFORE.finditer(text):
        word, mark = match.groups()
        if mark == "(":
            called[word] = called.get(word, 0) + 1
        else:
            handed.add(word)
    return CallWords(called, frozenset(handed))


def engine_step(facts: FileFacts, name: str) -> bool:
    """``name`` is handed to an engine of the file as its process function: ``trainer =
    Engine(train_step)`` calls ``train_step(engine, batch)`` once per iteration."""
    if name not in call_words(facts).handed:
        return False
    return any(
        call.args and isinstance(call.args[0], ast.Name) and call.args[0].id == name
        for engine in _ENGINES
        for _, call, _ in facts.calls_of(engine)
    )


def _from_importers(
    facts: FileFacts, function: ast.FunctionDef | ast.AsyncFunctionDef
) -> PerBatch | None:
    """Calls of a module-level function from sibling modules (``utils.f(...)``)."""
    for others, stem in _importers(facts, function.name):
        found = _from_callers(others, function, 1, others, f"{stem}.{function.name}")
        if found is not None:
            return found
    return None


def imported_by_siblings(facts: FileFacts, name: str) -> bool:
    """A module beside ``facts``'s file (or one folder up) calls ``name(`` and names the
    module: ``greedy_generate(model, ...)`` in ``run_streaming.py`` after ``from
    utils.streaming import greedy_generate``."""
    return any(True for _ in _importers(facts, name))


def _importers(facts: FileFacts, name: str) -> Iterator[tuple[FileFacts, str]]:
    """The sibling modules that may import ``name`` from ``facts``'s file (their text calls
    ``name(`` and mentions the module), with that module's name."""
    from torchplace.lint.provenance.files import facts_for_file  # files builds on this module

    if not os.path.isfile(facts.path):
        return
    here = os.path.abspath(facts.path)
    stem = _module_stem(here)
    for other in _mentioning(here):
        text = _text_of(other)
        if text is None or (name + "(" not in text and name + " as " not in text):
            continue
        others = facts_for_file(other)
        if others is not None:
            yield others, stem


@lru_cache(maxsize=64)
def _mentioning(here: str) -> tuple[str, ...]:
    """The siblings of the file at ``here`` whose text names its module (found once per file,
    not once per function of it)."""
    stem = _module_stem(here)
    found = [
        other
        for other in _siblings(os.path.dirname(here))
        if other != here and stem in (_text_of(other) or "")
    ]
    package = os.path.basename(os.path.dirname(here))
    if stem != package:
        # a module of a sibling package that imports this one by its package's name
        # (`from maskrcnn_benchmark.utils.metric_logger import MetricLogger` in `engine/`)
        dotted, relative = f"{package}.{stem}", f"{package} import "
        for other in _cousins(os.path.dirname(here)):
            text = _text_of(other) or ""
            if dotted in text or (relative in text and stem in text):
                found.append(other)
    return tuple(found)


# Sibling packages with more modules than this in all are not searched for importers.
_MAX_COUSINS = 120
# Folders beside a package (or in one) past this are not a project's packages: not searched.
_MAX_FOLDERS = 40


@lru_cache(maxsize=64)
def _cousins(directory: str) -> tuple[str, ...]:
    """The modules of the packages beside the package folder ``directory``, and of their
    subpackages (``pkg/engine/*.py`` and ``pkg/models/diffusion/*.py`` for ``pkg/utils``),
    namespace packages too (folders without ``__init__.py``), if there are few."""
    parent = os.path.dirname(directory)
    found: list[str] = []
    folders = _folders(parent)
    if len(folders) > _MAX_FOLDERS:
        return ()  # not a project's package folder (a home or a cache of many projects)
    for place in folders:
        if place == directory:
            continue
        inner = _folders(place)
        for sub in (place, *(inner if len(inner) <= _MAX_FOLDERS else ())):
            found.extend(_python_files(sub))
        if len(found) > _MAX_COUSINS:
            return ()
    return tuple(found)


def _folders(place: str) -> list[str]:
    """The folders in ``place`` that may be packages (not hidden, not ``__pycache__``)."""
    try:
        names = sorted(os.listdir(place))
    except OSError:
        return []
    return [
        os.path.join(place, n)
        for n in names
        if not n.startswith((".", "__")) and os.path.isdir(os.path.join(place, n))
    ]


def _module_stem(here: str) -> str:
    """The last part of the name the file at ``here`` is imported by: its stem, or for a
    package's ``__init__.py`` the package's folder (``monotonic_align.maximum_path(...)``
    calls a function of ``monotonic_align/__init__.py``)."""
    directory, filename = os.path.split(here)
    stem = filename[:-3]
    return os.path.basename(directory) if stem == "__init__" else stem


def call_sites(
    facts: FileFacts, function: ast.FunctionDef | ast.AsyncFunctionDef
) -> list[ast.Call]:
    """The calls of a module-level ``function`` in its file and in the sibling modules that
    import it (``utils.load(...)``, ``from utils import load``)."""
    found = [
        call
        for scope, call, _ in facts.calls_of(function.name)
        if scope is not function and facts.local_def(call.func, scope) is function
    ]
    for others, stem in _importers(facts, function.name):
        found += [
            call
            for _, call, _ in others.calls_of(function.name)
            if _imported_as(others, call.func, f"{stem}.{function.name}")
        ]
    return found


def scoped_call_sites(
    facts: FileFacts, function: ast.FunctionDef | ast.AsyncFunctionDef
) -> list[tuple[ast.AST, ast.Call]]:
    """:func:`call_sites`, each with the function (or module) whose body holds the call."""
    found = [
        (scope, call)
        for scope, call, _ in facts.calls_of(function.name)
        if scope is not function and facts.local_def(call.func, scope) is function
    ]
    for others, stem in _importers(facts, function.name):
        found += [
            (scope, call)
            for scope, call, _ in others.calls_of(function.name)
            if _imported_as(others, call.func, f"{stem}.{function.name}")
        ]
    return found


def _from_instances(
    facts: FileFacts, function: ast.FunctionDef | ast.AsyncFunctionDef, depth: int
) -> PerBatch | None:
    """A method of a module-level class, called on an instance: ``aug = Augment(...)``, then
    ``aug.tune(pred)`` (or ``model(x)`` for ``forward``) in a batch loop or a per-batch
    function, of this file or of a sibling module that imports the class."""
    cls = facts.parent.get(id(function))
    if not isinstance(cls, ast.ClassDef) or facts.parent.get(id(cls)) is not facts.tree:
        return None
    if function.name.startswith("__") and function.name != "__call__":
        return None
    candidates: list[tuple[FileFacts, str | None]] = [(facts, None)]
    candidates += [(others, f"{stem}.{cls.name}") for others, stem in _importers(facts, cls.name)]
    for maker in _makers(facts, cls, None):  # `model = blip_retrieval(...)`, imported from here
        candidates += [(others, f"{stem}.{maker}") for others, stem in _importers(facts, maker)]
    named: set[str] = set()  # the plain names instances get where they are made
    fallback: PerBatch | None = None
    searched: set[str] = set()
    for callers, qualified in candidates:
        searched.add(os.path.abspath(callers.path))
        instances = _instances(callers, cls, qualified)
        if not instances:
            continue
        named |= {i.rpartition(".")[2] for i in instances if ":" not in i}
        found = _from_callers(
            facts,
            function,
            depth + (1 if depth else 0),
            callers,
            None,
            instances=instances,
            method=cls.name,
        )
        if found is not None and _given(found):
            return found
        fallback = fallback or found  # per batch, given nothing known: other callers may say
    if named and function.name not in _RUN_METHODS and depth == 0:
        # the instance handed on to another module of the package, a parameter named as the
        # instance is where it is made: `log_writer = utils.TensorboardLogger(...)` in main,
        # `train_one_epoch(..., log_writer=None)` in engine calls `log_writer.update(...)`
        for others in _handed_to(facts, function.name, searched):
            found = _from_callers(
                facts,
                function,
                depth + 1,
                others,
                None,
                instances=frozenset(named),
                method=cls.name,
                parameters_only=True,
            )
            if found is not None and _given(found):
                return found
            fallback = fallback or found
    return _helper_step(fallback) if fallback is not None else None


def _helper_step(found: PerBatch) -> PerBatch:
    """A helper object's method is part of a training step only for what it is given: with no
    device argument, its unknown values (`v.item()` of a meter's `**kwargs`) may well be host
    numbers. (A model the caller moved says where its own buffers are, nothing more.)"""
    if _given(found):
        return found
    kept = {k: v for k, v in found.seeds.items() if k == MOVED_SELF}
    return PerBatch(found.how, kept, False, far=found.far)


def _given(found: PerBatch) -> bool:
    """Device values among the arguments (not only the moved instance itself)."""
    return any(key != MOVED_SELF for key in found.seeds)


def _handed_to(facts: FileFacts, method: str, searched: set[str]) -> Iterator[FileFacts]:
    """The sibling modules, not searched yet, that name ``facts``'s module and call
    ``x.method(...)``."""
    from torchplace.lint.provenance.files import facts_for_file  # files builds on this module

    if not os.path.isfile(facts.path):
        return
    needle = f".{method}("
    for other in _mentioning(os.path.abspath(facts.path)):
        if other in searched:
            continue
        text = _text_of(other)
        if text is None or needle not in text:
            continue
        others = facts_for_file(other)
        if others is not None:
            yield others


_RUN_METHODS = frozenset({"forward", "__call__"})


def _instances(callers: FileFacts, cls: ast.ClassDef, qualified: str | None) -> frozenset[str]:
    """The names (``aug``, ``self.trainer``) ``callers`` binds to a new instance of ``cls``
    (``qualified``: as imported from another module; ``None``: this file's own class), found
    once per class and file."""
    key = (id(cls), qualified)
    found = callers.instances.get(key)
    if found is None:
        found = callers.instances[key] = _find_instances(callers, cls, qualified)
    return found


def _find_instances(callers: FileFacts, cls: ast.ClassDef, qualified: str | None) -> frozenset[str]:
    made = _made(callers, cls, qualified)
    names: set[str] = set()
    for node in made:
        for target in node.targets:
            name = dotted_name(target)
            if name is not None:
                names.add(name)
                names.add(f"{node.lineno}:{name}")  # which assignment: see `_on_instance`
    return frozenset(names)


def _made(callers: FileFacts, cls: ast.ClassDef, qualified: str | None) -> list[ast.Assign]:
    """The assignments of ``callers`` that bind a new instance of ``cls``: built by the class
    (``qualified``: as imported), by a maker function of ``callers``, or, when ``qualified``
    names a maker function of the class's own module instead (``models.blip_retrieval.
    blip_retrieval``), by a call of that function imported."""
    from torchplace.lint.provenance.files import constructed  # files builds on this module

    if qualified is not None and qualified.rpartition(".")[2] != cls.name:
        maker = qualified.rpartition(".")[2]
        return [
            node
            for node in callers.assigned_calls(maker)
            if isinstance(node.value, ast.Call)
            and _imported_as(callers, constructed(node.value), qualified)
        ]
    if cls.name + "(" not in callers.text and cls.name + ".from_" not in callers.text:
        return []
    made = [
        node
        for node in callers.assigned_calls(cls.name)
        if isinstance(node.value, ast.Call) and _makes(callers, node.value, cls, qualified)
    ]
    for maker in _makers(callers, cls, qualified):  # `model = load_model(hparams)`
        made += callers.assigned_calls(maker)
    return made


def _makes(callers: FileFacts, call: ast.Call, cls: ast.ClassDef, qualified: str | None) -> bool:
    """``call`` builds an instance of ``cls``: ``Net(cfg).to(device)``, ``Net.from_pretrained``."""
    from torchplace.lint.provenance.files import constructed  # files builds on this module

    func = constructed(call)
    if qualified is None:
        return isinstance(func, ast.Name) and callers.defs_class(func.id) is cls
    return _imported_as(callers, func, qualified)


def _makers(callers: FileFacts, cls: ast.ClassDef, qualified: str | None) -> list[str]:
    """The module-level functions of ``callers`` whose every ``return`` hands back an instance
    of ``cls`` they build (``def load_model(hparams): model = Net(hparams).cuda(); ...;
    return model``): what they return is a ``Net`` too."""
    found = []
    for node in callers.tree.body:
        if not isinstance(node, _FUNCTIONS):
            continue
        if cls.name not in "\n".join(callers.lines[node.lineno - 1 : node.end_lineno]):
            continue
        returns = [r.value for r in own_nodes(node) if isinstance(r, ast.Return)]
        if returns and all(
            value is not None and _made_in(callers, node, value, cls, qualified)
            for value in returns
        ):
            found.append(node.name)
    return found


def _made_in(
    callers: FileFacts,
    function: ast.FunctionDef | ast.AsyncFunctionDef,
    value: ast.expr,
    cls: ast.ClassDef,
    qualified: str | None,
) -> bool:
    """``value``, returned by ``function``, builds ``cls`` or names a local bound to one."""
    if isinstance(value, ast.Call):
        return _makes(callers, value, cls, qualified)
    if not isinstance(value, ast.Name):
        return False
    return any(
        isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and any(isinstance(t, ast.Name) and t.id == value.id for t in node.targets)
        and _makes(callers, node.value, cls, qualified)
        for node in own_nodes(function)
    )


def _imported_as(callers: FileFacts, func: ast.expr, qualified: str) -> bool:
    """``func`` names ``module.Class`` through an import, or a star import of ``module``."""
    name = callers.qualname(func)
    if name is not None:
        return name.endswith(qualified)
    module, _, last = qualified.rpartition(".")
    return (
        isinstance(func, ast.Name)
        and func.id == last
        and any(star.endswith(module) for star in callers.resolver.stars)
    )


def _on_instance(
    call: ast.Call,
    scope: ast.AST,
    function: ast.FunctionDef | ast.AsyncFunctionDef,
    instances: frozenset[str],
    parameters_only: bool = False,
    callers: FileFacts | None = None,
) -> bool:
    """``aug.tune(...)`` (``aug`` bound to an instance), or ``model(...)`` for ``forward``;
    also through a parameter of the calling function named as the instance is where it is
    made (``train(loader, decoder)`` handed ``decoder = Decoder(...)``), or through a global
    the script's own statements bind to one (``criterion = FocalLoss()`` at the top level,
    called in ``train()``)."""
    func = call.func
    if function.name in _RUN_METHODS and not (
        isinstance(func, ast.Attribute) and func.attr == function.name
    ):
        receiver: ast.expr = func
    elif isinstance(func, ast.Attribute) and func.attr == function.name:
        # `aug.tune(...)`, also `model.forward(x)`: the run method named
        receiver = func.value
    else:
        return False
    name = dotted_name(receiver)
    if name is None:
        return False
    if parameters_only:  # instances made in another module: only a parameter named as they are
        if "." in name or not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        if _bound_here(scope, name) is not None:
            return False
        params = {
            a.arg for a in [*scope.args.posonlyargs, *scope.args.args, *scope.args.kwonlyargs]
        }
        return name in params and name in instances
    if "." in name:
        return name in instances  # `self.trainer`: an attribute, one per object
    if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return name in instances
    own = _bound_here(scope, name)
    if own is not None:
        return f"{own}:{name}" in instances  # `meter = Meter()` here: its own binding decides
    params = {a.arg for a in [*scope.args.posonlyargs, *scope.args.args, *scope.args.kwonlyargs]}
    if name in params:
        return any(i.rpartition(".")[2] == name for i in instances)
    return callers is not None and _global_instance(callers, name, instances)


def _global_instance(callers: FileFacts, name: str, instances: frozenset[str]) -> bool:
    """``name``, free in a function, is bound by the module's own statements only to
    instances (``criterion = FocalLoss()`` at the top level)."""
    lines = [
        stmt.lineno
        for stmt in callers.tree.body
        if any(
            isinstance(n, ast.Name) and n.id == name
            for target in store_targets(stmt)
            for n in walk(target)
        )
    ]
    return bool(lines) and all(f"{line}:{name}" in instances for line in lines)


def _bound_here(scope: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> int | None:
    """The line where ``scope`` first assigns ``name`` itself (a local, not the parameter)."""
    for node in walk(scope):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return node.lineno
    return None


def _from_callers(
    facts: FileFacts,
    function: ast.FunctionDef | ast.AsyncFunctionDef,
    depth: int,
    callers: FileFacts,
    qualified: str | None,
    *,
    instances: frozenset[str] = frozenset(),
    method: str | None = None,
    parameters_only: bool = False,
    base: ast.ClassDef | None = None,
) -> PerBatch | None:
    """``function`` as called in ``callers``: per batch when a call sits in a
    batch loop or in a per-batch function. ``qualified`` (``module.name``) matches calls from
    another file; ``None`` matches this file's own calls of the same definition; with
    ``instances``, calls of the method on those instances (``method``: the class's name); with
    ``base``, the calls ``self.name(...)`` in the methods of that base class of ``function``'s
    class, which ``function`` overrides."""
    how: str | None = None
    trains = False
    near = False  # a call site in a batch loop, or in a function found within three calls
    seeds: dict[str, Fact] = {}
    names = {i.rpartition(".")[2] for i in instances} if function.name in _RUN_METHODS else set()
    if names:
        names.add(function.name)  # `model.forward(x)` as well as `model(x)`
    if qualified is not None and not instances:
        # `from train.metrics import accuracy_SBM as accuracy`: called by its alias
        names = {function.name} | {
            local
            for local, full in callers.resolver.names.items()
            if (full == qualified or full.endswith("." + qualified)) and local != function.name
        }
    sites = [site for name in sorted(names or {function.name}) for site in callers.calls_of(name)]
    for scope, call, loops in sites:
        if scope is function:
            continue
        if base is not None:
            if callers.parent.get(id(scope)) is not base or not _on_self(call, function):
                continue
        elif instances:
            if not _on_instance(call, scope, function, instances, parameters_only, callers):
                continue
        elif qualified is None:
            if callers.local_def(call.func, scope) is not function:
                continue
        elif not _matches(callers, call.func, qualified):
            continue
        outer: dict[str, Fact] | None = None
        batch = [
            loop
            for loop in loops
            if (k := callers.loop_kind(loop, scope)) is not None and k[0] == "batch"
        ]
        if _in_rare_branch(loops, batch) or _after_remainder_guard(scope, call):
            continue  # `if step % eval_every == 0: evaluate(...)`: not once per batch
        caller = getattr(scope, "name", "<module>")
        where_file = "" if callers is facts else f" of {os.path.basename(callers.path)}"
        called = function.name if method is None else f"{method}.{function.name}"
        if batch:
            outer = {}
            near = True
            trains = trains or any(calls_backward(loop) for loop in batch)
            where = (
                f"`{called}` is called in the batch loop of `{caller}`{where_file} "
                f"(line {call.lineno})"
            )
        else:
            above = callers.per_batch(scope, depth + 1)
            if above is None:
                continue
            outer = above.seeds
            near = near or not above.far
            trains = trains or above.trains
            where = (
                f"`{called}` is called by `{caller}`{where_file} (line {call.lineno}), "
                "which runs once per batch"
            )
        how = how or where
        bound = bool(instances)
        for param, fact in callers.arg_facts(call, function, scope, outer, bound=bound).items():
            if fact.on_device:
                seeds.setdefault(param, fact)
        if bound and MOVED_SELF not in seeds and _first_param(function) == "self":
            # `model.get_step()` on a model the caller moved: its buffers live there too
            receiver = call.func.value if isinstance(call.func, ast.Attribute) else call.func
            if function.name in _RUN_METHODS:
                receiver = call.func
            moved = callers.fact(receiver, scope, outer)
            if moved is not None and moved.on_device:
                seeds[MOVED_SELF] = moved
            elif outer and MOVED_SELF in outer and _submodule(receiver, facts, function):
                seeds[MOVED_SELF] = outer[MOVED_SELF]  # `self.ema(...)`: moved with its owner
        elif outer and MOVED_SELF in outer and _on_self(call, function):
            seeds.setdefault(MOVED_SELF, outer[MOVED_SELF])
    if how is None:
        return None
    found = PerBatch(how, seeds, trains, far=not near)
    return _helper_step(found) if found.far else found


def _submodule(
    receiver: ast.expr, facts: FileFacts, function: ast.FunctionDef | ast.AsyncFunctionDef
) -> bool:
    """``receiver`` is ``self.<name>``, and ``function`` a method of an ``nn.Module`` class:
    the instance is a submodule of the caller's module (``self.ema = LitEma(self.model)``),
    which moving that module moves too."""
    cls = facts.parent.get(id(function))
    return (
        isinstance(receiver, ast.Attribute)
        and isinstance(receiver.value, ast.Name)
        and receiver.value.id == "self"
        and isinstance(cls, ast.ClassDef)
        and facts.resolver.is_module_class(cls)
    )


def _on_self(call: ast.Call, function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """``self._dequeue_and_enqueue(k)`` in ``MoCo.forward``: the method runs on the same
    instance as its caller, so a module the caller's callers moved is moved for it too."""
    func = call.func
    return (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == "self"
        and _first_param(function) == "self"
    )


def _first_param(function: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    params = [*function.args.posonlyargs, *function.args.args]
    return params[0].arg if params else None


def _matches(callers: FileFacts, func: ast.expr, qualified: str) -> bool:
    """``func`` is ``module.name`` imported into ``callers`` (also by ``from module import *``)."""
    return _imported_as(callers, func, qualified)


def _rare_branch(stmt: ast.stmt, scope: ast.AST, loops: tuple[ast.AST, ...]) -> bool:
    return (
        isinstance(stmt, ast.If)
        and (
            _rare_condition(stmt.test, scope)
            or _chosen_step(stmt.test, scope, loops)
            or restarts_mark(stmt)
        )
        and not branch_trains(stmt)
    )


def _chosen_step(test: ast.expr, scope: ast.AST, loops: tuple[ast.AST, ...]) -> bool:
    """``if iteration in upsamp_list:`` with ``iteration`` the counter of the innermost
    enclosing loop (TensoRF's ``for iteration in pbar:``) and the chosen steps a value that
    loop never binds: a few steps of the run (not ``in range(n)``, which may hold on every
    step)."""
    if not (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.In)
        and isinstance(test.left, ast.Name)
    ):
        return False
    chosen = test.comparators[0]
    if (
        isinstance(chosen, ast.Call)
        and call_name(chosen) in {"range", "trange"}
        and len(chosen.args) < 3
    ):
        return False
    loop = next((n for n in reversed(loops) if isinstance(n, (ast.For, ast.AsyncFor))), None)
    if loop is None or test.left.id not in counter_names(loop, scope):
        return False
    bound = {
        name
        for sub in walk(loop)
        if isinstance(sub, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor))
        for target in (sub.targets if isinstance(sub, ast.Assign) else [sub.target])
        for name in _target_names(target)
    }
    return not {n.id for n in walk(chosen) if isinstance(n, ast.Name)} & bound


def _rare_condition(test: ast.expr, scope: ast.AST) -> bool:
    """:func:`~.loops.rare_test`, a periodic flag, or ``or`` of such tests (``if epoch_eval
    or step_eval:``, each true on few steps)."""
    if (
        isinstance(test, ast.BoolOp)
        and isinstance(test.op, ast.Or)
        and all(_rare_condition(value, scope) for value in test.values)
    ):
        return True
    return rare_test(test) or _periodic_flag(test, scope)


def _periodic_flag(test: ast.expr, scope: ast.AST) -> bool:
    """``if save_fake:`` with ``save_fake = total_steps % display_freq == 0`` in the caller's
    own body: a flag computed with ``%``, or bound to another test true on few steps
    (``step_eval = interval > 0 and step % interval == 0``)."""
    flag = test.operand if isinstance(test, ast.UnaryOp) else test
    if not isinstance(flag, ast.Name):
        return False
    return any(
        isinstance(sub, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == flag.id for t in sub.targets)
        and (
            any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for n in walk(sub))
            or (isinstance(sub.value, (ast.Compare, ast.BoolOp)) and rare_test(sub.value))
        )
        for sub in own_nodes(scope)
    )


def _after_remainder_guard(scope: ast.AST, call: ast.Call) -> bool:
    """``call`` sits in the function's own body after ``if steps % self.save_every: return``
    (a truthy remainder, then leaving): it runs on one call in N (a checkpoint every N
    steps, in the step method a training loop calls)."""
    if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    guarded = False
    for stmt in scope.body:
        if guarded and any(sub is call for sub in walk(stmt)):
            return True
        test = guard_test(stmt, (ast.Return,))
        guarded = guarded or (test is not None and remainder_nonzero(test))
    return False


def _in_rare_branch(enclosing: tuple[ast.AST, ...], batch: list[ast.AST]) -> bool:
    """A rare branch (``if step % n == 0:``) inside the innermost batch loop (or anywhere,
    when the caller runs per batch itself) holds the call."""
    start = enclosing.index(batch[-1]) + 1 if batch else 0
    return any(isinstance(node, ast.If) for node in enclosing[start:])


def calls_in(facts: FileFacts, name: str) -> list[tuple[ast.AST, ast.Call, tuple[ast.AST, ...]]]:
    """Calls of ``name(...)``/``x.name(...)`` in a file: ``[(scope, call, enclosing loops)]``
    (the enclosing loops, outermost first, and the branches taken on few steps among them).

    Found from the text first: only statements whose lines hold ``name(`` are entered.
    """
    needle = name + "("
    hits: list[int] = []
    text = facts.text
    index = text.find(needle)
    number, pos = 1, 0  # the line number at `pos`, the start of a line
    while index != -1:
        number += text.count("\n", pos, index)
        start = text.rfind("\n", 0, index) + 1
        end = text.find("\n", index)
        if end == -1:
            end = len(text)
        if "def " + needle not in text[start:end]:
            hits.append(number)
        pos, number = end + 1, number + 1
        index = text.find(needle, pos)
    found: list[tuple[ast.AST, ast.Call, tuple[ast.AST, ...]]] = []
    if hits:
        _find_calls(facts.tree.body, facts.tree, (), name, hits, found)
    return found


def _find_calls(
    body: list[ast.stmt],
    scope: ast.AST,
    loops: tuple[ast.AST, ...],
    name: str,
    hits: list[int],
    found: list[tuple[ast.AST, ast.Call, tuple[ast.AST, ...]]],
) -> None:
    for position, stmt in enumerate(body):
        if loops and _tick_guard(stmt, body[position + 1 :]):
            loops = (*loops, stmt)  # what follows runs once per tick, not per step
            continue
        first, last = stmt.lineno, stmt.end_lineno or stmt.lineno
        i = bisect.bisect_left(hits, first)
        if i == len(hits) or hits[i] > last:
            continue
        if isinstance(stmt, _FUNCTIONS):
            _find_calls(stmt.body, stmt, (), name, hits, found)
            continue
        if isinstance(stmt, ast.ClassDef):
            _find_calls(stmt.body, scope, (), name, hits, found)
            continue
        rare = isinstance(stmt, _LOOPS) or _rare_branch(stmt, scope, loops)
        inner = (*loops, stmt) if rare else loops
        nested = False
        for field in ("body", "orelse", "finalbody"):
            block = getattr(stmt, field, None)
            if block and isinstance(block[0], ast.stmt):
                nested = True
                _find_calls(block, scope, inner if field == "body" else loops, name, hits, found)
        for handler in getattr(stmt, "handlers", []):
            _find_calls(handler.body, scope, loops, name, hits, found)
        for case in getattr(stmt, "cases", []):
            _find_calls(case.body, scope, loops, name, hits, found)
        heads: list[ast.AST] = (
            [stmt]
            if not nested
            else [
                getattr(stmt, f)
                for f in ("test", "iter", "items", "subject")
                if getattr(stmt, f, None)
            ]
        )
        for head in heads:
            for sub in (
                walk(head)
                if isinstance(head, ast.AST)
                else [n for item in head for n in walk(item)]
            ):
                if isinstance(sub, ast.Call):
                    func = sub.func
                    called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
                    if called == name:
                        found.append((scope, sub, loops))


def _tick_guard(stmt: ast.stmt, rest: list[ast.stmt]) -> bool:
    """``if (not done) and (cur_nimg < tick_start_nimg + every): continue`` in a loop
    (StyleGAN's training loop): the statements after it run once per tick, when the count
    passes the mark they restart (``tick_start_nimg = cur_nimg``)."""
    test = guard_test(stmt, (ast.Continue,))
    if test is None:
        return False
    values = (
        test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    )
    return any(below_restarted_mark(value, rest) for value in values)


# Directories with more modules than this are libraries: their callers are not searched.
_MAX_SIBLINGS = 40


def _python_files(place: str, scripts: bool = False) -> list[str]:
    """The ``.py`` files in the folder ``place``, by name (none when it cannot be listed);
    with ``scripts``, also its Python scripts without the suffix (a ``train`` that starts
    ``#!/usr/bin/python3``: it imports the modules beside it as a ``.py`` script would)."""
    try:
        names = sorted(os.listdir(place))
    except OSError:
        return []
    return [
        os.path.join(place, n)
        for n in names
        if n.endswith(".py")
        or (scripts and "." not in n and _python_script(os.path.join(place, n)))
    ]


def _python_script(path: str) -> bool:
    """A file that starts with a shebang naming Python."""
    data = read_neighbour(path)
    first = data[:128].partition(b"\n")[0] if data is not None else b""
    return first.startswith(b"#!") and b"python" in first


@lru_cache(maxsize=256)
def _siblings(directory: str) -> tuple[str, ...]:
    """The modules next to a file and one folder up (where its importers usually are), if
    there are few."""
    found: list[str] = []
    places = [directory, os.path.dirname(directory)]
    for place in places:
        found.extend(_python_files(place, scripts=True))
        if len(found) > _MAX_SIBLINGS:
            return ()
    return tuple(found)


@lru_cache(maxsize=256)
def _text_of(path: str) -> str | None:
    data = read_neighbour(path)
    return None if data is None else data.decode("utf-8", "replace")


def mentioning(path: str) -> tuple[str, ...]:
    """The modules beside the file at ``path`` (and of the packages beside its package) whose
    text names its module: those that may import it."""
    if not os.path.isfile(path):
        return ()
    return _mentioning(os.path.abspath(path))


def siblings(directory: str) -> tuple[str, ...]:
    """The modules in ``directory`` and one folder up, if there are few (see ``_siblings``)."""
    return _siblings(directory)


def text_of(path: str) -> str | None:
    """The text of the file at ``path`` (read once), or None when it cannot be read."""
    return _text_of(path)
