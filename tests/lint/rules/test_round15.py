"""Corpus round 15: patterns found on new real code (RL agents, NLP fine-tuning and serving,
detection and segmentation trainers, GNNs), each as a minimal snippet: what is now reported and
its look-alikes."""

from __future__ import annotations

from torchplace.lint import lint_source

from .helpers import lines

# ---- TPL201: a loop that moves one item by a cast to a CUDA tensor type leaves the others

CAST_LOOP = """\
import torch


def evaluate(model, loader, size):
    Tensor = torch.cuda.FloatTensor if torch.cuda.is_available() else torch.FloatTensor
    labels = []
    for _, imgs, targets in loader:
        labels += targets[:, 1].tolist()
        imgs = imgs.type(Tensor)
        out = model(imgs)
        labels.append(out.sum().item())
    return labels
"""


def test_items_of_a_loop_that_casts_another_to_a_cuda_type_stay_on_the_host() -> None:
    # `targets` is never moved (line 8); the model's output is a device value (line 11)
    assert lines(CAST_LOOP, "TPL201") == [11]


def test_a_dtype_cast_is_not_a_move_of_the_loop() -> None:
    source = CAST_LOOP.replace("imgs.type(Tensor)", "imgs.type(torch.float16)")
    assert 8 not in lines(source, "TPL201")


# ---- TPL201: an identity test of a setting is not a logging branch, whatever its name

IDENTITY = """\
import torch


def update(self, steps):
    losses = []
    for _ in range(steps):
        log_prob = self.actor(self.buffer.sample())
        if self.coef_optimizer is not None and self.log_coef is not None:
            loss = -(self.log_coef * log_prob.detach()).mean()
            losses.append(loss.item())
            self.coef_optimizer.zero_grad()
            loss.backward()
            self.coef_optimizer.step()
    return losses
"""


def test_and_of_identity_tests_naming_log_is_not_rare() -> None:
    assert lines(IDENTITY, "TPL201") == [10]


def test_a_logging_flag_joined_by_and_is_still_rare() -> None:
    source = IDENTITY.replace(
        "if self.coef_optimizer is not None and self.log_coef is not None:",
        "if self.log_every and self.coef_optimizer is not None:",
    ).replace(
        "            self.coef_optimizer.zero_grad()\n"
        "            loss.backward()\n"
        "            self.coef_optimizer.step()\n",
        "",
    )
    assert lines(source, "TPL201") == []


# ---- TPL201: a condition on each row of a device tensor walked by a for loop

ROWS = """\
import torch


def positions(ids, device):
    valid = torch.tensor([ids], dtype=torch.long, device=device)
    out = []
    for index, mask in enumerate(valid[0]):
        if mask == 1:
            out.append(index)
    return out
"""


def test_a_condition_on_each_row_of_a_device_tensor_is_reported() -> None:
    assert lines(ROWS, "TPL201") == [8]


def test_a_condition_on_each_row_of_a_host_tensor_is_not() -> None:
    source = ROWS.replace(", device=device)", ")")
    assert lines(source, "TPL201") == []


def test_a_condition_on_items_zipped_with_device_rows_is_left_alone() -> None:
    source = """\
def accuracy(preds, labels, device):
    preds = preds.to(device)
    texts = decoder.decode(preds)
    n = 0
    for text, label in zip(texts, labels):
        if text == label:
            n += 1
    return n
"""
    assert lines(source, "TPL201") == []


# ---- TPL102: Hugging Face model classes are modules; an availability choice is hard-coded

HF_MODULE = """\
import torch
from transformers import BertForTokenClassification, BertTokenizer


class Tagger(BertForTokenClassification):
    def forward(self, input_ids):
        out = self.bert(input_ids)[0]
        buf = torch.zeros(out.shape, device="cuda")
        buf2 = torch.zeros(out.shape, device="cuda" if torch.cuda.is_available() else "cpu")
        return self.classifier(out + buf + buf2)


class Words(BertTokenizer):
    def encode_all(self, texts):
        return torch.zeros(len(texts), device="cuda")
"""


def test_a_subclass_of_a_pretrained_model_class_is_a_module() -> None:
    found = lint_source(HF_MODULE, "model.py", select={"TPL102"})
    assert [f.line for f in found] == [8, 9]
    assert "chosen by what the machine has" in found[1].message


def test_tensorflow_twins_and_tokenizers_are_not_modules() -> None:
    source = HF_MODULE.replace("BertForTokenClassification", "TFBertForTokenClassification")
    assert lines(source, "TPL102", "model.py") == []


def test_an_availability_choice_outside_a_module_is_left_to_tpl104() -> None:
    source = 'import torch\ndevice = torch.device("cuda" if torch.cuda.is_available() else "cpu")\n'
    assert lines(source, "TPL102") == []


def test_a_bare_cuda_in_a_module_of_multi_rank_code_is_both_rules() -> None:
    source = """\
import torch
import torch.distributed as dist
from torch import nn


class Head(nn.Module):
    def forward(self, x):
        return x + torch.zeros(x.shape, device="cuda")


def main():
    dist.init_process_group("nccl")
"""
    found = lint_source(source, "train.py", select={"TPL102", "TPL104"})
    assert sorted((f.line, f.code) for f in found) == [(8, "TPL102"), (8, "TPL104")]


# ---- TPL201: `Net.from_pretrained(...)` makes a `Net`, whose forward runs every batch

FROM_PRETRAINED = """\
import torch
from transformers import BertForTokenClassification


class Ner(BertForTokenClassification):
    def forward(self, input_ids, valid_ids=None):
        out = self.bert(input_ids)[0]
        for i in range(out.shape[0]):
            for j in range(out.shape[1]):
                if valid_ids[i][j].item() == 1:
                    out[i][j] = 0
        return self.classifier(out).mean()


def main(loader, device):
    model = Ner.from_pretrained("bert-base-cased")
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters())
    for batch in loader:
        input_ids, valid_ids = tuple(t.to(device) for t in batch)
        loss = model(input_ids, valid_ids)
        loss.backward()
        optimizer.step()
"""


def test_the_forward_of_a_model_built_with_from_pretrained_runs_per_batch() -> None:
    assert lines(FROM_PRETRAINED, "TPL201") == [10]


# ---- TPL801: parameter-group methods of the model, and moves through an alias

GROUPS = """\
import torch


class Trainer:
    def __init__(self, args, model):
        groups = [
            {"params": model.get_1x_lr_params(), "lr": args.lr},
            {"params": model.get_10x_lr_params(), "lr": args.lr * 10},
        ]
        optimizer = torch.optim.SGD(groups, momentum=0.9)
        self.model, self.optimizer = model, optimizer
        if args.cuda:
            self.model = torch.nn.DataParallel(self.model)
            self.model = self.model.cuda()
"""


def test_parameter_groups_from_model_methods_then_a_move_of_an_alias() -> None:
    assert lines(GROUPS, "TPL801") == [10]


def test_an_alias_rebound_to_another_model_is_not_the_optimizers_model() -> None:
    source = """\
import torch


def build(net, make):
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    holder = net
    holder = make()
    holder.cuda()
    return optimizer
"""
    assert lines(source, "TPL801") == []


def test_a_free_function_handing_out_parameters_is_not_followed() -> None:
    source = """\
import torch


def build(net, collect_params):
    optimizer = torch.optim.SGD(collect_params(net), lr=0.1)
    net.cuda()
    return optimizer
"""
    assert lines(source, "TPL801") == []
