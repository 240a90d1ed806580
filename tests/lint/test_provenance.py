"""Device provenance: where values live, which loops step through batches, who runs per batch."""

from __future__ import annotations

import ast
import os
import shutil
import textwrap
from pathlib import Path

import pytest

from torchplace.cli import main
from torchplace.lint import lint_source
from torchplace.lint.provenance import Fact, FileFacts
from torchplace.lint.provenance.callers import _cousins
from torchplace.lint.provenance.loops import has_own_batch_loop

EXAMPLES = Path(__file__).parent / "fixtures" / "examples"


def _facts(source: str, path: str = "<string>") -> FileFacts:
    text = textwrap.dedent(source)
    return FileFacts(ast.parse(text), text.splitlines(), path)


def _function(facts: FileFacts, name: str) -> ast.FunctionDef:
    node = facts.defs[name][0]
    assert isinstance(node, ast.FunctionDef)
    return node


def _fact_at(facts: FileFacts, function: str, name: str, line: int) -> Fact | None:
    node = ast.Name(id=name)
    node.lineno = line
    return facts.fact(node, _function(facts, function))


TRAIN = """
import numpy as np
import torch

def train(model, loader, optimizer, device):
    for epoch in range(3):
        for x, y in loader:
            x = x.to(device)
            loss = model(x).sum()
            loss.backward()
            optimizer.step()
            host = loss.item()
            table = np.zeros(3)
            cpu = torch.zeros(3)
        mean = host
"""


def test_device_and_host_values_and_their_origin() -> None:
    facts = _facts(TRAIN)
    loss = _fact_at(facts, "train", "loss", 12)
    assert loss is not None
    assert loss.on_device
    assert loss.moved
    assert loss.describe() == "`loss` comes from `model(x).sum()`, `x` moved to `device` at line 8"
    for name in ("host", "table", "cpu", "epoch"):
        fact = _fact_at(facts, "train", name, 16)
        assert fact is not None, name
        assert fact.where == "host", name
    item = _fact_at(facts, "train", "y", 12)  # a loader item the loop never moves
    assert item is not None
    assert item.where == "host"
    assert _fact_at(facts, "train", "model", 12) is None  # a parameter: nothing says


def test_x_is_host_before_its_move_and_device_after() -> None:
    facts = _facts(TRAIN)
    before = _fact_at(facts, "train", "x", 8)
    after = _fact_at(facts, "train", "x", 9)
    assert before is not None
    assert before.where == "host"
    assert after is not None
    assert after.on_device


def test_batch_loop_and_epoch_loop() -> None:
    facts = _facts(TRAIN)
    train = _function(facts, "train")
    epoch, batch = [n for n in ast.walk(train) if isinstance(n, ast.For)]
    assert facts.loop_kind(epoch, train) is None  # its batch evidence is in the nested loop
    kind = facts.loop_kind(batch, train)
    assert kind is not None
    assert kind[0] == "batch"


def test_rows_of_a_device_tensor_and_a_model_run_per_step() -> None:
    facts = _facts(
        """
        import torch

        def post(model, images, device, steps, idx):
            model = model.to(device)
            for row in model(images):
                pass
            for _ in range(steps):
                idx = model(idx)
            for v in [1, 2]:
                pass
        """
    )
    post = _function(facts, "post")
    rows, decode, plain = [n for n in ast.walk(post) if isinstance(n, ast.For)]
    assert (facts.loop_kind(rows, post) or ("",))[0] == "rows"
    assert (facts.loop_kind(decode, post) or ("",))[0] == "batch"
    assert facts.loop_kind(plain, post) is None


def test_zipped_names_and_string_methods_stay_on_the_host() -> None:
    facts = _facts(
        """
        import torch

        def sample(model, x, names, device):
            out = model.to(device)(x)
            for row, name in zip(out, names):
                tag = "_".join([name, "{}".format(row)])
                pass
        """
    )
    row = _fact_at(facts, "sample", "row", 9)
    assert row is not None
    assert row.on_device
    assert _fact_at(facts, "sample", "name", 9) is None  # follows `names`, not `out`
    tag = _fact_at(facts, "sample", "tag", 10)
    assert tag is not None
    assert tag.where == "host"


def test_a_device_value_bound_late_in_a_loop_reaches_the_next_step() -> None:
    """``history = None`` before a decoding loop, ``history = token`` at its end: from the
    second step on, the reads at the top of the loop see the device value; a host value the
    loop carries stays on the host."""
    facts = _facts(
        """
        import torch

        def decode(model, x, steps, device):
            x = x.to(device)
            history = None
            count = None
            for step in range(steps):
                use(history, count)
                token = model(x)
                history = token
                count = step
            done = history
        """
    )
    carried = _fact_at(facts, "decode", "history", 10)
    assert carried is not None
    assert carried.on_device
    host = _fact_at(facts, "decode", "count", 10)
    assert host is not None
    assert host.where == "host"
    before = _fact_at(facts, "decode", "history", 8)  # before the loop: only the `None`
    assert before is not None
    assert before.where == "host"


@pytest.mark.parametrize(
    ("iterable", "own"),
    [
        ("train_loader", True),
        ("range(num_batches)", True),
        ("batch_iter", True),
        ("tqdm(self.val_dataloader())", True),
        ("range(batch_size)", False),
        ("range(batch_size * num_beams)", False),
        ("enumerate(banned_batch_tokens)", False),
    ],
)
def test_an_epoch_function_iterates_batches_not_the_rows_of_one(iterable: str, own: bool) -> None:
    facts = _facts(f"def helper(x):\n    for item in {iterable}:\n        pass\n")
    assert has_own_batch_loop(_function(facts, "helper")) is own


def test_per_batch_functions_seed_their_parameters() -> None:
    facts = _facts(
        """
        import torch

        def accuracy(output, target):
            return output.argmax(1).eq(target).sum().item()

        def evaluate(model, loader, device):
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                out = model(x)
                accuracy(out, y)

        def once(model):
            return accuracy(model, None)

        class Lit:
            def training_step(self, batch, batch_idx):
                return batch
        """
    )
    per_batch = facts.per_batch(_function(facts, "accuracy"))
    assert per_batch is not None
    assert "evaluate" in per_batch.how
    assert per_batch.seeds["output"].on_device
    assert facts.per_batch(_function(facts, "once")) is None
    hook = facts.per_batch(_function(facts, "training_step"))
    assert hook is not None
    assert hook.seeds["batch"].on_device


def test_mnist_shaped_script_reports_its_per_batch_item_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The canonical example: `.to(device)`, then `.item()` twice per batch in `test()`."""
    script = tmp_path / "mnist" / "main.py"
    script.parent.mkdir()
    shutil.copy(EXAMPLES / "mnist_main.py", script)
    monkeypatch.chdir(script.parent)
    assert main(["lint", "--select", "TPL201", "main.py"]) == 1
    out = capsys.readouterr().out
    lines = script.read_text().splitlines()
    expected = [i for i, line in enumerate(lines, 1) if "# per batch" in line]
    found = [int(line.split(":")[1]) for line in out.splitlines() if ": TPL201 " in line]
    assert found == expected
    # `test(model, device, None)` is handed the model `main` moved: the reason cites that move
    assert "`Net()` moved to `device` at line 54" in out


def test_a_helper_called_per_batch_from_a_sibling_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "util").mkdir()
    (tmp_path / "util" / "misc.py").write_text(
        textwrap.dedent(
            """
            import torch
            import torch.distributed as dist

            def reduce_mean(x):
                t = torch.tensor(x).cuda()
                dist.all_reduce(t)
                return t.item()
            """
        )
    )
    (tmp_path / "train.py").write_text(
        textwrap.dedent(
            """
            import torch
            import util.misc as misc

            def train(model, loader, optimizer, device):
                for x, y in loader:
                    x, y = x.to(device), y.to(device)
                    loss = torch.nn.functional.mse_loss(model(x), y)
                    loss.backward()
                    optimizer.step()
                    misc.reduce_mean(1.0)
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    assert main(["lint", "--select", "TPL201", "util/misc.py"]) == 1
    out = capsys.readouterr().out
    assert "util/misc.py:8:" in out
    assert "the batch loop of `train`" in out


# ---- a loader handed back by `accelerator.prepare` with a model already on the device

PREPARED = """\
from accelerate import Accelerator


def main(model, optimizer, train_dataloader):
    accelerator = Accelerator()
    model = model.to(accelerator.device)
    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
    for step, batch in enumerate(train_dataloader):
        loss = model(**batch).loss
        print(loss.item())
    for row in model(**batch).logits:
        print(row.item())
"""


def test_a_prepared_loader_is_a_batch_loop_not_rows() -> None:
    found = lint_source(PREPARED, "train.py", select={"TPL201"})
    assert [(f.line, "in the batch loop at line 8" in f.message) for f in found] == [
        (10, True),
        (12, False),  # the rows of a device tensor stay a walk over rows
    ]
    assert "once per row of a device tensor" in found[1].message


# ---- batch items never moved when the loop moves a tensor built from another item

BUILT_FROM_ITEM = """\
def generate(self, loader, bos):
    res = []
    for batch in loader:
        src_tokens = batch["net_input"]["src_tokens"]
        prefix = src_tokens.new_full((src_tokens.size(0), 1), bos).to(device=self.device)
        results = self.model.generate(src_tokens, prefix)
        for i, hypos in zip(batch["id"].tolist(), results):
            res.append((i, hypos))
        print(prefix.tolist())
    return res
"""


def test_an_item_the_loop_never_moves_stays_on_the_host() -> None:
    lines = [f.line for f in lint_source(BUILT_FROM_ITEM, "hub.py", select={"TPL201"})]
    assert lines == [9]  # the moved prefix is still a device value


# ---- an optimizer's pass over its parameters is not a batch loop

OPTIMIZER = """\
import math
import torch


class Adam(torch.optim.Optimizer):
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                state["exp_avg"] = state["exp_avg"].to(p.data)
                state["step"] += 1
                correction = 1 - 0.999 ** state["step"]
                step_size = group["lr"] * math.sqrt(correction)
                p.data.add_(state["exp_avg"], alpha=-step_size)


def train(model, loader, optimizer, device):
    for x in loader:
        loss = model(x.to(device))
        for p in model.params:
            print(p.grad.norm().item())
"""


def test_a_pass_over_parameters_is_not_a_batch_loop() -> None:
    lines = [f.line for f in lint_source(OPTIMIZER, "adam.py", select={"TPL201"})]
    assert lines == [21]  # inside a batch loop, a pass over parameters still runs per batch


# ---- a vocabulary's `string(ids)` is text

VOCAB = """\
class Hub:
    def fill_mask(self, tokens, topk=5):
        features = self.model(tokens.to(self.device))
        values, index = features[0].softmax(dim=0).topk(k=topk, dim=0)
        words = self.task.source_dictionary.string(index)
        return [(w, values[i].item()) for i, w in enumerate(words.split(" "))]

    def fill_codes(self, tokens, topk=5):
        features = self.model(tokens.to(self.device))
        values, index = features[0].softmax(dim=0).topk(k=topk, dim=0)
        codes = self.task.source_model.string(index)
        return [(c, values[i].item()) for i, c in enumerate(codes.split(" "))]
"""


def test_a_vocabulary_string_is_host_text() -> None:
    lines = [f.line for f in lint_source(VOCAB, "hub.py", select={"TPL201"})]
    assert lines == [12]  # a model's `string(...)` may give a tensor


# --- a tutorial's `test_step`, a walk over a model's layers, a loop that builds a model ---

OWN_FUNCTIONS = """\
import torch
from torch import nn

device = "cuda" if torch.cuda.is_available() else "cpu"


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))

    def test_step(self, batch, batch_idx):
        print(f"loss {self.layers(batch).sum()}")


def test_step(data_loader, model, loss_fn):
    test_loss = 0
    model.to(device)
    for X, y in data_loader:
        X, y = X.to(device), y.to(device)
        test_loss += loss_fn(model(X), y)
    test_loss /= len(data_loader)
    print(f"Test loss: {test_loss:.5f}")


def activations(model, imgs):
    feats = imgs.to(device)
    out = {}
    for index, layer in enumerate(model.layers):
        feats = layer(feats)
        out[index] = feats.view(-1).cpu().numpy()
    return out


def grads(net):
    net(torch.randn(8, 4, device=device)).sum().backward()
    return {name: p.grad.view(-1).cpu().numpy() for name, p in net.named_parameters()}


for width in [4, 8, 16]:
    net = nn.Linear(4, width).to(device)
    grads(net)

for act in [nn.ReLU, nn.Tanh]:
    deep = Net()
    deep.to(device)
    grads(deep)

for X, y in loader:
    criterion = nn.CrossEntropyLoss().to(device)
    loss = criterion(deep(X.to(device)), y.to(device))
    loss.backward()
    print(loss.item())
"""


def test_hooks_layer_walks_and_loops_over_models() -> None:
    # a method named for a framework hook runs per batch; a module-level `test_step` that
    # loops over its loader, a walk over `model.layers` and a loop that builds a model per
    # step are not batch loops; a loop that builds a loss module but moves its batch is one
    lines = [f.line for f in lint_source(OWN_FUNCTIONS, "nb.py", select={"TPL201"})]
    assert lines == [13, 53]


def test_cousins_take_subpackages_and_namespace_folders_but_not_a_crowd(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("project")
    (root / "pkg" / "modules").mkdir(parents=True)
    (root / "pkg" / "models" / "diffusion").mkdir(parents=True)
    (root / "pkg" / "models" / "diffusion" / "ddpm.py").write_text("x = 1\n")
    (root / "pkg" / "models" / "autoencoder.py").write_text("x = 1\n")
    found = {os.path.relpath(p, root) for p in _cousins(str(root / "pkg" / "modules"))}
    assert found == {"pkg/models/autoencoder.py", "pkg/models/diffusion/ddpm.py"}
    # a folder among many (a home, a cache of projects) has no cousins searched
    crowd = tmp_path_factory.mktemp("crowd")
    for n in range(41):
        (crowd / f"p{n}").mkdir()
    (crowd / "p0" / "a.py").write_text("x = 1\n")
    assert _cousins(str(crowd / "p1")) == ()


def test_a_files_call_words_are_read_once_by_whole_names() -> None:
    from torchplace.lint.provenance.callers import _read_call_words

    words = _read_call_words("def step(x):\n    pass\nself.step(y)\nrestep(z)\nEngine(step, f)\n")
    assert words.called["step"] == 2  # its `def` and `self.step(`, not `restep(`
    assert words.called["restep"] == 1
    assert "step" in words.handed  # `Engine(step, ...)`
    assert "Engine" not in words.handed
