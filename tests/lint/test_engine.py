"""The engine and resolver on small sources; the import stays free of torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torchplace.lint.engine import lint_bytes, lint_source
from torchplace.lint.resolver import Resolver, module_file, module_name_for


def _resolver(source: str, module: str | None = None) -> tuple[Resolver, ast.Module]:
    tree = ast.parse(source)
    resolver = Resolver(module)
    for node in tree.body:
        if isinstance(node, ast.Import):
            resolver.add_import(node)
        elif isinstance(node, ast.ImportFrom):
            resolver.add_import_from(node)
    return resolver, tree


def _expr(source: str) -> ast.expr:
    node = ast.parse(source, mode="eval").body
    return node


def test_resolver_follows_aliases() -> None:
    resolver, _ = _resolver(
        "import torch as t\nfrom torch import zeros, nn\nimport torch.nn.functional as F\n"
    )
    assert resolver.qualname(_expr("t.zeros")) == "torch.zeros"
    assert resolver.qualname(_expr("zeros")) == "torch.zeros"
    assert resolver.qualname(_expr("nn.Module")) == "torch.nn.Module"
    assert resolver.qualname(_expr("F.relu")) == "torch.nn.functional.relu"
    assert resolver.qualname(_expr("unknown.zeros")) is None


def test_resolver_relative_imports() -> None:
    resolver, _ = _resolver("from .module import Module\n", module="torch.nn.modules.linear")
    assert resolver.qualname(_expr("Module")) == "torch.nn.modules.module.Module"


def test_resolver_relative_imports_in_a_folder_without_init() -> None:
    # `utils/callbacks.py` beside `utils/utils_bbox.py`, no `__init__.py`: its own module name
    # is its stem, and `.` is the folder it sits in (a namespace package)
    resolver, _ = _resolver(
        "from .utils_bbox import DecodeBox\nfrom . import boxes\nfrom . import *\n",
        module="callbacks",
    )
    assert resolver.qualname(_expr("DecodeBox")) == "utils_bbox.DecodeBox"
    assert resolver.qualname(_expr("boxes.nms")) == "boxes.nms"
    assert resolver.stars == []
    # two levels up from such a file is not known
    above, _ = _resolver("from ..utils_bbox import DecodeBox\n", module="callbacks")
    assert above.qualname(_expr("DecodeBox")) is None


def test_module_subclasses_direct_and_indirect() -> None:
    source = (
        "from torch import nn\n"
        "class A(nn.Module):\n    def forward(self, x):\n        return x.cuda()\n"
        "class B(A):\n    def forward(self, x):\n        return x.cuda()\n"
        "class C:\n    def forward(self, x):\n        return x.cuda()\n"
    )
    lines = [f.line for f in lint_source(source, select={"TPL102"})]
    assert lines == [4, 7]


def test_module_subclasses_through_classes_of_other_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pkg/base.py: the package's own Module; pkg/layers/__init__.py re-exports a layer of
    # pkg/layers/core.py that derives from it; pkg/layers/extra.py subclasses that layer.
    pkg = tmp_path / "pkg"
    (pkg / "layers").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "base.py").write_text("import torch.nn as nn\nclass Block(nn.Module):\n    pass\n")
    (pkg / "plain.py").write_text("class Helper:\n    pass\n")
    (pkg / "layers" / "__init__.py").write_text("from .core import Layer\n")
    (pkg / "layers" / "core.py").write_text(
        "from ..base import Block\nclass Layer(Block):\n    pass\n"
    )
    extra = pkg / "layers" / "extra.py"
    extra.write_text(
        "import torch\n"
        "from pkg.layers import Layer\n"
        "from ..plain import Helper\n"
        "class Scaled(Layer):\n"
        "    def __init__(self, scale: torch.Tensor):\n"
        "        super().__init__()\n"
        "        self.scale = scale\n"
        "    def forward(self, x):\n"
        "        return x * self.scale + torch.arange(x.shape[-1])\n"
        "class Deeper(Scaled):\n"
        "    def forward(self, x):\n"
        "        return torch.ones(x.shape[0])\n"
        "class NotAModule(Helper):\n"
        "    def forward(self, x):\n"
        "        return torch.zeros(x.shape[0])\n"
    )
    monkeypatch.chdir(tmp_path)  # a relative path: pytest's folder names say "test"
    found = lint_bytes(extra.read_bytes(), "pkg/layers/extra.py", select={"TPL103", "TPL501"})
    # forward of a module found through two files and a re-export (and of its subclass here);
    # TPL501 stays silent: a base class of another file may register what it is given
    assert [(f.line, f.code) for f in found] == [(9, "TPL103"), (12, "TPL103")]
    # without the file's place in a package (a string), the bases cannot be followed
    assert lint_source(extra.read_text(), select={"TPL103"}) == []


def test_module_name_for_package(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    assert module_name_for(str(pkg / "mod.py")) == ("pkg.sub.mod", False)
    assert module_name_for(str(pkg / "__init__.py")) == ("pkg.sub", True)


def test_noqa_comments() -> None:
    source = (
        "import torch\n"
        "a = torch.load('a', weights_only=True)  # noqa\n"
        "b = torch.load('b', weights_only=True)  # noqa: TPL401\n"
        "c = torch.load('c', weights_only=True)  # noqa: TPL402\n"
        "d = torch.load('d', weights_only=True)  # noqa: TPL4\n"
        "e = torch.load('e', weights_only=True)\n"
        "h = '# noqa'; i = torch.load('i', weights_only=True)\n"
        "j = torch.load('#j', weights_only=True)  # noqa: TPL401\n"
    )
    lines = [f.line for f in lint_source(source, select={"TPL401"})]
    assert lines == [4, 6, 7]  # a `# noqa` inside a string is text, not a comment


def test_syntax_error_and_bad_bytes_are_findings() -> None:
    [syntax] = lint_bytes(b"def f(:\n", "bad.py")
    assert (syntax.code, syntax.line) == ("TPL000", 1)
    [null] = lint_bytes(b"x = 1\x00\n", "null.py")
    assert null.code == "TPL000"
    [undecodable] = lint_bytes(b"x = '\xff\xfe'\n", "latin.py")
    assert undecodable.code == "TPL001"


def test_cookie_encoding_and_columns() -> None:
    source = "# -*- coding: latin-1 -*-\nimport torch\ns = 'é'; torch.load('é')\n"
    [finding, *_] = lint_bytes(source.encode("latin-1"), "enc.py", select={"TPL401"})
    assert (finding.line, finding.col) == (3, 10)


def test_deeply_nested_expression_does_not_crash() -> None:
    source = "import torch\nx = " + " + ".join(["torch.zeros(1).cpu()"] * 3000) + "\n"
    lint_source(source)  # no exception


_TRAIN = (
    "import torch\n"
    "model = torch.nn.Linear(2, 2).cuda()\n"
    "{before}"
    "def train(loader):\n"
    "    for x, y in loader:\n"
    "        loss = model(x.cuda()).sum()\n"
    "        loss.backward()\n"
    "        print(loss.item())\n"
    "{after}"
)


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_deeply_nested_statement_hides_nothing_else_in_its_module(where: str) -> None:
    # a generated 2,000-term sum parses, and is too deep to follow; the module's flow read
    # for `model` stopped there and the loop's finding was lost with it
    long = "x = " + " + ".join(["1"] * 2000) + "\n"
    source = _TRAIN.format(
        before=long if where == "before" else "", after="" if where == "before" else long
    )
    [finding] = lint_source(source, select={"TPL201"})
    assert "`.item()` of `loss`" in finding.message


def test_import_does_not_pull_in_torch() -> None:
    code = (
        "import sys, torchplace.lint, torchplace.lint.cli, torchplace.lint.engine\n"
        "from torchplace.lint import lint_source\n"
        "lint_source('import torch\\ntorch.load(\"x\")\\n')\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _hot_lines_one_by_one(text: str, triggers: tuple[str, ...]) -> list[int]:
    """The plain definition: every line holding any trigger literal."""
    return [n for n, line in enumerate(text.split("\n"), 1) if any(t in line for t in triggers)]


@given(
    st.lists(
        st.sampled_from(["int(", " ", "(", "=", "[", "pr", "\n", "x.item(", "all", "c", "f'"]),
        max_size=40,
    )
)
def test_hot_lines_equal_the_plain_definition(pieces: list[str]) -> None:
    from torchplace.lint.engine import _hot_lines

    triggers = (" int(", "(int(", "=int(", "[int(", ".item(", " all(", "(all(", "f'", "print(")
    text = "".join(pieces)
    assert _hot_lines(text, triggers) == _hot_lines_one_by_one(text, triggers)


def _all_triggers() -> tuple[str, ...]:
    from torchplace.lint.engine import _plan
    from torchplace.lint.rules import ALL_RULES

    return _plan(frozenset(ALL_RULES)).triggers


@given(
    st.lists(
        st.sampled_from(_all_triggers())
        | st.sampled_from(["\n", " ", "(", '"', "'", "f", "if", "e", "y", "%", ".", "np"]),
        max_size=30,
    )
)
def test_hot_lines_of_every_rule_equal_the_plain_definition(pieces: list[str]) -> None:
    """Literals found together from a shared character, or alone, hit the same lines."""
    from torchplace.lint.engine import _hot_lines

    triggers = _all_triggers()
    text = "".join(pieces)
    assert _hot_lines(text, triggers) == _hot_lines_one_by_one(text, triggers)


def test_installed_packages_are_not_the_linted_tree(tmp_path: Path) -> None:
    site = tmp_path / "lib" / "site-packages"
    for package in ("torchlike", "otherpkg"):
        (site / package).mkdir(parents=True)
        (site / package / "__init__.py").write_text("")
    (site / "torchlike" / "util.py").write_text("")
    here = str(site / "torchlike" / "mod.py")
    assert module_file(here, "torchlike.util") == str(site / "torchlike" / "util.py")
    assert module_file(here, "otherpkg") is None  # another installed package
    project = tmp_path / "project"
    (project / "otherpkg").mkdir(parents=True)
    (project / "otherpkg" / "__init__.py").write_text("")
    found = module_file(str(project / "train.py"), "otherpkg")
    assert found == str(project / "otherpkg" / "__init__.py")  # a project's own package


def test_module_named_for_a_cuda_backend_needs_no_availability_check() -> None:
    source = "import torch\nmajor, minor = torch.cuda.get_device_capability()\n"
    assert lint_source(source, "pkg/attention/cuda.py", select={"TPL601"}) == []
    assert lint_source(source, "pkg/attention/rocm_ops.py", select={"TPL601"}) == []
    found = lint_source(source, "pkg/attention/common.py", select={"TPL601"})
    assert [f.line for f in found] == [2]
    test = "import torch\n\ndef test_name():\n    torch.cuda.get_device_name(0)\n"
    assert [f.line for f in lint_source(test, "tests/test_cuda.py", select={"TPL601"})] == [4]


def test_a_test_named_evaluation_script_is_linted_as_code() -> None:
    """``test.py`` that runs as a program (argparse main, no test framework, nothing a runner
    collects) is a project's evaluation script; a ``test*`` file of a test suite is not."""
    script = (
        "import torch\n\n"
        "def test(opt):\n"
        "    return torch.load(opt.saved_model, map_location='cpu')\n\n"
        "if __name__ == '__main__':\n"
        "    test(None)\n"
    )
    assert [f.line for f in lint_source(script, "test.py", select={"TPL402"})] == [4]
    assert [f.line for f in lint_source(script, "tools/test_net.py", select={"TPL402"})] == [4]
    assert lint_source(script, "tests/test.py", select={"TPL402"}) == []  # a test folder
    collected = script.replace("def test(opt)", "def test_load(opt)").replace("test(None)", "")
    assert lint_source(collected + "    pass\n", "test.py", select={"TPL402"}) == []
    framework = "import unittest\n" + script
    assert lint_source(framework, "test_load.py", select={"TPL402"}) == []
    no_main = script.split("if __name__")[0]
    assert lint_source(no_main, "test_load.py", select={"TPL402"}) == []


def test_a_file_with_lone_carriage_returns_is_linted_line_by_line() -> None:
    # Python ends a line at a lone `\r` too: the rules' lines are found where they are
    from torchplace.lint import lint_source

    found = lint_source('import torch\rx = torch.load("a.pt")\r', "m.py", select={"TPL401"})
    assert [(f.line, f.code) for f in found] == [(2, "TPL401")]


def test_deeply_nested_loops_are_walked_without_doubling_per_level() -> None:
    # each loop's body was walked twice, then each nested loop's twice per walk: 2**depth
    import subprocess
    import sys

    depth = 40
    lines = ["import torch", "def g(loader, model, opt):"]
    lines += ["    " * (i + 1) + f"for a{i} in loader:" for i in range(depth)]
    lines.append(
        "    " * (depth + 1) + f"loss = model(a{depth - 1}.cuda()).sum(); print(loss.item())"
    )
    code = "from torchplace.lint import lint_source; import sys; "
    code += "print(len(lint_source(sys.stdin.read(), 'deep.py', select={'TPL201'})))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=300,  # a guard against a run that never ends, not a timing
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"


def test_a_coding_cookie_python_cannot_use_is_an_unreadable_file_not_a_syntax_error() -> None:
    unknown = lint_bytes(b"# -*- coding: bogus -*-\nx = 1\n", "a.py")
    clash = lint_bytes(b"\xef\xbb\xbf# -*- coding: latin-1 -*-\nx = 1\n", "b.py")
    assert [(f.code, f.line) for f in unknown] == [("TPL001", 1)]
    assert "bogus" in unknown[0].message
    assert [f.code for f in clash] == ["TPL001"]
