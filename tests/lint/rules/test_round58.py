"""Rule behaviour found on code the corpus did not hold yet: a join bound to a name and copied
asynchronously in a later statement (TPL701), a bare "cuda" default handed to a load as
`device=str(device)` (TPL104), a model made by a builder function its class's module defines
and a script imports (TPL201), a factory's values written into another tensor's elements
(TPL103), a failed-sample branch, and the rows of a device schedule walked through `zip`
(TPL201), and code written for PyTorch 0.3 (`async=True`)."""

from __future__ import annotations

import pytest

from .helpers import lines as _lines
from .helpers import project as _project

# ---- TPL701: a batch's views joined into a new tensor, then copied with non_blocking=True

JOINED_VIEWS = """\
import torch


def train(loader, model):
    for images, labels in loader:
        images = torch.cat([images[0], images[1]], dim=0)
        if torch.cuda.is_available():
            images = images.cuda(non_blocking=True)
            labels = labels.cuda(non_blocking=True)
        model(images, labels)
"""


def test_a_join_rebinding_a_batch_reaches_the_copy_below_it() -> None:
    # the loop's batch may be pinned (its loader is not known here); the join is not
    assert _lines(JOINED_VIEWS, "TPL701") == [8]
    # in the same block as the copy, and through a factory as well as a join
    straight = (
        JOINED_VIEWS.replace("        if torch.cuda.is_available():\n", "")
        .replace("            images = images.cuda", "        images = images.cuda")
        .replace("            labels = labels.cuda", "        labels = labels.cuda")
    )
    assert _lines(straight, "TPL701") == [7]
    built = JOINED_VIEWS.replace(
        "torch.cat([images[0], images[1]], dim=0)", "torch.zeros(4, 3, 32, 32)"
    )
    assert _lines(built, "TPL701") == [8]


def test_a_pinned_or_device_join_or_a_branch_binding_is_left_alone() -> None:
    pinned = JOINED_VIEWS.replace("dim=0)", "dim=0).pin_memory()")
    assert _lines(pinned, "TPL701") == []
    on_device = JOINED_VIEWS.replace(
        "torch.cat([images[0], images[1]], dim=0)",
        "torch.cat([images[0].to('cuda'), images[1].to('cuda')], dim=0)",
    )
    assert _lines(on_device, "TPL701") == []
    # bound in a branch only: the batch itself may reach the copy, and its memory is unknown
    branch = JOINED_VIEWS.replace(
        "        images = torch.cat(",
        "        if len(images) == 2:\n            images = torch.cat(",
    )
    assert _lines(branch, "TPL701") == []


# ---- TPL104: a bare "cuda" default that reaches a load as `device=str(device)`

FLUX_LOADER = """\
import torch
from safetensors.torch import load_file as load_sft


def load_flow_model(name: str, device: str | torch.device = "cuda"):
    model = build(name)
    sd = load_sft(name + ".safetensors", device=str(device))
    model.load_state_dict(sd)
    return model
"""


def test_a_default_device_spelled_as_a_string_for_a_load_places_the_weights() -> None:
    assert _lines(FLUX_LOADER, "TPL104", "flux/util.py") == [5]
    # the device named in a record, or its string logged, places nothing
    logged = FLUX_LOADER.replace(
        'sd = load_sft(name + ".safetensors", device=str(device))',
        'sd = load_sft(name + ".safetensors")\n    print(str(device))',
    )
    assert _lines(logged, "TPL104", "flux/util.py") == []


# ---- TPL201: a model made by a builder function of its class's module, imported by a script


RETRIEVAL = """\
import torch
from torch import nn


class Retrieval(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, image, weights):
        picked = []
        for b in range(image.size(0)):
            neg = torch.multinomial(weights[b], 1).item()
            picked.append(image[neg])
        return self.fc(torch.stack(picked)).sum()


def retrieval(**kwargs):
    model = Retrieval(**kwargs)
    return model
"""

TRAIN = """\
import torch
from models.retrieval import retrieval


def train(model, loader, optimizer, device):
    for image, weights in loader:
        loss = model(image.to(device), weights.to(device))
        loss.backward()
        optimizer.step()


def main(loader):
    device = torch.device("cuda")
    model = retrieval().to(device)
    train(model, loader, torch.optim.AdamW(model.parameters()), device)
"""


def test_a_model_built_by_an_imported_builder_runs_its_forward_per_batch(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # (a project folder whose path names no test folder: tmp_path's does, `test_...0`)
    files = {"models/__init__.py": "", "models/retrieval.py": RETRIEVAL, "train.py": TRAIN}
    found = _project(tmp_path_factory.mktemp("project"), files, "TPL201")
    assert found == [("models/retrieval.py", 13)]
    # a model the script builds otherwise says nothing of the class's forward
    other = {**files, "train.py": TRAIN.replace("retrieval().to(device)", "Other().to(device)")}
    assert _project(tmp_path_factory.mktemp("project"), other, "TPL201") == []


# ---- TPL103: a factory's values written into elements of another tensor in `forward`

GRID = """\
import torch
from torch import nn


class Predictor(nn.Module):
    def forward(self, video, size):
        step = video.shape[-1] // size
        grid = torch.zeros((1, size * size, 3)).to(video.device)
        for offset in range(step * step):
            ox = offset % step
            grid[:, :, 1] = torch.arange(size).repeat(size) * step + ox
            grid[:, :, 2] = torch.arange(size)
        return grid
"""


def test_a_factory_written_into_elements_of_another_tensor_is_left_alone() -> None:
    # the store copies the values to the target's device: the target's allocation decides
    assert _lines(GRID, "TPL103") == []
    # combined on the way with a parameter (the input may be on the device), still reported
    mixed = GRID.replace(".repeat(size) * step + ox", " * video[0, 0, :size]")
    assert _lines(mixed, "TPL103") == [11]


# ---- TPL201: a failed-sample branch, a non-finite test or-ed with an outlier bound

FAILED_SAMPLE = """\
import torch


def train(model, loader, device):
    for queries, trajs in loader:
        queries, trajs = queries.to(device), trajs.to(device)
        if torch.isnan(queries).any() or queries.abs().max() > 1500:
            print("failed sample", queries)
        model(queries, trajs)
"""


def test_a_branch_for_a_nan_or_an_outlier_runs_on_failed_steps_only() -> None:
    # the test itself reads every step and is reported; the print in its branch is not
    assert _lines(FAILED_SAMPLE, "TPL201") == [7, 7]
    # an or with a test that holds for healthy values (a sign, a comparison of two tensors)
    for other in ("queries.sum() > 0", "queries.sum() > trajs.sum()"):
        common = FAILED_SAMPLE.replace("queries.abs().max() > 1500", other)
        assert 8 in _lines(common, "TPL201")


# ---- TPL201: the rows of a device schedule walked through `zip` of its slices

SAMPLER = """\
import torch


def sample(net, latents, n, s_min=0.0, s_max=1.0):
    t_steps = torch.arange(n, dtype=torch.float64, device=latents.device)
    for i, (t_cur, t_next) in enumerate(zip(t_steps[:-1], t_steps[1:])):
        gamma = 0.5 if s_min <= t_cur <= s_max else 0
        latents = net(latents, t_cur) * gamma
    return latents
"""


def test_a_row_of_a_device_tensor_zipped_with_its_own_slice_is_read_per_step() -> None:
    assert _lines(SAMPLER, "TPL201") == [7]
    # a zipped list of strings is no tensor: comparing its items reads nothing
    names = (
        "def score(preds, labels, probs):\n"
        "    n = 0\n"
        "    for gt, pred, p in zip(labels, preds, probs.cuda()):\n"
        "        if pred == gt:\n"
        "            n += 1\n"
        "    return n\n"
    )
    assert _lines(names, "TPL201") == []


# ---- PyTorch 0.3 code: `async` as a keyword argument (a reserved word since Python 3.7)

OLD_SCRIPT = """\
import torch.utils.data as data


def train(trainset, model):
    trainloader = data.DataLoader(trainset, batch_size=128, shuffle=True)
    for inputs, targets in trainloader:
        inputs, targets = inputs.cuda(), targets.cuda(async=True)
        model(inputs)
"""


def test_code_written_for_pytorch_0_3_is_linted_not_refused() -> None:
    # parsed with the grammar it was written for; `async=True` is the old `non_blocking=True`
    assert _lines(OLD_SCRIPT, "TPL000") == []
    assert _lines(OLD_SCRIPT, "TPL701") == [7]
    pinned = OLD_SCRIPT.replace("shuffle=True)", "shuffle=True, pin_memory=True)")
    assert _lines(pinned, "TPL701") == []
    # what no grammar takes is still a syntax error
    assert _lines("x = (\n", "TPL000") == [1]
