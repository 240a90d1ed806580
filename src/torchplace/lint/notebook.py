"""Jupyter notebooks (``.ipynb``): their code cells linted as one module, the way the kernel runs
them in one namespace, and each finding placed in its cell.

A notebook's code cells are joined in order into one source, line for line, so that a model put
on the GPU in one cell and an input left on the host in a later one meet as they do when the
notebook runs. IPython's own syntax is made inert first, keeping every line where it was: a line
magic (``%timeit``, ``%load_ext``), a shell escape (``!pip ...``, ``files = !ls``) or a help
request (``x?``) that starts a logical line (not one inside brackets or a string) becomes
``pass`` at its indentation, and a cell magic (``%%bash``, ``%%writefile``) takes its whole cell
out, but for those whose body is Python (``%%time``, ``%%timeit``, ``%%capture``, ``%%prun``),
whose first line alone goes. A notebook whose kernel is not Python is skipped, and so is a code
cell its editor marks as another language (VS Code's ``metadata.vscode.languageId``, such as
``"shellscript"`` or ``"plaintext"``).

A finding's ``cell`` is the cell's 1-based position in the notebook, every cell counted
(markdown ones too, as editors number them), and its ``line`` the line in that cell. ``--fix``
edits the cells' sources and writes the notebook back laid out as the file was (JSON indented
by its spaces or tabs, by one space when it cannot tell, or all on one line; its line ends;
``\\uXXXX`` escapes in a file that is all ASCII; a final newline where it had one), outputs
and metadata untouched.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from torchplace.lint.engine import lint_source, syntax_message
from torchplace.lint.finding import Edit, Finding, Fix
from torchplace.lint.fix import apply_fixes
from torchplace.lint.nodes import parse_module
from torchplace.lint.rules import ALL_RULES

__all__ = [
    "NOTEBOOK_SUFFIX",
    "Notebook",
    "NotebookError",
    "fix_notebook",
    "lint_notebook",
    "read_notebook",
]

NOTEBOOK_SUFFIX = ".ipynb"
#: cell magics whose body is Python, run by the kernel: only their first line is IPython's
_PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun"})
#: a line IPython reads itself: a magic, a shell escape (maybe assigned), a help request (also a
#: wildcard search, ``torch.*Tensor?``), or a package magic called without its ``%``
#: (automagic: ``pip install -r requirements.txt``), or a shell magic called without its ``%``
#: on a path or name, which Python cannot read (``cd PhotoMaker/``, ``ls ../data``)
_IPYTHON_LINE = re.compile(
    r"^(?P<indent>[ \t]*)(?:[%!?]|[\w.]+\s*=\s*[%!]|[\w.*\[\]()]+\?\??\s*$"
    r"|(?:pip|conda|mamba)[ \t]+(?:install|uninstall)[ \t]"
    r"|(?:cd|ls|pushd|mkdir|rmdir|cat|cp|mv|rm|load_ext|reload_ext|matplotlib)[ \t]+"
    r"(?!(?:in|is|if|else|and|or|not|for)\b)(?:[\w~/'\"]|\.[./]|\.[ \t]*$))"
)


#: a console prompt IPython strips from a cell that starts with ``>>>`` (its classic_prompt)
_CLASSIC_PROMPT = re.compile(r"^(?:>>>|\.\.\.)(?: |$)")

#: a line a message names (``at line 12``, ``(line 3)``): of the joined source, until placed
_LINE_REF = re.compile(r"\bline (\d+)\b")


#: a line of a cell's source as nbformat stores it in a list: split after each ``\n`` only
#: (``str.splitlines`` also splits at ``\x0c``, ``\x1c`` or ``\u2028`` inside a string literal)
_SOURCE_LINE = re.compile(r"[^\n]*\n|[^\n]+")

#: the indentation of a notebook's first key: kept when it is written back
_INDENT = re.compile(rb"\{\r?\n([ \t]+)\"")


class NotebookError(ValueError):
    """The file is not a notebook this linter can read (the message says why)."""


@dataclass(frozen=True)
class _Cell:
    number: int  # 1-based position among all cells
    start: int  # its first line in the joined source (1-based)
    indent: str = ""  # the leading indentation IPython strips from the cell's lines
    shifted: frozenset[int] = frozenset()  # the cell's lines (1-based) that lost it
    last: int = 0  # its last line of code in the joined source (0: none)

    def shift(self, line: int) -> int:
        """How many columns IPython's dedent took from ``line`` of the cell."""
        return len(self.indent) if line in self.shifted else 0


@dataclass(frozen=True)
class Notebook:
    """A notebook's document, its code cells and their joined, inert-IPython source."""

    document: dict[str, Any]
    cells: tuple[_Cell, ...]
    source: str
    python: bool  # the kernel is Python (else nothing is linted)
    broken: tuple[Finding, ...] = ()  # a TPL000 per cell that does not parse (path unset)

    def place(self, finding: Finding) -> Finding:
        """``finding`` (at a line of the joined source) at its cell and the line in it."""
        cell = self._cell_of(finding.line)
        offset = cell.start - 1
        fix = finding.fix
        if fix is not None:
            fix = Fix(fix.description, _moved(fix.edits, cell))
        line = finding.line - offset
        end_line = finding.end_line - offset if finding.end_line else 0
        end_col = finding.end_col + cell.shift(end_line) if finding.end_col else 0
        message = _LINE_REF.sub(lambda match: self._line_ref(match, cell), finding.message)
        return replace(
            finding,
            cell=cell.number,
            line=line,
            col=finding.col + cell.shift(line),
            end_line=end_line,
            end_col=end_col,
            message=message,
            fix=fix,
        )

    def displayed(self, finding: Finding) -> bool:
        """A discarded transfer (TPL101) that is its cell's last statement, at the top level:
        IPython shows that value as the cell's output (``m.to(device)`` to show the copy),
        so it is not discarded."""
        if finding.code != "TPL101" or finding.col != 1:
            return False
        cell = self._cell_of(finding.line)
        return cell.last <= (finding.end_line or finding.line)

    def _line_ref(self, match: re.Match[str], home: _Cell) -> str:
        """A message's ``line N`` (of the joined source) as the line in its cell, with the
        cell's number when it is not the finding's own."""
        line = int(match.group(1))
        cell = self._cell_of(line)
        where = f"line {line - cell.start + 1}"
        return where if cell is home else f"{where} of cell {cell.number}"

    def _cell_of(self, line: int) -> _Cell:
        for cell in reversed(self.cells):
            if line >= cell.start:
                return cell
        return self.cells[0]


def _text(value: object) -> str:
    """A cell's ``source``: a string, or a list of strings to join (nbformat allows both)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(part, str) for part in value):
        return "".join(value)
    raise NotebookError("a cell's 'source' is neither a string nor a list of strings")


def _lines(source: str) -> list[str]:
    """A cell's lines (a final newline ends the last line; it does not start another)."""
    lines = source.split("\n")
    if len(lines) > 1 and not lines[-1]:
        lines.pop()
    return lines


def _inert(lines: list[str]) -> list[str]:
    """A cell's lines with IPython's syntax made ``pass``, line for line."""
    first = lines[0].lstrip()
    if first.startswith("%%"):
        magic = first[2:].split(maxsplit=1)[0] if first[2:].strip() else ""
        if magic not in _PYTHON_CELL_MAGICS:
            return [""] * len(lines)  # not Python: the whole cell goes
        lines = ["", *lines[1:]]
    out = []
    logical = _Logical()
    escaped = False  # the line before was IPython's and ended in a backslash
    for line in lines:
        match = None if logical.continued or escaped else _IPYTHON_LINE.match(line)
        if escaped:
            out.append("")  # `!tts --text "hi" \` goes on: the command's next part
        elif match is not None:
            out.append(f"{match.group('indent')}pass")
        else:
            logical.feed(line)
            out.append(line)
        escaped = (escaped or match is not None) and line.rstrip("\r").endswith("\\")
    return out


class _Logical:
    """Whether the next line continues a logical line (an open bracket or triple-quoted
    string, a trailing backslash): IPython reads its escapes only where a line starts one, so
    ``% args`` continuing a formatted string is Python's ``%``."""

    __slots__ = ("backslash", "depth", "quote")

    def __init__(self) -> None:
        self.depth = 0
        self.quote = ""  # the triple quote of a string left open
        self.backslash = False

    @property
    def continued(self) -> bool:
        return bool(self.depth or self.quote or self.backslash)

    def feed(self, line: str) -> None:
        """Scan one line: brackets outside strings and comments, strings, the backslash."""
        i, end = 0, len(line)
        self.backslash = False
        while i < end:
            if self.quote:
                close = line.find(self.quote, i)
                if close < 0:
                    return
                i, self.quote = close + 3, ""
                continue
            char = line[i]
            if char == "#":
                return
            if char in "\"'":
                if line.startswith(char * 3, i):
                    self.quote = char * 3
                    i += 3
                    continue
                i += 1
                while i < end and line[i] != char:
                    i += 2 if line[i] == "\\" else 1
            elif char in "([{":
                self.depth += 1
            elif char in ")]}":
                self.depth = max(0, self.depth - 1)
            i += 1
        self.backslash = line.rstrip("\r").endswith("\\")  # a CRLF cell keeps its \r


def _is_python(document: dict[str, Any]) -> bool:
    metadata = document.get("metadata")
    if not isinstance(metadata, dict):
        return True
    for key in ("language_info", "kernelspec"):
        info = metadata.get(key)
        if isinstance(info, dict):
            language = info.get("name" if key == "language_info" else "language")
            if isinstance(language, str):
                return language.lower() == "python"
    return True


def _python_cell(cell: dict[str, Any]) -> bool:
    """False for a code cell its editor marks as another language (VS Code's
    ``metadata.vscode.languageId``: ``"shellscript"`` for a command to paste in a terminal,
    ``"plaintext"`` for a log shown as an example): its text is not Python for the kernel."""
    metadata = cell.get("metadata")
    editor = metadata.get("vscode") if isinstance(metadata, dict) else None
    language = editor.get("languageId") if isinstance(editor, dict) else None
    return not isinstance(language, str) or language.lower() == "python"


def read_notebook(raw: bytes) -> Notebook:
    """Parse a notebook's bytes; :class:`NotebookError` when they are not a notebook."""
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise NotebookError(f"not a notebook: the file is not JSON ({exc})") from None
    except ValueError as exc:  # JSON Python cannot hold: an integer past its digit limit
        raise NotebookError(f"not a notebook: its JSON cannot be read ({exc})") from None
    except RecursionError:
        raise NotebookError("not a notebook: its JSON nests too deeply to read") from None
    cells = document.get("cells") if isinstance(document, dict) else None
    if not isinstance(cells, list):
        raise NotebookError(
            "not a notebook: no 'cells' list (nbformat 4); an nbformat 3 notebook can be "
            "upgraded with: jupyter nbconvert --to notebook --inplace FILE"
        )
    found: list[_Cell] = []
    parts: list[str] = []
    broken: list[Finding] = []
    line = 1
    for number, cell in enumerate(cells, start=1):
        if not isinstance(cell, dict) or not isinstance(cell.get("cell_type"), str):
            what = "an object without a 'cell_type'" if isinstance(cell, dict) else "not an object"
            raise NotebookError(
                f"not a notebook: cell {number} is {what} (nbformat 4 cells are objects with a "
                "'cell_type' and a 'source'); open and save it in Jupyter to repair it"
            )
        if cell["cell_type"] != "code":
            continue
        indent, lines, shifted = _dedented(_lines(_text(cell.get("source", ""))))
        lines = _inert(lines) if _python_cell(cell) else [""] * len(lines)
        code = [i for i, text in enumerate(lines) if text.strip() and text.strip()[0] != "#"]
        placed = _Cell(number, line, indent, shifted, line + code[-1] if code else 0)
        error = _syntax_error("\n".join(lines) + "\n", placed)
        if error is not None:
            broken.append(error)
            lines = [""] * len(lines)  # the kernel runs the other cells: so are they linted
        found.append(placed)
        parts.append("\n".join(lines) + "\n")
        line += len(lines)
    source = "".join(parts)
    return Notebook(document, tuple(found), source, _is_python(document), tuple(broken))


def _dedented(lines: list[str]) -> tuple[str, list[str], frozenset[int]]:
    """IPython's clean-up of a cell: the indentation of its first line that is not blank is
    taken from every line that starts with it (`` x = 1`` runs), or a console session's
    prompts (``>>> x = 1``) from its lines; with it, the lines that lost it (1-based)."""
    first = next((text for text in lines if text.strip()), "")
    indent = first[: len(first) - len(first.lstrip(" \t"))]
    if not indent and _CLASSIC_PROMPT.match(first) and first.startswith(">>>"):
        return _unprompted(lines)
    if not indent:
        return "", lines, frozenset()
    shifted = frozenset(i for i, text in enumerate(lines, start=1) if text.startswith(indent))
    out = [text[len(indent) :] if i in shifted else text for i, text in enumerate(lines, 1)]
    return indent, out, shifted


def _unprompted(lines: list[str]) -> tuple[str, list[str], frozenset[int]]:
    """IPython's clean-up of a cell pasted from a console session: a cell that starts with a
    ``>>>`` prompt loses the ``>>> `` and ``... `` prompts of all its lines (a converted
    docstring, ``>>> pipe.to("cuda")``); with the prompt and the lines (1-based) that lost it."""
    out: list[str] = []
    shifted: set[int] = set()
    for i, text in enumerate(lines, start=1):
        match = _CLASSIC_PROMPT.match(text)
        if match is not None:
            shifted.add(i)
            text = text[match.end() :]
        out.append(text)
    return ">>> ", out, frozenset(shifted)


def _syntax_error(source: str, cell: _Cell) -> Finding | None:
    """A ``TPL000`` finding, placed in ``cell``, when its inert source does not parse (an
    exercise's ``model = # TODO``): the kernel fails that cell alone."""
    try:
        parse_module(source)
    except (SyntaxError, ValueError) as exc:
        line = getattr(exc, "lineno", None) or 1
        col = (getattr(exc, "offset", None) or 1) + cell.shift(line)
        return Finding("", line, max(col, 1), "TPL000", syntax_message(exc), cell=cell.number)
    except (RecursionError, MemoryError) as exc:
        return Finding("", 1, 1, "TPL000", f"cannot parse: {type(exc).__name__}", cell=cell.number)
    return None


def fix_notebook(raw: bytes, findings: Iterable[Finding]) -> tuple[bytes, int]:
    """The notebook with the safe fixes of ``findings`` (placed in their cells) applied to its
    cells' sources, and how many were applied."""
    notebook = read_notebook(raw)
    by_cell: dict[int, list[Finding]] = {}
    for finding in findings:
        if finding.fix is not None and finding.cell:
            by_cell.setdefault(finding.cell, []).append(finding)
    cells = notebook.document["cells"]
    applied = 0
    for number, cell_findings in by_cell.items():
        cell = cells[number - 1]
        original = cell.get("source", "")
        fixed, count = apply_fixes(_text(original), cell_findings)
        if count:
            cell["source"] = fixed if isinstance(original, str) else _SOURCE_LINE.findall(fixed)
            applied += count
    if not applied:
        return raw, 0
    # As the file has it: its indentation (Jupyter's own is one space; tabs; none, all on one
    # line), \u escapes where it is all ASCII, its line ends and its final newline.
    indent = _INDENT.match(raw)
    compact = indent is None and b"\n" not in raw.strip()
    text = json.dumps(
        notebook.document,
        indent=None if compact else indent.group(1).decode() if indent else 1,
        separators=(",", ":") if compact and b'":' in raw and b'": ' not in raw else None,
        ensure_ascii=raw.isascii(),
    )
    if raw.endswith(b"\n"):
        text += "\n"
    if b"\r\n" in raw:  # the JSON text holds line breaks only between its values
        text = text.replace("\n", "\r\n")
    return text.encode("utf-8"), applied


def _moved(edits: Sequence[Edit], cell: _Cell) -> tuple[Edit, ...]:
    """``edits`` of the joined source placed in ``cell``: its lines, the columns its dedent
    took given back."""
    offset = cell.start - 1
    return tuple(
        replace(
            e,
            line=e.line - offset,
            col=e.col + cell.shift(e.line - offset),
            end_line=e.end_line - offset,
            end_col=e.end_col + cell.shift(e.end_line - offset),
        )
        for e in edits
    )


def lint_notebook(raw: bytes, path: str, *, select: Iterable[str] | None = None) -> list[Finding]:
    """Lint a notebook's bytes: its findings placed in their cells; one that cannot be read is
    a ``TPL001`` finding, never an exception; a notebook of another language has none."""
    selected = frozenset(ALL_RULES) if select is None else frozenset(select)
    try:
        notebook = read_notebook(raw)
    except NotebookError as exc:
        if "TPL001" not in selected:
            return []
        return [Finding(path, 1, 1, "TPL001", f"cannot read notebook: {exc}")]
    if not notebook.python or not notebook.cells:
        return []
    found = [
        notebook.place(f)
        for f in lint_source(notebook.source, path, select=selected)
        if not notebook.displayed(f)
    ]
    if "TPL000" in selected:
        found.extend(replace(f, path=path) for f in notebook.broken)
    return sorted(found)
