"""Round 55: a metrics object's per-batch read found through an importer in a sibling package
(``from maskrcnn_benchmark.utils.metric_logger import MetricLogger`` in ``engine/trainer.py``,
whose loop runs ``meters.update(loss=losses, **loss_dict)``) is per batch (TPL201); a timer
object's ``tic()``/``toc()`` under ``if timer:`` times each step, so the ``synchronize()`` between
them is on purpose (TPL202); and a ``torch.load(f, **load_kwargs)`` whose mapping is a dict
display of the same function without ``weights_only`` (skorch's ``load_kwargs =
{"map_location": map_location}``), also of an empty temporary file the function fills with
bytes it was given, is reported (TPL402). And a CPU-only script that runs its own program
(minimalRL's ``acer.py``: ``main()`` under the main guard calls ``train(...)``, which steps the
optimizer) hands its helpers CPU tensors: a factory there that meets one is not reported
(TPL103)."""

from __future__ import annotations

import pytest

from .helpers import lines, project

METRIC_LOGGER = """\
import torch


class MetricLogger(object):
    def __init__(self, delimiter="\\t"):
        self.meters = {}

    def update(self, **kwargs):
        for k, v in kwargs.items():
            if isinstance(v, torch.Tensor):
                v = v.item()
            self.meters[k] = v
"""

TRAINER = """\
import torch
from pkg.utils.metric_logger import MetricLogger


def do_train(model, data_loader, optimizer, device):
    meters = MetricLogger(delimiter="  ")
    for images, targets in data_loader:
        images = images.to(device)
        loss_dict = model(images, targets)
        losses = sum(loss for loss in loss_dict.values())
        meters.update(loss=losses, **loss_dict)
        optimizer.zero_grad()
        losses.backward()
        optimizer.step()
"""


def _package(trainer: str) -> dict[str, str]:
    return {
        "pkg/__init__.py": "",
        "pkg/utils/__init__.py": "",
        "pkg/utils/metric_logger.py": METRIC_LOGGER,
        "pkg/engine/__init__.py": "",
        "pkg/engine/trainer.py": trainer,
    }


def test_importer_in_a_sibling_package(tmp_path_factory: pytest.TempPathFactory) -> None:
    found = project(tmp_path_factory.mktemp("project"), _package(TRAINER), "TPL201")
    assert found == [("pkg/utils/metric_logger.py", 11)]


def test_relative_import_from_a_sibling_package(tmp_path_factory: pytest.TempPathFactory) -> None:
    relative = TRAINER.replace(
        "from pkg.utils.metric_logger import MetricLogger",
        "from ..utils.metric_logger import MetricLogger",
    )
    found = project(tmp_path_factory.mktemp("project"), _package(relative), "TPL201")
    assert found == [("pkg/utils/metric_logger.py", 11)]


def test_sibling_package_that_updates_once_per_epoch(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # the logger is updated after the loop, with the last loss: not per batch
    after = TRAINER.replace("        meters.update(loss=losses, **loss_dict)\n", "").replace(
        "        optimizer.step()\n",
        "        optimizer.step()\n    meters.update(loss=losses)\n",
    )
    assert project(tmp_path_factory.mktemp("project"), _package(after), "TPL201") == []


def test_module_of_another_package_with_the_same_stem_is_not_an_importer(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # `other.metric_logger` is another module: its class is not the one this loop runs
    other = TRAINER.replace("pkg.utils.metric_logger", "other.metric_logger")
    files = {**_package(other), "other/__init__.py": "", "other/metric_logger.py": ""}
    assert project(tmp_path_factory.mktemp("project"), files, "TPL201") == []


INFERENCE = """\
import torch


def compute_on_dataset(model, data_loader, device, timer=None):
    results = {}
    for images, image_ids in data_loader:
        with torch.no_grad():
            if timer:
                timer.tic()
            output = model(images.to(device))
            if timer:
                if not device.type == "cpu":
                    torch.cuda.synchronize()
                timer.toc()
        results.update(zip(image_ids, output))
    return results
"""


def test_timer_tic_toc_under_a_flag_times_each_step() -> None:
    assert lines(INFERENCE, "TPL202", "inference.py") == []


def test_synchronize_without_the_timer_is_reported() -> None:
    untimed = INFERENCE.replace("                timer.tic()\n", "                pass\n").replace(
        "                timer.toc()\n", ""
    )
    assert lines(untimed, "TPL202", "inference.py") == [13]


PERIODIC = """\
import torch


def run(model, data_loader, device, timer):
    for step, images in enumerate(data_loader):
        output = model(images.to(device))
        torch.cuda.synchronize()
        if step % 100 == 0:
            timer.toc()
"""


def test_timer_read_under_a_periodic_branch_does_not_time_each_step() -> None:
    assert lines(PERIODIC, "TPL202", "inference.py") == [7]
    flag = PERIODIC.replace("if step % 100 == 0:", "if timer is not None:")
    assert lines(flag, "TPL202", "inference.py") == []


def test_flag_the_loop_rebinds_is_not_a_flag() -> None:
    # `timer` is chosen per step (None on most): its reads do not time each step
    rebound = PERIODIC.replace(
        "        if step % 100 == 0:", "        timer = timers.get(step)\n        if timer:"
    )
    assert lines(rebound, "TPL202", "inference.py") == [7]


LOADS = """\
import tempfile

import torch


def load_state(state):
    map_location = get_map_location(state["device"])
    load_kwargs = {"map_location": map_location}
    with tempfile.SpooledTemporaryFile() as f:
        f.write(state["blob"])
        f.seek(0)
        return torch.load(f, **load_kwargs)


def load_plain(path):
    load_kwargs = {"map_location": "cpu"}
    return torch.load(path, **load_kwargs)


def load_safe(path, torch_load_kwargs=None):
    if torch_load_kwargs is None:
        torch_load_kwargs = {"weights_only": True}
    return torch.load(path, map_location="cpu", **torch_load_kwargs)


def load_updated(path, extra):
    load_kwargs = {"map_location": "cpu"}
    load_kwargs.update(extra)
    return torch.load(path, **load_kwargs)


def load_given(path, load_kwargs):
    return torch.load(path, **load_kwargs)


def load_safe_display(path):
    load_kwargs = {"map_location": "cpu", "weights_only": True}
    return torch.load(path, **load_kwargs)


def round_trip(model):
    with tempfile.SpooledTemporaryFile() as f:
        torch.save(model.state_dict(), f)
        f.seek(0)
        return torch.load(f)
"""


def test_star_mapping_of_a_local_display_without_weights_only() -> None:
    assert lines(LOADS, "TPL402", "net.py") == [12, 17]


def test_star_mapping_fix_adds_the_keyword_after_it() -> None:
    from torchplace.lint import lint_source

    (finding,) = [f for f in lint_source(LOADS, "net.py", select={"TPL402"}) if f.line == 17]
    assert finding.fix is not None
    (edit,) = finding.fix.edits
    assert edit.text == ", weights_only=True"


def test_buffer_filled_with_given_bytes_with_weights_only_is_not_reported() -> None:
    safe = LOADS.replace(
        "        return torch.load(f, **load_kwargs)",
        "        return torch.load(f, weights_only=True, **load_kwargs)",
    )
    assert lines(safe, "TPL402", "net.py") == [17]


ACER = """\
import torch
import torch.nn as nn
import torch.optim as optim


class ActorCritic(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc_q = nn.Linear(4, 2)

    def q(self, x):
        return self.fc_q(x)


def train(model, optimizer, memory):
    s, a, r, prob, done_mask = memory.sample()
    q = model.q(s)
    q_a = q.gather(1, a)
    pi = model.pi(s)
    rho = pi.detach() / prob
    v = (q * pi).sum(1).unsqueeze(1).detach()
    q_ret = v[-1] * done_mask[-1]
    q_ret_lst = []
    for i in reversed(range(len(r))):
        q_ret = r[i] + 0.98 * q_ret
        q_ret_lst.append(q_ret.item())
        q_ret = q_ret - q_a[i] + v[i]
    q_ret = torch.tensor(q_ret_lst, dtype=torch.float).unsqueeze(1)
    loss = ((q_ret - v) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def main():
    model = ActorCritic()
    optimizer = optim.Adam(model.parameters())
    memory = ReplayBuffer()
    for n_epi in range(10000):
        memory.put(rollout(model))
        train(model, optimizer, memory)


if __name__ == "__main__":
    main()
"""


def test_helper_of_a_cpu_only_program_is_handed_cpu_tensors() -> None:
    # no device anywhere, and the main block runs the program through main() -> train()
    assert lines(ACER, "TPL103", "acer.py") == []


def test_helper_of_a_program_that_names_a_device_is_reported() -> None:
    placed = ACER.replace("    model = ActorCritic()\n", "    model = ActorCritic().to('cuda')\n")
    assert lines(placed, "TPL103", "acer.py") == [28]


def test_helper_of_a_library_without_a_program_is_reported() -> None:
    # no main block: another module may import `train` and hand it device tensors
    library = ACER.partition("def main():")[0]
    assert lines(library, "TPL103", "acer.py") == [28]
