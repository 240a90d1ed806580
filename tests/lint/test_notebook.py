"""Jupyter notebooks: code cells linted as one module, IPython syntax inert, findings by cell."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from torchplace.cli import main
from torchplace.lint.notebook import fix_notebook, lint_notebook, read_notebook
from torchplace.lint.runner import lint_paths


def _cell(source: str | list[str], kind: str = "code") -> dict[str, Any]:
    cell: dict[str, Any] = {"cell_type": kind, "metadata": {}, "source": source}
    if kind == "code":
        cell.update(execution_count=None, outputs=[])
    return cell


def _notebook(*cells: dict[str, Any], language: str = "python") -> bytes:
    document = {
        "cells": list(cells),
        "metadata": {
            "kernelspec": {"display_name": "k", "language": language, "name": "k"},
            "language_info": {"name": language},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    return (json.dumps(document, indent=1) + "\n").encode()


MOVE = _cell(["import torch\n", "model = torch.nn.Linear(4, 2).cuda()\n"])
LOOP = _cell("x = torch.randn(3, 4).cuda()\nfor step in range(3):\n    loss = model(x).item()\n")


def test_cells_run_as_one_module_and_findings_sit_in_their_cell() -> None:
    raw = _notebook(_cell("# Notes\n", "markdown"), MOVE, LOOP)
    [finding] = [f for f in lint_notebook(raw, "nb.ipynb") if f.code == "TPL201"]
    assert (finding.cell, finding.line, finding.col) == (3, 3, 12)  # the markdown cell counts
    # the lines a message names are the cells' lines too
    assert "batch loop at line 2 " in finding.message
    assert "at line 2 of cell 2" in finding.message


def test_ipython_syntax_is_inert_and_keeps_every_line() -> None:
    cell = _cell(
        [
            "%load_ext autoreload\n",
            "!pip install foo\n",
            "files = !ls\n",
            "torch?\n",
            "if True:\n",
            "    %time torch.load('a.pt')\n",
            "state = torch.load('m.pt')\n",
        ]
    )
    findings = lint_notebook(_notebook(MOVE, cell), "nb.ipynb")
    assert not [f for f in findings if f.code == "TPL000"]  # it parsed
    loads = [(f.cell, f.line) for f in findings if f.code == "TPL402"]
    assert loads == [(2, 7)]  # the magic's torch.load is IPython's, not linted
    source = read_notebook(_notebook(cell)).source
    assert source.count("\n") == 7


def test_escapes_count_only_where_a_logical_line_starts() -> None:
    cell = _cell(
        [
            'message = ("loaded %s"\n',
            "           % name)\n",  # Python's %, inside the brackets
            'doc = """\n',
            "!not a shell escape\n",
            '"""\n',
            "total = 1 + \\\n",
            "    2\n",
            "state = torch.load('m.pt')\n",
        ]
    )
    source = read_notebook(_notebook(cell)).source
    assert "           % name)" in source
    crlf = _cell("total = 10 \\\r\n    %2\r\n")  # Python's %, after a CRLF continuation
    assert "    %2" in read_notebook(_notebook(crlf)).source
    assert "!not a shell escape" in source
    findings = lint_notebook(_notebook(MOVE, cell), "nb.ipynb")
    assert not [f for f in findings if f.code == "TPL000"]
    assert [(f.cell, f.line) for f in findings if f.code == "TPL402"] == [(2, 8)]


def test_cells_without_a_final_newline_keep_the_next_cells_lines() -> None:
    shell = _cell("%%bash\necho one\necho two")  # no final newline, as editors save them
    plain = _cell("x = 1\ny = 2")
    late = _cell("state = torch.load('m.pt')\n")
    findings = lint_notebook(_notebook(MOVE, shell, plain, late), "nb.ipynb")
    assert [(f.cell, f.line) for f in findings if f.code == "TPL402"] == [(4, 1)]
    assert read_notebook(_notebook(MOVE, shell, plain, late)).source.count("\n") == 2 + 3 + 2 + 1


def test_cell_magics_keep_python_bodies_only() -> None:
    shell = _cell(["%%bash\n", "python -c \"torch.load('x')\"\n"])
    timed = _cell(["%%time\n", "state = torch.load('m.pt')\n"])
    findings = lint_notebook(_notebook(MOVE, shell, timed), "nb.ipynb")
    assert [(f.cell, f.line, f.code) for f in findings if f.code == "TPL402"] == [(3, 2, "TPL402")]


def test_other_kernels_and_broken_files() -> None:
    assert lint_notebook(_notebook(LOOP, language="julia"), "nb.ipynb") == []
    [broken] = lint_notebook(b"{not json", "nb.ipynb")
    assert broken.code == "TPL001"
    assert "not JSON" in broken.message
    [deep] = lint_notebook(b"[" * 200_000 + b"]" * 200_000, "nb.ipynb")
    assert (deep.code, deep.message) == (
        "TPL001",
        "cannot read notebook: not a notebook: its JSON nests too deeply to read",
    )
    [huge] = lint_notebook(b'{"cells": [], "metadata": {"n": ' + b"9" * 5000 + b"}}", "nb.ipynb")
    assert (huge.code, "its JSON cannot be read" in huge.message) == ("TPL001", True)
    [old] = lint_notebook(b'{"worksheets": []}', "nb.ipynb")
    assert "nbformat" in old.message
    [syntax] = lint_notebook(_notebook(MOVE, _cell("x = (\n")), "nb.ipynb")
    assert (syntax.code, syntax.cell, syntax.line) == ("TPL000", 2, 1)


def test_noqa_in_a_cell() -> None:
    cell = _cell("state = torch.load('m.pt')  # noqa: TPL402\n")
    assert not [f for f in lint_notebook(_notebook(MOVE, cell), "n.ipynb") if f.code == "TPL402"]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    cell = _cell(["x = 1\n", "state = torch.load('m.pt')\n"])
    cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["kept\n"]}]
    (tmp_path / "nb.ipynb").write_bytes(_notebook(MOVE, cell))
    (tmp_path / ".ipynb_checkpoints").mkdir()
    (tmp_path / ".ipynb_checkpoints" / "nb-checkpoint.ipynb").write_bytes(_notebook(MOVE, cell))
    return tmp_path


def test_directories_find_notebooks_but_not_checkpoints(project: Path) -> None:
    result = lint_paths(["."])
    assert result.files == 1
    assert {(f.path, f.cell, f.line) for f in result.findings if f.code == "TPL402"} == {
        ("nb.ipynb", 2, 2)
    }


def test_formats_name_the_cell(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", "nb.ipynb"]) == 1
    assert "nb.ipynb:cell 2:2:9: TPL402 [*] " in capsys.readouterr().out
    main(["lint", "--json", "nb.ipynb"])
    [found] = [d for d in json.loads(capsys.readouterr().out)["result"]["findings"]
               if d["code"] == "TPL402"]  # fmt: skip
    assert found["cell"] == 2
    assert found["location"] == {"row": 2, "column": 9}
    main(["lint", "--format", "github", "nb.ipynb"])
    annotation = capsys.readouterr().out
    assert ",line=" not in annotation  # the file's lines are its JSON's
    assert "(cell 2, line 2)" in annotation


def test_fix_edits_the_cell_and_keeps_the_rest(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["lint", "--fix", "--select", "TPL402", "nb.ipynb"]) == 0
    document = json.loads((project / "nb.ipynb").read_text())
    cell = document["cells"][1]
    assert cell["source"] == ["x = 1\n", "state = torch.load('m.pt', weights_only=True)\n"]
    assert cell["outputs"][0]["text"] == ["kept\n"]
    assert document["cells"][0]["source"] == MOVE["source"]
    assert (project / "nb.ipynb").read_text().endswith("}\n")
    assert (project / "nb.ipynb").read_text().startswith('{\n "cells"')  # indented as it was
    assert "Fixed 1 finding(s) in 1 file(s)." in capsys.readouterr().err


def test_an_indented_cell_runs_as_ipython_dedents_it() -> None:
    # IPython strips the first line's indentation from every line: ` x = 1` runs; findings
    # keep the cell's own columns
    cell = _cell([" # load\n", " state = torch.load('m.pt')\n", " state\n"])
    findings = lint_notebook(_notebook(MOVE, cell), "nb.ipynb")
    assert not [f for f in findings if f.code == "TPL000"]
    [load] = [f for f in findings if f.code == "TPL402"]
    assert (load.cell, load.line, load.col) == (2, 2, 10)
    fixed, count = fix_notebook(_notebook(MOVE, cell), findings)
    assert count == 1
    assert json.loads(fixed)["cells"][1]["source"][1] == (
        " state = torch.load('m.pt', weights_only=True)\n"
    )


def test_a_continued_shell_escape_is_inert_to_its_end() -> None:
    cell = _cell(['!tts --text "hi" \\\n', "--out_path out.wav \\\n", '--language_idx "en"\n'])
    indented = _cell([' !tts --text "hi" \\\n', "      --out_path out.wav\n"])
    findings = lint_notebook(_notebook(MOVE, cell, indented), "nb.ipynb")
    assert not [f for f in findings if f.code == "TPL000"]
    assert read_notebook(_notebook(cell)).source.count("\n") == 3


def test_a_cell_that_does_not_parse_leaves_the_others_linted() -> None:
    # an exercise's `model = # TODO` fails that cell alone: the kernel runs the others
    todo = _cell("criterion = # TODO\noptimizer = # TODO\n")
    late = _cell("state = torch.load('m.pt')\n")
    findings = lint_notebook(_notebook(MOVE, todo, late), "nb.ipynb")
    assert [(f.cell, f.line, f.code) for f in findings] == [(2, 1, "TPL000"), (3, 1, "TPL402")]
    assert lint_notebook(_notebook(MOVE, todo, late), "nb.ipynb", select={"TPL402"})[0].cell == 3


@pytest.mark.parametrize(
    ("layout", "indent", "separators", "newline"),
    [
        ("tabs", "\t", None, "\n"),
        ("crlf", 1, None, "\r\n"),
        ("compact", None, (",", ":"), "\n"),
        ("one line", None, None, "\n"),
    ],
)
def test_a_fixed_notebook_keeps_the_files_layout(
    layout: str, indent: Any, separators: Any, newline: str
) -> None:
    """Only the fixed source changes: a tab-indented, CRLF or one-line notebook came back
    indented by one space with LF line ends, every line of it a change in a diff."""
    load = _cell(["import torch\n", "state = torch.load('m.pt')\n"])
    document = json.loads(_notebook(load))
    text = json.dumps(document, indent=indent, separators=separators) + "\n"
    raw = text.replace("\n", newline).encode()
    fixed, count = fix_notebook(raw, lint_notebook(raw, "nb.ipynb", select={"TPL402"}))
    assert count == 1
    document["cells"][0]["source"][1] = "state = torch.load('m.pt', weights_only=True)\n"
    expected = json.dumps(document, indent=indent, separators=separators) + "\n"
    assert fixed.decode() == expected.replace("\n", newline)


@pytest.mark.parametrize(
    "cells", [["import torch", 5, None], [{"source": "x = 1"}]], ids=["not objects", "no type"]
)
def test_cells_that_are_not_cells_make_the_notebook_unreadable(cells: list[object]) -> None:
    # reported as TPL001, not passed as clean
    raw = json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    found = lint_notebook(raw.encode(), "nb.ipynb")
    assert [f.code for f in found] == ["TPL001"]
    assert "cell 1 is" in found[0].message
