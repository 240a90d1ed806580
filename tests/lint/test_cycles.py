"""Answers that ask each other in a cycle: the same verdicts whichever is asked first."""

from __future__ import annotations

import ast
import textwrap

import pytest

from torchplace.lint.provenance import FileFacts
from torchplace.lint.provenance.cycles import answer

# `validate(model, ...)` gets the model `train` builds with `load_model`; asking first what
# `load_model` returns walks `load_model`'s callers (what `train` hands it), which asks again
# what `load_model` returns: a cycle.
TRAIN = """
import torch

def load_model(hparams):
    model = Net(hparams).cuda()
    return model

def validate(model, loader):
    for x in loader:
        loss = model(x.cuda()).sum()
        print(loss.item())

def train(hparams, loader):
    model = load_model(hparams)
    for step, x in enumerate(loader):
        model(x.cuda()).sum().backward()
        if step % 1000 == 0:
            validate(model, loader)
"""


def _facts() -> FileFacts:
    text = textwrap.dedent(TRAIN)
    return FileFacts(ast.parse(text), text.splitlines(), "<string>")


def _validate(facts: FileFacts) -> ast.FunctionDef:
    node = facts.defs["validate"][0]
    assert isinstance(node, ast.FunctionDef)
    return node


def test_what_callers_hand_does_not_depend_on_what_was_asked_first() -> None:
    direct = _facts()
    assert set(direct.given(_validate(direct))) == {"model"}
    returned_first = _facts()
    moved = returned_first.returns_device("load_model")
    assert moved is not None
    assert moved.on_device
    assert set(returned_first.given(_validate(returned_first))) == {"model"}


def test_an_answer_read_during_a_cycle_is_dropped_when_its_head_is_answered() -> None:
    cache: dict[str, str] = {}
    computed: list[str] = []

    def ask(key: str) -> str:
        if key in cache:
            return cache[key]
        return answer(cache, key, lambda: compute(key), lambda: "stand-in")

    def compute(key: str) -> str:
        computed.append(key)
        return f"{key}({ask('inner' if key == 'head' else 'head')})"

    assert ask("head") == "head(inner(stand-in))"
    assert cache == {"head": "head(inner(stand-in))"}  # the provisional "inner" is gone
    assert ask("inner") == "inner(head(inner(stand-in)))"  # again, from the head's answer
    assert cache["inner"] == "inner(head(inner(stand-in)))"
    assert computed == ["head", "inner", "inner"]


def test_an_answer_that_raises_leaves_no_question_open() -> None:
    cache: dict[str, int] = {}

    def broken() -> int:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        answer(cache, "k", broken, lambda: 0)
    assert answer(cache, "k", lambda: 7, lambda: 0) == 7
    assert cache == {"k": 7}


def test_an_answer_dropped_once_is_kept_the_next_time() -> None:
    cache: dict[str, str] = {}

    def ask(key: str) -> str:
        if key in cache:
            return cache[key]
        return answer(cache, key, lambda: compute(key), lambda: "stand-in")

    def compute(key: str) -> str:
        return f"{key}({ask('inner' if key == 'head' else 'head')})"

    ask("head")
    assert "inner" not in cache  # dropped once, when the head was answered
    del cache["head"]
    ask("head")
    # provisional again: kept this time, so that a file full of cycles is not answered again
    # and again
    assert cache["inner"] == "inner(stand-in)"
