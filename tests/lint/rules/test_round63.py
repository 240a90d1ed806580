"""Round 63: a non-blocking copy of a source the file cannot trace, in a project that pins
nothing and builds its loaders in sight (:mod:`torchplace.lint.project`)."""

from __future__ import annotations

from pathlib import Path

from torchplace.lint import lint_source
from torchplace.lint import project as project_module

from .helpers import lines as _lines
from .helpers import project as _project

TRAIN = """\
from torch.utils.data import DataLoader
from utils import to_gpu

def main(ds, model):
    loader = DataLoader(ds, batch_size=8, num_workers=2{pin})
    for batch in loader:
        model(to_gpu(batch))
"""
UTILS = """\
import torch

def to_gpu(x):
    x = x.contiguous()
    return x.cuda(non_blocking=True)

def to_half(x):
    return x.to(torch.float16, non_blocking=True)

def between(model, x):
    y = model.cuda()(x.cuda())
    return y.to("cuda:1", non_blocking=True)
"""


def lint(root: Path, pin: str, extra: dict[str, str] | None = None) -> list[tuple[str, int]]:
    project_module._scan.cache_clear()
    project_module.project_root.cache_clear()
    files = {"setup.cfg": "", "train.py": TRAIN.format(pin=pin), "utils.py": UTILS, **(extra or {})}
    return _project(root, files, "TPL701")


def test_a_helper_copying_batches_of_a_project_that_pins_nothing(tmp_path: Path) -> None:
    assert lint(tmp_path, "") == [("utils.py", 5)]
    assert lint(tmp_path / "off", ", pin_memory=False") == [("utils.py", 5)]


def test_a_project_that_may_pin_leaves_the_helper_alone(tmp_path: Path) -> None:
    assert lint(tmp_path, ", pin_memory=True") == []
    assert lint(tmp_path / "flag", ", pin_memory=args.pin_memory") == []
    elsewhere = {"data/build.py": "def pin(x):\n    return x.pin_memory()\n"}
    assert lint(tmp_path / "other", "", elsewhere) == []


def test_a_project_whose_loaders_are_out_of_sight_is_left_alone(tmp_path: Path) -> None:
    project_module._scan.cache_clear()
    project_module.project_root.cache_clear()
    assert _project(tmp_path, {"setup.cfg": "", "utils.py": UTILS}, "TPL701") == []


HELPER = """\
import numpy as np
import torch

def image_to_tensor(image, half):
    tensor = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).float()
    tensor = tensor.mul(2.0).sub(1.0)
    if half:
        tensor = tensor.half()
    return tensor

def as_float(tensor):
    tensor = tensor.float()
    return tensor

def preprocess(image, device):
    tensor = image_to_tensor(image, False).unsqueeze_(0)
    tensor = tensor.to(device, non_blocking=True)
    given = as_float(image).unsqueeze_(0)
    return tensor, given.to(device, non_blocking=True)
"""


def test_a_helper_that_rebinds_the_host_tensor_it_builds() -> None:
    assert _lines(HELPER, "TPL701", "/nonexistent/infer.py") == [17]


RESIZED = """\
import torch.nn.functional as F

def train(loader, model, zoom):
    for input, target in loader:
        if zoom != 8:
            target = F.interpolate(target.unsqueeze(1).float(), size=(4, 4)).squeeze(1).long()
        input = input.cuda(non_blocking=True)
        target = target.cuda(non_blocking=True)
        model(input, target)

def moved_first(loader, model, zoom):
    for input, target in loader:
        target = target.cuda()
        if zoom != 8:
            target = F.interpolate(target.unsqueeze(1).float(), size=(4, 4)).long()
        target = target.cuda(non_blocking=True)
        model(input, target)
"""


def test_a_batch_resized_on_the_host_under_an_if_before_its_copy() -> None:
    assert _lines(RESIZED, "TPL701", "/nonexistent/train.py") == [8]


SIZES = """\
import torch

def train(loader, model, opt, device, G):
    model = model.to(device)
    for x, lengths in loader:
        x = x.to(device)
        lengths = lengths.to(device)
        mask = torch.arange(lengths.max(), device=device)
        out = torch.zeros(x.shape[0], len(x), model.width, G.z_dim, device=device)
        for H_, W_ in lengths:
            grid = torch.linspace(0.5, H_ - 0.5, H_, device=device)
        loss = model(x, mask).sum()
        loss.backward()
        opt.step()
"""


def test_a_device_element_given_as_a_factory_size_is_read() -> None:
    assert _lines(SIZES, "TPL201", "/nonexistent/train.py") == [8, 11]


CURRENT = """\
import torch
from torch import nn

class Router(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.layer = nn.Linear(4, 2, device=torch.cuda.current_device())
        if args.use_cpu_initialization:
            self.weight = nn.Parameter(torch.empty(4, 4))
        else:
            self.weight = nn.Parameter(torch.empty(4, 4, device=torch.cuda.current_device()))

    def forward(self, x):
        return self.layer(x).to(torch.cuda.current_device())
"""


def test_the_current_cuda_device_inside_a_module_is_a_hard_coded_device() -> None:
    assert _lines(CURRENT, "TPL102", "/nonexistent/router.py") == [7, 14]


LOSS = """\
import torch

class ComputeLoss:
    def __init__(self, model):
        self.device = next(model.parameters()).device

    def __call__(self, p, targets):
        fg_mask = (p > 0).float()
        if fg_mask.sum():
            p = p * 2
        return p.sum()

def train(model, loader, opt, device, imgsz):
    model = model.to(device)
    batch_size = check_train_batch_size(model, imgsz)
    loader = create_dataloader(loader, batch_size)
    compute_loss = ComputeLoss(model)
    for imgs, targets in loader:
        pred = model(imgs.to(device))
        loss = compute_loss(pred, targets.to(device))
        loss.backward()
        opt.step()
        print("%g" % loss.detach())
"""


def test_a_loss_object_called_per_batch_tests_a_reduction_each_call() -> None:
    found = lint_source(LOSS, "/nonexistent/train.py", select={"TPL201"})
    # line 23 once, at the formatting of the loss: what `%` builds is a host string
    assert [f.line for f in found] == [9, 23]
    assert "`%` formatting" in found[1].message
    # the loader a function named for one builds is a loader, not a device tensor: its loop
    # steps through batches (not the rows of a tensor the moved model was handed to)
    assert all("batch loop at line 18" in f.message for f in found if f.line == 23)


def test_functions_named_for_a_loader_or_a_count_hand_back_host_values() -> None:
    from torchplace.lint.provenance.values import names_host_result

    assert all(map(names_host_result, ["create_dataloader", "build_dataset", "get_batch_size"]))
    assert not any(map(names_host_result, ["load_model", "pad_to_size", "loader_step"]))


SLICES = """\
import torch.nn.functional as F

def train(model, loader, opt, device, decoder):
    model = model.to(device)
    for mels, lengths, texts, adj in loader:
        mels = mels.to(device)
        lengths = lengths.to(device)
        pred = model(mels)
        loss = 0
        for _pred, _text, _len in zip(pred, texts, lengths):
            loss += F.cross_entropy(_pred[:_len], _text)
        for bib in range(len(lengths)):
            mel = mels[bib, :, :lengths[bib]]
        edge_index, _, size = adj.to(device)
        first = mels[:size[1]]
        scores, decode_lengths = decoder(mels)
        kept = scores[:decode_lengths[0]]
        loss.backward()
        opt.step()
"""


def test_a_device_element_as_a_slice_bound_is_read() -> None:
    # not an element of what a call hands back unpacked (`size` of an `Adj` tuple, lists)
    assert _lines(SLICES, "TPL201", "/nonexistent/train.py") == [11, 13]


WRAPPED = """\
class PPO:
    def __init__(self, actor, optim, device):
        self.actor = actor.to(device)
        self.optim = optim

    def update(self, batch, batch_size, repeat):
        losses = []
        for step in range(repeat):
            for minibatch in batch.split(batch_size):
                loss = -self.actor(minibatch.obs).log_prob(minibatch.act).mean()
                self.optim.step(loss)
                losses.append(loss.item())
        return losses

    def learn_once(self, batch):
        loss = (self.actor(batch.obs) - batch.returns).pow(2).mean()
        self.optim.step(loss)
        return loss.item()

    def tune(self, scaler, batches):
        for batch in batches:
            scaler.step(self.optim)
            print(batch.sum().item())
"""


def test_an_optimizer_wrapper_handed_the_loss_is_a_training_step() -> None:
    assert _lines(WRAPPED, "TPL201", "/nonexistent/ppo.py") == [12, 18]


CONFUSION = """\
import numpy as np

class ConfusionMatrix:
    def __init__(self, nc):
        self.matrix = np.zeros((nc + 1, nc + 1))
        self.nc = nc

def val(model, loader, device, nc):
    model = model.to(device)
    cm = ConfusionMatrix(nc)
    counts = np.zeros(nc)
    seen = [0] * nc
    for imgs, targets in loader:
        out = model(imgs.to(device))
        classes = out[:, 5].int()
        for i in range(len(classes)):
            cm.matrix[classes[i], 0] += 1
            counts[classes[i]] += 1
            seen[int(i)] += 1
"""


def test_a_numpy_array_indexed_by_a_device_element_reads_it() -> None:
    assert _lines(CONFUSION, "TPL201", "/nonexistent/val.py") == [18]


MODELS = """\
import torch.nn as nn
from torch import optim

class Generator(nn.Module):
    def __init__(self, lr=1e-4):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.optim = optim.Adam(params=self.parameters(), lr=lr)

class Discriminator(nn.Module):
    def __init__(self, lr=1e-4):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.cuda()
        self.optim = optim.Adam(params=self.parameters(), lr=lr)

class Critic(nn.Module):
    def __init__(self, lr=1e-4):
        super().__init__()
        self.optim = optim.Adam(params=self.parameters(), lr=lr)
"""
TRAIN_GAN = """\
def run(config, device):
    model = __import__(config["model"])
    G = model.Generator(**config).to(device)
    D = model.Discriminator(**config).to(device)
    C = model.Critic(**config)
"""


def test_an_optimizer_a_module_builds_in_init_before_its_maker_moves_it(tmp_path: Path) -> None:
    files = {"BigGAN.py": MODELS, "train.py": TRAIN_GAN}
    assert _project(tmp_path, files, "TPL801") == [("BigGAN.py", 8)]


FEATURES = """\
import numpy as np
import torch
from torch import nn

class TGN(nn.Module):
    def __init__(self, node_features, device):
        super().__init__()
        self.node_raw_features = torch.from_numpy(node_features.astype(np.float32)).to(device)
        self.scale = torch.as_tensor(0.5)

    def forward(self, nodes):
        return self.node_raw_features[nodes] * self.scale
"""


def test_an_array_wrapped_by_from_numpy_is_a_plain_tensor_attribute() -> None:
    assert _lines(FEATURES, "TPL501", "/nonexistent/tgn.py") == [8]


HOLDER = """\
import torch

class InferenceSpeedTest:
    def __init__(self, path):
        self.init_model(path)

    def init_model(self, path):
        self.device = "cuda"
        self.model = torch.jit.load(path).to(self.device).eval()
"""


def test_a_holder_that_binds_its_model_in_a_set_up_method() -> None:
    assert _lines(HOLDER, "TPL104", "/nonexistent/speed.py") == [8]


BENCH = """\
import time
import torch

def main(model, loader):
    for data in loader:
        torch.cuda.synchronize()
        start = time.perf_counter()
        model(data)
        torch.cuda.synchronize()
        print(time.perf_counter() - start)
"""


def test_only_the_first_unguarded_cuda_call_of_a_block_is_reported() -> None:
    assert _lines(BENCH, "TPL601", "/nonexistent/benchmark.py") == [6]


ACCUMULATED = """\
import torch

def train_step(G, D, x, config, device):
    G.optim.zero_grad()
    for accumulation_index in range(config["num_G_accumulations"]):
        G_loss = D(G(x.to(device))).mean() / float(config["num_G_accumulations"])
        G_loss.backward()
    G.optim.step()
    return {"G_loss": float(G_loss.item())}

def epoch(G, D, loader, device):
    for batch in loader:
        G.optim.zero_grad()
        for i in range(4):
            loss = G(batch.to(device)).mean()
            loss.backward()
        G.optim.step()
    return float(loss.item())
"""


def test_the_micro_batches_of_one_step_do_not_make_it_an_epoch() -> None:
    # not a loop over a count that is not named for accumulation, nor the read after it
    assert _lines(ACCUMULATED, "TPL201", "/nonexistent/train_fns.py") == [9]


DECODE = """\
import time
import torch

def infer(args, device):
    vq_model, llm, size = load_model(args)
    helper = Helper()
    index_sample = torch.zeros(1, 256, dtype=torch.long, device=device)
    t2 = time.time()
    samples = vq_model.decode_code(index_sample, (1, 8, 16, 16))
    decoder_time = time.time() - t2
    t3 = time.time()
    prepared = helper.prepare(index_sample)
    prepare_time = time.time() - t3
    return samples, prepared, decoder_time, prepare_time
"""


def test_a_model_method_run_on_a_placed_tensor_is_device_work_to_time() -> None:
    assert _lines(DECODE, "TPL301", "/nonexistent/app.py") == [8]


PREPARED = """\
from accelerate import Accelerator

def main(model, optimizer, train_loader, val_loader, epochs):
    accelerator = Accelerator()
    model, optimizer, train_loader, val_loader = accelerator.prepare(
        model, optimizer, train_loader, val_loader
    )
    for epoch in range(epochs):
        for batch in train_loader:
            loss = model(batch)
            accelerator.backward(loss)
            optimizer.step()
        for batch in val_loader:
            for seq in batch:
                mask = seq == 3
                if not mask.any():
                    continue
"""


def test_the_loaders_accelerate_prepares_yield_device_batches() -> None:
    assert _lines(PREPARED, "TPL201", "/nonexistent/train.py") == [16]


CTC = """\
import torch
import torch.nn.functional as F
from torch import nn

class CRNN(nn.Module):
    def compute_loss(self, model_output, gt, seq_len):
        batch_len = model_output.shape[0]
        input_length = model_output.shape[1] * torch.ones(size=(batch_len,), dtype=torch.int32)
        probs = F.log_softmax(model_output.permute(1, 0, 2), dim=-1)
        return F.ctc_loss(probs, gt, input_length, torch.tensor(seq_len, dtype=torch.int))

    def forward(self, x, gt=None, seq_len=None):
        out = self.head(x)
        scale = torch.ones(out.shape[0])
        return self.compute_loss(out * scale, gt, seq_len)
"""


def test_the_lengths_a_ctc_loss_reads_on_the_host_are_left_alone() -> None:
    assert _lines(CTC, "TPL103", "/nonexistent/crnn.py") == [14]


VALIDATE = """\
VALIDATE_SEQ_LENS = (256, 512, 1024)

def train(model, loader, val_loaders, opt, device, steps):
    model = model.to(device)
    for i in range(steps):
        loss = model(next(loader).to(device))
        loss.backward()
        opt.step()
        if i % 100 == 0:
            for seq_len in VALIDATE_SEQ_LENS:
                val_loss = model(next(val_loaders[seq_len]).to(device))
                print(f"{seq_len}: {val_loss.item()}")
"""


def test_a_rare_branch_over_a_named_tuple_of_constants_is_rare() -> None:
    assert _lines(VALIDATE, "TPL201", "/nonexistent/train.py") == []


POSE = """\
import cv2
import numpy as np

def estimate_pose(kpts0, kpts1, K0, K1):
    E, mask = cv2.findEssentialMat(kpts0, kpts1, np.eye(3), method=cv2.RANSAC)
    return E

def validate(model, loader, device):
    model = model.to(device)
    errors = []
    for batch in loader:
        out = model(batch.to(device))
        pts0 = out["mkpts0"].cpu().numpy()
        pts1 = out["mkpts1"].cpu().numpy()
        scores = out["scores"].cpu().numpy()
        for b in range(len(pts0)):
            errors.append(estimate_pose(pts0[b], pts1[b], None, None))
        errors.append(scores.mean())
    return errors
"""


def test_copies_an_opencv_helper_computes_on_are_left_alone_outside_training() -> None:
    assert _lines(POSE, "TPL201", "/nonexistent/metrics.py") == [15]


PREFIX = """\
def train(model, loader, opt, device):
    model = model.to(device)
    for data in loader:
        for k in data.keys():
            if not k.startswith("name"):
                data[k] = data[k].to(device)
        print(">>", data["name"][0], data["mel"][0])
        loss = model(data["mel"]).mean()
        loss.backward()
        opt.step()
"""


def test_keys_a_moving_loop_skips_by_prefix_stay_on_the_host() -> None:
    found = lint_source(PREFIX, "/nonexistent/solver.py", select={"TPL201"})
    assert [f.line for f in found] == [7]
    assert all('data["mel"]' in f.message for f in found)


BACKWARD = """\
import time

def bench(model, x, y, device):
    model = model.to(device)
    x = x.to(device)
    outputs = model(x)
    start = time.perf_counter()
    outputs.loss.backward()
    backward_time = time.perf_counter() - start
    start = time.perf_counter()
    y.backward()
    other_time = time.perf_counter() - start
    return backward_time, other_time
"""


def test_a_backward_pass_from_a_placed_models_output_is_device_work() -> None:
    assert _lines(BACKWARD, "TPL301", "/nonexistent/bench.py") == [7]


DETACHED = """\
def encode(model, texts, output_device):
    output = model(texts)
    encoded_text = output.last_hidden_state.detach()
    encoded_text.to(output_device)
    model.to(output_device)
    return encoded_text
"""


def test_a_discarded_move_of_what_a_tensor_only_method_made() -> None:
    assert _lines(DETACHED, "TPL101", "/nonexistent/t5.py") == [4]
