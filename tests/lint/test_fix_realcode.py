"""``torchplace lint --fix`` as it met real projects.

The fixes were run on 30 public repositories, their ``.py`` and ``.ipynb`` files, and every
changed file checked against the original: huggingface/peft, microsoft/LoRA,
salesforce/LAVIS, rasbt/deeplearning-models, coqui-ai/TTS, KellerJordan/modded-nanogpt,
rasbt/LLMs-from-scratch, lightly-ai/lightly, mrdbourke/pytorch-deep-learning,
microsoft/DeepSpeedExamples, lllyasviel/Fooocus, SafeAILab/EAGLE, NVIDIA/apex, vwxyzjn/cleanrl,
NVIDIA-AI-IOT/torch2trt, allenai/allennlp, zongyi-li/fourier_neural_operator, RUCAIBox/RecBole,
mit-han-lab/llm-awq, WongKinYiu/yolov9, yl4579/StyleTTS2, LAMDA-CL/PyCIL,
lllyasviel/ControlNet, thuml/Time-Series-Library, udacity/deep-learning-v2-pytorch,
rasbt/machine-learning-book, namisan/mt-dnn, ZQPei/deep_sort_pytorch, IST-DASLab/gptq and
FMInference/FlexLLMGen. Checked: each fixed file still parses (a notebook is still the same
JSON document, cells, outputs and metadata, and its cells parse as the notebook reader reads
them); a second ``--fix`` changes nothing; the fixed findings are gone and none is new; the
diff is the inserted text alone (line ends, BOMs, encodings, tabs, trailing whitespace and the
final newline kept). These tests hold what that found:

* ``torch.load(f, pickle_module=...)`` (Fooocus's ``ldm_patched/modules/utils.py``): torch
  refuses ``weights_only=True`` with a pickle module, so the fix broke the load;
* coqui-ai/TTS's ``TTS/utils/io.py``: ``load_fsspec(path, **kwargs)`` forwards its ``**kwargs``
  to ``torch.load``; the fixed call was reported again (a second ``--fix`` repeated the
  keyword), and its own ``load_checkpoint`` passes ``pickle_module=`` through it;
* ``torch.load((path))``: the fix went inside the parentheses, ``(path, weights_only=True)``;
* a file with a BOM or a PEP 263 cookie kept its findings marked fixable but was skipped;
* a notebook without a final newline gained one (udacity/deep-learning-v2-pytorch's
  ``project-dog-classification/dog_app.ipynb``, mrdbourke/pytorch-deep-learning's
  ``video_notebooks``); and, in constructed notebooks, one written all ASCII had every
  ``\\u00e9``-style escape in every cell rewritten, and a cell's line holding ``\\u2028`` in
  a string was split;
* one file that could not be written stopped the run with the files after it unfixed, and the
  JSON report did not say what was fixed.
"""

from __future__ import annotations

import ast
import codecs
import json
from pathlib import Path
from typing import Any

import pytest

from torchplace.cli import main
from torchplace.lint.engine import lint_bytes
from torchplace.lint.fix import fix_file_bytes
from torchplace.lint.notebook import fix_notebook, lint_notebook

LOAD = "import torch\n\n\ndef restore(path):\n    return torch.load(path)\n"
FIXED = LOAD.replace("load(path)", "load(path, weights_only=True)")


def _fix(raw: bytes) -> tuple[bytes, int]:
    return fix_file_bytes(raw, lint_bytes(raw, "m.py", select={"TPL402"}, resolve_module=False))


def test_a_custom_pickle_module_gets_no_fix_and_says_why() -> None:
    source = b"import dill, torch\nsd = torch.load(p, map_location='cpu', pickle_module=dill)\n"
    [finding] = lint_bytes(source, "m.py", select={"TPL402"}, resolve_module=False)
    assert finding.fix is None
    assert "pickle_module" in finding.message
    positional = b"import dill, torch\nsd = torch.load(p, 'cpu', dill)\n"
    [finding] = lint_bytes(positional, "m.py", select={"TPL402"}, resolve_module=False)
    assert finding.fix is None


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        ("torch.load((path))", "torch.load((path), weights_only=True)"),
        ("torch.load(((path)) )", "torch.load(((path)), weights_only=True )"),
        ("torch.load(path, )", "torch.load(path, weights_only=True, )"),
        ("torch.load(\n    path  # why\n)", "torch.load(\n    path, weights_only=True  # why\n)"),
        ("torch.load(\n    (path)\\\n)", "torch.load(\n    (path), weights_only=True\\\n)"),
    ],
)
def test_the_argument_goes_after_the_last_one_and_its_parentheses(call: str, expected: str) -> None:
    fixed, count = _fix(f"import torch\nsd = {call}\n".encode())
    assert count == 1
    assert fixed.decode() == f"import torch\nsd = {expected}\n"
    ast.parse(fixed)


@pytest.mark.parametrize(
    "encode",
    [
        lambda text: codecs.BOM_UTF8 + text.encode(),
        lambda text: text.replace("\n", "\r\n").encode(),
        lambda text: ("# -*- coding: latin-1 -*-\n# café\n" + text).encode("latin-1"),
        lambda text: text.replace("    ", "\t").rstrip("\n").encode(),
    ],
    ids=["bom", "crlf", "latin-1", "tabs-no-final-newline"],
)
def test_a_file_is_written_back_in_its_own_bytes(encode: Any) -> None:
    fixed, count = _fix(encode(LOAD))
    assert count == 1
    assert fixed == encode(FIXED)


def _notebook(source: Any, *, ascii_only: bool, newline: bool) -> bytes:
    document = {
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": ["# Café\n"]},
            {
                "cell_type": "code",
                "execution_count": 1,
                "metadata": {},
                "outputs": [{"output_type": "stream", "name": "stdout", "text": ["é\n"]}],
                "source": source,
            },
        ],
        "metadata": {"kernelspec": {"name": "python3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    text = json.dumps(document, indent=1, ensure_ascii=ascii_only)
    return (text + "\n" if newline else text).encode()


@pytest.mark.parametrize(("ascii_only", "newline"), [(True, True), (False, False)])
def test_a_notebook_changes_only_in_the_fixed_cell(ascii_only: bool, newline: bool) -> None:
    lines = ["import torch\n", "s = 'a\u2028b'\n", "sd = torch.load('m.pt')\n", "print(sd)"]
    raw = _notebook(lines, ascii_only=ascii_only, newline=newline)
    fixed, count = fix_notebook(raw, lint_notebook(raw, "nb.ipynb", select={"TPL402"}))
    assert count == 1
    lines[2] = "sd = torch.load('m.pt', weights_only=True)\n"
    assert fixed == _notebook(lines, ascii_only=ascii_only, newline=newline)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for name in ("a.py", "b.py", "c.py"):
        (tmp_path / name).write_text(LOAD)
    return tmp_path


def test_a_file_that_cannot_be_written_leaves_the_others_fixed(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write = Path.write_bytes

    def refuse_b(self: Path, data: bytes) -> int:
        if self.name == "b.py":
            raise PermissionError(13, "Permission denied", str(self))
        return write(self, data)

    monkeypatch.setattr(Path, "write_bytes", refuse_b)
    code = main(["lint", "--fix", "--select", "TPL402", "--format", "json", "--exit-zero", "."])
    out, err = capsys.readouterr()
    assert code == 1  # --exit-zero is about findings: a file left unfixed is a failure
    assert (project / "a.py").read_text() == FIXED
    assert (project / "c.py").read_text() == FIXED
    assert (project / "b.py").read_text() == LOAD
    assert "cannot fix b.py: Permission denied" in err
    assert "Traceback" not in err
    result = json.loads(out)["result"]
    assert [f["filename"] for f in result["findings"]] == ["b.py"]
    assert result["fixed"] == [{"path": "a.py", "count": 1}, {"path": "c.py", "count": 1}]


def test_a_file_named_twice_or_through_a_link_is_fixed_once(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "link.py").symlink_to(project / "a.py")
    code = main(["lint", "--fix", "--select", "TPL402", "a.py", "a.py", "link.py"])
    assert code == 0
    assert (project / "a.py").read_text() == FIXED
    assert (project / "link.py").is_symlink()
    assert "Fixed 1 finding(s) in 1 file(s)." in capsys.readouterr().err


def test_json_without_fix_has_no_fixed_list(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["lint", "--select", "TPL402", "--format", "json", "a.py"])
    assert "fixed" not in json.loads(capsys.readouterr().out)["result"]


FORWARDED = """import torch


def load_fsspec(path, map_location=None, **kwargs):
    return torch.load(path, map_location=map_location, **kwargs)


model = load_fsspec("m.pth", map_location="cpu")
"""


def test_a_load_forwarding_kwargs_is_fixed_once() -> None:
    # coqui-ai/TTS's TTS/utils/io.py: the fixed `torch.load(f, ..., **kwargs,
    # weights_only=True)` was reported again, and a second --fix repeated the keyword
    raw = FORWARDED.encode()
    fixed, count = _fix(raw)
    assert count == 1
    assert b"**kwargs, weights_only=True)" in fixed
    assert not lint_bytes(fixed, "m.py", select={"TPL402"}, resolve_module=False)
    compile(fixed, "m.py", "exec")


def test_a_caller_forwarding_a_pickle_module_gets_no_fix() -> None:
    # TTS's load_checkpoint: load_fsspec(path, ..., pickle_module=pickle_tts)
    raw = (FORWARDED + 'other = load_fsspec("o.pth", pickle_module=dill)\n').encode()
    [finding] = lint_bytes(raw, "m.py", select={"TPL402"}, resolve_module=False)
    assert finding.fix is None
    assert "pickle_module" in finding.message
