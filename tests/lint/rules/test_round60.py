"""Rule behaviour found on code the corpus did not hold yet: a model builder imported from
another module of the tree, `GradScaler.get_scale()`, a packed all-gather argument written in
the call, rows of a tuple display, a lambda that formats text, a model's settings, a
validation loop written inside `train()`, a scheduler stepped under any name, the outputs an
all-gather collects, TensorBoard's histograms and images, an f-string split over lines, a
per-batch helper's arithmetic of its own reductions, a closure the loop hands its optimizer,
a function picked from a registry (TPL201); `model_zoo` re-exported by torchvision (TPL402);
a one-dash `-gpu` flag (TPL401); cog's old `Predictor` base (TPL403); containers set up by
one tuple assignment and filled with local names (TPL501); a `test.py` parsing its command
line at the top level, or holding code another module imports, is linted."""

from __future__ import annotations

import pytest

from .helpers import lines as _lines
from .helpers import project as _project

# ---- TPL201: a model built and moved by a function of another module

BUILDER = """\
from models import Net


def get_network(args):
    net = Net()
    if args.gpu:
        net = net.cuda()
    return net
"""

TRAIN = """\
from utils import get_network


def train(args, loader, optimizer):
    net = get_network(args)
    for x, y in loader:
        loss = net(x).sum()
        loss.backward()
        optimizer.step()
        for name, p in net.named_parameters():
            print(p.grad.norm())
"""


def test_a_model_moved_by_a_builder_of_another_module_is_on_the_device(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    files = {"utils.py": BUILDER, "train.py": TRAIN}
    found = _project(tmp_path_factory.mktemp("project"), files, "TPL201")
    assert found == [("train.py", 11)]


def test_a_builder_of_another_module_returning_a_tuple_or_an_object_is_not_followed(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # `return net, names`: which element is moved is not followed across files
    builder = BUILDER.replace("return net", "return net, ['a']")
    train = TRAIN.replace("net = get_network(args)", "net, names = get_network(args)")
    files = {"utils.py": builder, "train.py": train}
    assert _project(tmp_path_factory.mktemp("project"), files, "TPL201") == []
    # nor an object it builds around the moved model (a report, a plan)
    builder = BUILDER.replace("return net", "return Report(net)")
    files = {"utils.py": builder, "train.py": TRAIN}
    assert _project(tmp_path_factory.mktemp("project"), files, "TPL201") == []


# ---- TPL201: GradScaler reads its scale back with `.item()`

SCALER = """\
import torch
from torch.cuda.amp import GradScaler


def fit(model, loader, opt):
    scaler = GradScaler()
    model.cuda()
    for x in loader:
        loss = model(x.cuda()).sum()
        scaler.scale(loss).backward()
        scale_before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        print(scale_before)
    return scaler.get_scale()


class Trainer:
    def __init__(self, model):
        self.model = model.cuda()
        self.scaler = torch.amp.GradScaler("cuda")
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def step(self, x):
        self.scaler.scale(self.model(x.cuda()).sum()).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        return self.scaler.get_scale()
"""


def test_a_grad_scalers_scale_read_every_step_is_a_host_read() -> None:
    # each step's reads (the loop, and a method that is one training step); not the one after
    # the loop, nor a print of the Python float it gave
    assert _lines(SCALER, "TPL201") == [11, 28]
    # `get_scale()` of an object that is not a GradScaler
    other = SCALER.replace("scaler = GradScaler()", "scaler = make_scaler()")
    assert _lines(other, "TPL201") == [28]


# ---- TPL201: each rank's size, packed in the all-gather's own call

PACKED = """\
import torch
import torch.distributed as dist


class Sampler:
    def update(self, local_ts, local_losses):
        sizes = [
            torch.tensor([0], dtype=torch.int32, device=local_ts.device)
            for _ in range(dist.get_world_size())
        ]
        dist.all_gather(sizes, torch.tensor([len(local_ts)], dtype=torch.int32, device=local_ts.device))
        sizes = [x.item() for x in sizes]
        return sizes


def train(loader, sampler, model):
    model.cuda()
    for x in loader:
        t = x.cuda()
        loss = model(t)
        sampler.update(t, loss)
        loss.backward()
"""


def test_sizes_packed_in_the_all_gathers_call_are_host_values() -> None:
    assert _lines(PACKED, "TPL201") == []
    # the data itself gathered and read element by element is still reported
    data = PACKED.replace(
        "torch.tensor([len(local_ts)], dtype=torch.int32, device=local_ts.device)", "local_ts"
    )
    assert _lines(data, "TPL201") == [12]


# ---- TPL201: rows of a tuple display, a lambda that formats text, a model's settings

COUNTS = """\
import torch


def report(vae, var, loader, optimizer, device):
    vae.to(device)
    var.to(device)
    count = lambda m: f"{sum(p.numel() for p in m.parameters()) / 1e6:.2f}"
    print(", ".join([f"{k}={count(m)}" for k, m in (("VAE", vae), ("VAR", var))]))
    for step, x in enumerate(loader):
        loss = var(x.to(device)).sum()
        loss.backward()
        if step < var.hyperparams["burn_in"]:
            optimizer.step()
        for name, m in (("VAE", vae), ("VAR", var)):
            print(name)
            print(m(x.to(device)).mean())
"""


def test_names_beside_models_in_a_tuple_display_are_text() -> None:
    # the names, the parameter counts and the model's settings are Python values; the
    # output of each model, printed per step, is read
    assert _lines(COUNTS, "TPL201") == [16]


# ---- TPL401: a one-dash `-gpu` flag chooses the GPU or the CPU

GPU_FLAG = """\
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("-gpu", action="store_true", default=False, help="use gpu or not")
args = parser.parse_args()
net = torch.nn.Linear(4, 4)
if args.gpu:
    net = net.cuda()
net.load_state_dict(torch.load("weights.pth", weights_only=True))
"""


@pytest.mark.parametrize("flag", ["-gpu", "--gpu"])
def test_a_gpu_flag_with_one_or_two_dashes_leaves_a_cpu_path(flag: str) -> None:
    assert _lines(GPU_FLAG.replace('"-gpu"', f'"{flag}"'), "TPL401") == [11]


def test_a_dash_inside_another_option_is_no_gpu_flag() -> None:
    # `--use-gpu-ids`: a list of GPUs, no choice of the CPU; the file moves with `.cuda()` only
    source = GPU_FLAG.replace('"-gpu", action="store_true", default=False', '"--use-gpu-ids"')
    source = source.replace("if args.gpu:\n    net = net.cuda()", "net = net.cuda()")
    assert _lines(source, "TPL401") == []


# ---- TPL403: cog's old `Predictor` base answers requests in `predict`

COG = """\
import cog
import torch


class Predictor(cog.Predictor):
    def setup(self):
        self.model = torch.load("model.pt", map_location="cpu", weights_only=True)

    @cog.input("image", type=cog.Path)
    def predict(self, image):
        model = torch.load("model.pt", map_location="cpu", weights_only=True)
        return model(image)
"""


@pytest.mark.parametrize("base", ["cog.Predictor", "cog.BasePredictor"])
def test_a_cog_predictors_predict_answers_each_request(base: str) -> None:
    assert _lines(COG.replace("cog.Predictor)", f"{base})"), "TPL403") == [11]


# ---- TPL201: a validation loop written inside `train()` trains nothing

INLINE_VAL = """\
import numpy as np
import torch


class RunningScore:
    def __init__(self, n):
        self.confusion_matrix = np.zeros((n, n))

    def update(self, gt, pred):
        self.confusion_matrix += np.bincount(gt * 3 + pred, minlength=9).reshape(3, 3)


def train(model, trainloader, valloader, optimizer, device):
    metrics = RunningScore(3)
    for i, (images, labels) in enumerate(trainloader):
        loss = model(images.to(device)).sum()
        loss.backward()
        optimizer.step()
        print(loss.item())
        if (i + 1) % 1000 == 0:
            with torch.no_grad():
                for images_val, labels_val in valloader:
                    outputs = model(images_val.to(device))
                    pred = outputs.max(1)[1].cpu().numpy()
                    metrics.update(labels_val.numpy(), pred)
"""


def test_a_validation_loop_inside_train_feeds_its_numpy_metric() -> None:
    # the training loop's read is reported; the validation copy for the metric is not
    assert _lines(INLINE_VAL, "TPL201") == [19]
    # a loop that steps the optimizer itself is a training loop
    trains = INLINE_VAL.replace(
        "                    metrics.update(labels_val.numpy(), pred)",
        "                    metrics.update(labels_val.numpy(), pred)\n"
        "                    optimizer.step()",
    )
    assert _lines(trains, "TPL201") == [19, 24]


# ---- TPL401/402: a `test.py` that parses its command line at the top level is a script

TOP_LEVEL_SCRIPT = """\
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--no-cuda", action="store_true")
args = parser.parse_args()
device = "cuda" if torch.cuda.is_available() and not args.no_cuda else "cpu"
checkpoint = torch.load("./checkpoint/ckpt.t7")
net_dict = checkpoint["net_dict"]
"""


def test_a_test_py_that_parses_its_command_line_at_the_top_level_is_a_script() -> None:
    assert _lines(TOP_LEVEL_SCRIPT, "TPL401", "deep/test.py") == [9]
    assert _lines(TOP_LEVEL_SCRIPT, "TPL402", "deep/test.py") == [9]
    # a test module the runner collects parses nothing at import and holds test functions
    module = "import torch\n\n\ndef test_checkpoint():\n    torch.load('./ckpt.t7')\n"
    assert _lines(module, "TPL401", "deep/test.py") == []


# ---- TPL501: containers set up by one tuple assignment, filled with local names

GRIDS = """\
import torch
from torch import nn


class YoloLoss(nn.Module):
    def __init__(self, device=None, batch=2):
        super().__init__()
        self.masked_anchors, self.ref_anchors, self.grid_x = [], [], []
        for i in range(3):
            ref_anchors = torch.zeros(9, 4)
            grid_x = torch.arange(76, dtype=torch.float).repeat(batch, 3, 76, 1).to(device)
            host = ref_anchors.cpu()
            self.ref_anchors.append(ref_anchors)
            self.grid_x.append(grid_x)
            self.masked_anchors.append([1.0, 2.0])
            self.masked_anchors.append(host)

    def forward(self, x):
        return x + self.grid_x[0]
"""


def test_containers_set_up_by_a_tuple_assignment_keep_the_tensors_they_are_given() -> None:
    # the tensors appended by their local names; not Python numbers, nor a host copy
    assert _lines(GRIDS, "TPL501") == [13, 14]


# ---- TPL201: a `test.py` that holds a loop another module imports is code

TEST_LOOP = """\
import torch


class Test:
    def __init__(self, model, data_loader, criterion, device):
        self.model = model
        self.data_loader = data_loader
        self.criterion = criterion
        self.device = device

    def run_epoch(self):
        epoch_loss = 0.0
        for inputs, labels in self.data_loader:
            inputs, labels = inputs.to(self.device), labels.to(self.device)
            loss = self.criterion(self.model(inputs), labels)
            epoch_loss += loss.item()
        return epoch_loss
"""


def test_a_test_py_holding_an_imported_loop_is_code() -> None:
    assert _lines(TEST_LOOP, "TPL201", "test.py") == [16]
    # a class pytest collects (no `__init__`), or a module-level `test*` function: a test
    collected = TEST_LOOP.replace("    def __init__(", "    def setup(")
    assert _lines(collected, "TPL201", "test.py") == []
    function = TEST_LOOP + "\n\ndef test_epoch():\n    pass\n"
    assert _lines(function, "TPL201", "test.py") == []


# ---- TPL201: a scheduler's `step()` under any name steps no optimizer

EPOCHS = """\
from torch.optim import lr_scheduler

from train import Train


def main(model, loader, optimizer, criterion, epochs, device):
    model = model.to(device)
    train = Train(model, loader, optimizer, criterion, device)
    lr_updater = lr_scheduler.StepLR(optimizer, 10, 0.1)
    for epoch in range(epochs):
        epoch_loss = train.run_epoch()
        lr_updater.step()
        print("Epoch {0:d} loss {1:.4f}".format(epoch, epoch_loss))
"""


def test_a_schedulers_step_makes_no_batch_loop() -> None:
    assert _lines(EPOCHS, "TPL201") == []
    # an optimizer's step under that name would make the loop a batch loop
    stepped = EPOCHS.replace("lr_scheduler.StepLR(optimizer, 10, 0.1)", "optimizer")
    assert _lines(stepped, "TPL201") == [13]


# ---- TPL402: `model_zoo` as older torchvision modules re-export it


def test_torchvisions_reexported_model_zoo_downloads_a_pickle() -> None:
    source = (
        "from torchvision.models.resnet import model_zoo\n\n"
        "state = model_zoo.load_url('https://example.com/resnet.pth')\n"
    )
    assert _lines(source, "TPL402") == [3]


# ---- TPL201: each rank's whole output, gathered to be saved

GATHERED = """\
import numpy as np
import torch
import torch.distributed as dist


def sample_all(model, n, batch_size, device):
    model.to(device)
    all_images = []
    while len(all_images) * batch_size < n:
        noise = torch.randn(batch_size, 3, 32, 32, device=device)
        sample = model(noise).clamp(0, 255).to(torch.uint8)
        gathered = [torch.zeros_like(sample) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, sample)
        all_images.extend([s.cpu().numpy() for s in gathered])
    return np.concatenate(all_images)
"""


def test_the_outputs_an_all_gather_collects_are_copied_once_per_rank() -> None:
    assert _lines(GATHERED, "TPL201") == []
    # a list of the step's own tensors, copied one by one, is still read per element
    own = GATHERED.replace("[s.cpu().numpy() for s in gathered]", "[s.item() for s in sample]")
    assert _lines(own, "TPL201") != []


# ---- TPL201: TensorBoard copies whole tensors to NumPy

TENSORBOARD = """\
import torchvision
from torch.utils.tensorboard import SummaryWriter


def train(model, loader, optimizer, criterion, device):
    writer = SummaryWriter()
    model.to(device)
    for step, (data, targets) in enumerate(loader):
        data, targets = data.to(device), targets.to(device)
        loss = criterion(model(data), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        writer.add_image("inputs", torchvision.utils.make_grid(data))
        writer.add_histogram("fc1", model.fc1.weight)
        if step % 100 == 0:
            writer.add_histogram("fc2", model.fc2.weight, global_step=step)
    writer.add_histogram("final", model.fc1.weight)


def sample(model, loader, device):
    writer = SummaryWriter()
    model.to(device)
    for i, x in enumerate(loader):
        writer.add_images("samples", model(x.to(device)), i)
"""


def test_tensorboard_histograms_and_images_of_device_tensors_are_read_each_step() -> None:
    # each training step's image and histogram; not the periodic one, the one after the
    # loop, nor the samples a loop that trains nothing logs as its output
    assert _lines(TENSORBOARD, "TPL201") == [14, 15]


# ---- TPL201: an f-string split over lines is reported where the value is

SPLIT_FSTRING = """\
def train(model, loader, optimizer, device):
    model.to(device)
    for x, target in loader:
        out = model(x.to(device))
        loss = out.sum()
        loss.backward()
        optimizer.step()
        accuracy = (out.argmax(1) == target.to(device)).float().mean()
        logger.info(
            f"loss: {loss.item():.5f}; "
            f"acc: {accuracy:.5f}"
        )
"""


def test_a_split_f_string_is_reported_at_the_value_it_reads() -> None:
    assert _lines(SPLIT_FSTRING, "TPL201") == [10, 11]


# ---- TPL201: a per-batch helper's casts and conditions of its own reductions

HELPERS = """\
import torch
from torch import nn


def get_dc(sr, gt, threshold=0.5):
    sr = sr > threshold
    inter = torch.sum((sr + (gt == torch.max(gt))) == 2)
    return float(2 * inter) / (float(torch.sum(sr) + torch.sum(gt)) + 1e-6)


class Loss(nn.Module):
    def forward(self, net_output, target):
        mask = target != 0
        num_fg = mask.sum()
        return net_output.mean() if num_fg > 0 else net_output.sum()


def train(model, loader, optimizer, device):
    model.to(device)
    loss_fn = Loss()
    for x, y in loader:
        sr = model(x.to(device))
        loss = loss_fn(sr, y.to(device))
        loss.backward()
        optimizer.step()
        get_dc(sr, y.to(device))
"""


def test_a_per_batch_helper_reads_arithmetic_of_its_reductions() -> None:
    # `num_fg > 0` of the loss's `forward`, `num_fg` bound only to a reduction
    assert _lines(HELPERS, "TPL201") == [8, 8, 15]
    # arithmetic of numbers and sizes alone reads nothing
    sizes = HELPERS.replace("float(2 * inter)", "float(2 * sr.size(0))")
    assert _lines(sizes, "TPL201") == [8, 15]


# ---- TPL201: a closure defined and handed on in the loop is part of its step

CLOSURE = """\
def fit(model, loader, optimizer, criterion):
    model.cuda()
    for x, y in loader:
        def closure():
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            return loss

        loss = optimizer.step(closure)
        print(loss.item())
"""


def test_a_closure_the_loop_hands_its_optimizer_makes_it_a_training_loop() -> None:
    assert _lines(CLOSURE, "TPL201") == [11]
    # a function defined there but never used runs nothing: the loop is no training loop
    unused = CLOSURE.replace("optimizer.step(closure)", "compute(x, y)")
    assert _lines(unused, "TPL201") == []


# ---- TPL201: a function of the tree picked from a dict display

LOSSES = """\
def noise_estimation_loss(model, x0, t, e):
    return (model(x0, t) - e).square().mean()


loss_registry = {"simple": noise_estimation_loss}
"""

RUNNER = """\
from functions.losses import loss_registry


def train(model, loader, optimizer, writer, kind, device):
    model.to(device)
    for step, (x, t, e) in enumerate(loader):
        x = x.to(device)
        loss = loss_registry[kind](model, x, t, e)
        writer.add_scalar("loss", loss, global_step=step)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def test_a_function_picked_from_a_registry_runs_on_what_it_is_given(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    files = {"functions/__init__.py": "", "functions/losses.py": LOSSES, "runner.py": RUNNER}
    found = _project(tmp_path_factory.mktemp("project"), files, "TPL201")
    assert found == [("runner.py", 9)]
    # a dict of other things (strings, classes of elsewhere) is not such a registry
    other = LOSSES.replace('{"simple": noise_estimation_loss}', '{"simple": "mse"}')
    files = {"functions/__init__.py": "", "functions/losses.py": other, "runner.py": RUNNER}
    assert _project(tmp_path_factory.mktemp("project"), files, "TPL201") == []
