"""Round 66: a split f-string in a print reported where its value is, `torch.sum(x)` as a
factory's size, `add_scalars` of device values, a dict rewritten under its own keys (TPL201); a
device chosen by what the machine has through a name (TPL102); a repeated list stacked, and an
attribute moved as an arm of a choice (TPL501); a CPU-mapped `else` under a test that is not
about the device (TPL401)."""

from __future__ import annotations

from .helpers import lines as _lines

SPLIT_PRINT = """\
import torch

def train(model, loader, opt, num_epochs, rank):
    model = model.to(rank)
    for epoch in range(num_epochs):
        for features, labels in loader:
            features = features.to(rank)
            loss = model(features).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            print(f"[GPU{rank}] Epoch: {epoch + 1:03d}/{num_epochs:03d}"
                  f" | Loss: {loss:.2f}")
"""


def test_a_print_of_a_split_f_string_is_reported_at_the_value_it_reads() -> None:
    assert _lines(SPLIT_PRINT, "TPL201") == [13]


def test_a_print_of_a_one_line_f_string_is_reported_at_the_print() -> None:
    source = SPLIT_PRINT.replace('f" | Loss: {loss:.2f}"', '" | done"').replace(
        '{num_epochs:03d}"', '{num_epochs:03d} {loss:.2f}"'
    )
    assert _lines(source, "TPL201") == [12]


FACTORY_SIZE = """\
import torch

def sample(model, img, steps, num_proposals):
    for step in steps:
        x = model(img.cuda())
        keep = x.sigmoid() > 0.5
        num_remain = torch.sum(keep)
        counted = keep.sum()
        x = torch.cat((x, torch.randn(1, num_proposals - num_remain, 4, device=x.device)), 1)
        y = torch.randn(1, num_proposals - counted, 4, device=x.device)
        z = torch.randn(1, torch.sum(torch.ones(3)).numel(), 4, device=x.device)
"""


def test_a_size_given_by_torch_sum_is_read_as_the_method_spelling_is() -> None:
    assert _lines(FACTORY_SIZE, "TPL201") == [9, 10]


ADD_SCALARS = """\
import torch

def train(model, loader, optimizer, writer, device):
    model = model.to(device)
    for step, (imgs, annot) in enumerate(loader):
        loss = model(imgs.to(device)).mean()
        loss.backward()
        optimizer.step()
        writer.add_scalars("Loss", {"train": loss}, step)
        writer.add_scalars("lr", {"train": optimizer.param_groups[0]["lr"]}, step)
        writer.add_scalars("n", tag_scalar_dict={"train": step}, global_step=step)
"""


def test_add_scalars_reads_each_device_value_of_its_dict() -> None:
    assert _lines(ADD_SCALARS, "TPL201") == [9]


OWN_KEYS = """\
import torch

def validate(model, loader, logger, eval_depth):
    results = {"d1": torch.tensor([0.0]).cuda(), "d2": torch.tensor([0.0]).cuda()}
    for sample in loader:
        cur = eval_depth(model(sample.cuda()))
        for k in results.keys():
            results[k] += cur[k]
    for name, metric in results.items():
        logger.info(f"{name} {metric.item()}")
"""


def test_a_dict_rewritten_under_its_own_keys_is_not_grown() -> None:
    # a loop over its few constant keys after the batch loop: once per key, not per batch
    assert _lines(OWN_KEYS, "TPL201") == []


def test_a_dict_stored_under_other_keys_grows() -> None:
    grown = OWN_KEYS.replace("results[k] += cur[k]", "results[f'{k}_{len(results)}'] = cur[k]")
    assert _lines(grown, "TPL201") == [10]


CHOSEN = """\
import torch
from torch import nn

class Depth(nn.Module):
    def forward(self, x):
        return x

    def image2tensor(self, raw):
        DEVICE = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
        image = torch.from_numpy(raw).to(DEVICE)
        mask = torch.zeros(3).to(DEVICE)
        return image, mask

    def follow(self, x):
        device = "cuda" if x.is_cuda else "cpu"
        return torch.zeros(3, device=device)
"""


def test_a_device_chosen_by_the_machine_through_a_name_is_reported_where_it_is_chosen() -> None:
    # once, at the choice; a choice by where the input is follows the input
    assert _lines(CHOSEN, "TPL102") == [9]


STACKED = """\
import torch
from torch import nn

class Layer(nn.Module):
    def __init__(self, n, device):
        super().__init__()
        idx = torch.arange(n, device=device)
        self.pose = torch.stack([idx] * 2)
        self.slots = [torch.empty(0)] * n

    def forward(self, x):
        return x + self.pose
"""


def test_a_stack_of_a_repeated_list_is_a_plain_tensor_attribute() -> None:
    assert _lines(STACKED, "TPL501") == [8]


CHOICE_MOVED = """\
import torch
from torch import nn

class World(nn.Module):
    def __init__(self, nc=80):
        super().__init__()
        self.txt_feats = torch.randn(1, nc, 512)
        self.proj = nn.Linear(512, 512)

    def forward(self, x, txt_feats=None):
        feats = (self.txt_feats if txt_feats is None else txt_feats).to(device=x.device)
        return self.proj(feats) + x
"""


def test_an_attribute_moved_as_an_arm_of_a_choice_is_moved_where_it_is_read() -> None:
    assert _lines(CHOICE_MOVED, "TPL501") == []
    unmoved = CHOICE_MOVED.replace(").to(device=x.device)", ")")
    assert _lines(unmoved, "TPL501") == [7]


SAFE_ONLY = """\
import torch

def load(f, safe_only=False):
    if safe_only:
        ckpt = torch.load(f, weights_only=True)
    else:
        ckpt = torch.load(f, map_location="cpu", weights_only=False)
    return ckpt

def load_cuda(f, args):
    if args.cuda:
        ckpt = torch.load(f, weights_only=True)
    else:
        ckpt = torch.load(f, map_location="cpu", weights_only=True)
    return ckpt
"""


def test_a_cpu_mapped_else_exempts_only_a_branch_chosen_by_the_device() -> None:
    assert _lines(SAFE_ONLY, "TPL401") == [5]


EXPERTS = """\
import torch

def train(model, loader, opt):
    for x, picks in loader:
        x, picks = x.cuda(), picks.cuda()
        hit = model(x).argmax(1) == picks
        if hit.nonzero(as_tuple=False).squeeze(-1).numel() == 0:
            continue
        rows = hit.nonzero().view(-1)
        model(x[rows.numel():]).sum().backward()
        opt.step()
"""


def test_the_size_of_a_view_of_nonzero_is_read_but_not_that_of_a_name_bound_to_it() -> None:
    # the host waits where the result is made; the size of a name bound to it is then known
    assert _lines(EXPERTS, "TPL201") == [7]


IN_PLACE_HELPER = """\
from torchtune import utils

class Recipe:
    def train(self):
        for batch in self._dataloader:
            utils.batch_to_device(batch, self._device)
            num_tokens = (batch["labels"] != -100).sum()
            loss = self._loss_step(batch) * num_tokens
            loss.backward()
            self._optimizer.step()
            self._log(f"tokens: {num_tokens}")
"""


def test_a_statement_helper_named_for_the_move_moves_its_mapping_in_place() -> None:
    assert _lines(IN_PLACE_HELPER, "TPL201") == [11]
    dropped = IN_PLACE_HELPER.replace("utils.batch_to_device(batch, self._device)", "pass")
    assert _lines(dropped, "TPL201") == []


COG = """\
from cog import BasePredictor
from min_dalle import MinDalle

class Predictor(BasePredictor):
    def setup(self):
        self.model = MinDalle(is_mega=True, device="cuda")

    def predict(self, text):
        return self.model.generate_image(text)

class Helper:
    def setup(self):
        self.model = MinDalle(is_mega=True, device="cuda")
"""


def test_a_serving_frameworks_set_up_hook_holds_the_model_as_init_does() -> None:
    # a plain class's method that happens to be named `setup` is no such hook
    assert _lines(COG, "TPL104") == [6]
