"""Round 67: a generic base class subscripted (TPL102); an annotated attribute assignment, and a
list that only aliases modules the method registers (TPL501); a tokenizer given its text as
`**kw`, and a factory converted on the host before its non-blocking copy (TPL701); a model's own
`compute_*` method is no output (TPL201); a CUDA call in an `if` test is not guarded by that
test (TPL601)."""

from __future__ import annotations

from .helpers import lines as _lines

GENERIC = """\
from typing import Generic, TypeVar
from torch import nn

T = TypeVar("T")

class Embeddings(nn.Module, Generic[T]):
    pass

class TokenEmbeddings(Embeddings[int]):
    def forward(self, x):
        return x.cuda()
"""


def test_a_subclass_of_a_subscripted_generic_module_is_a_module() -> None:
    assert _lines(GENERIC, "TPL102") == [11]


ANNOTATED = """\
from typing import Optional
import torch
from torch import nn

class Model(nn.Module):
    def __init__(self, weight_list, device, n):
        super().__init__()
        self.loss_weights: Optional[torch.Tensor] = torch.FloatTensor(weight_list).to(device)
        self.count: int = 0
        self.heads: list[nn.Module] = []
        for i in range(n):
            head = nn.Linear(3, 3)
            self.add_module(f"head{i}", head)
            self.heads.append(head)

    def forward(self, x):
        return sum(h(x) for h in self.heads) * self.loss_weights
"""


def test_an_annotated_attribute_assignment_is_checked_as_a_plain_one() -> None:
    # the list of heads only aliases the modules `add_module` registers
    assert _lines(ANNOTATED, "TPL501") == [8]


TOKENIZED = """\
import torch

class Emb:
    def encode(self, texts, device, **kw):
        batch_encoding = self.tokenizer(texts, **kw, return_tensors="pt")
        return batch_encoding["input_ids"].to(device, non_blocking=True)
"""


def test_a_tokenizer_given_star_kwargs_still_builds_pageable_tensors() -> None:
    assert _lines(TOKENIZED, "TPL701") == [6]


CONVERTED = """\
import torch

def train(model, loader, rank):
    for images, texts in loader:
        logits = model(images.cuda(rank), texts.cuda(rank))
        truth = torch.arange(len(logits)).long()
        truth = truth.cuda(rank, non_blocking=True)
        (logits - truth).sum().backward()
"""


def test_a_factory_converted_on_the_host_is_pageable_memory() -> None:
    assert _lines(CONVERTED, "TPL701") == [7]


RERANK = """\
import torch

def evaluate(model, loader, feats, compute_errors, device):
    scores = []
    for batch in loader:
        sims = model(batch.to(device))
        topk_sim, topk_idx = sims.topk(k=8, dim=0)
        picked = feats[topk_idx.cpu()].to(device)
        scores.append(model.compute_itm(picked, batch))
    for batch, gt in loader:
        pred = model(batch.to(device))
        compute_errors(gt.numpy(), pred.cpu().numpy())
    return scores
"""


def test_a_models_own_compute_method_is_no_output_but_a_metric_function_is() -> None:
    assert _lines(RERANK, "TPL201") == [8]


IF_TEST = """\
import torch

def main():
    if torch.cuda.current_device() == 0:
        print("first")
    if torch.cuda.is_available() and torch.cuda.current_device() == 0:
        print("ok")
    if torch.cuda.current_device() == 0 and torch.cuda.is_available():
        print("late")
    x = torch.cuda.current_device() if torch.cuda.is_available() else -1

if __name__ == "__main__":
    main()
"""


def test_a_cuda_call_in_an_if_test_is_guarded_only_by_what_comes_before_it() -> None:
    assert _lines(IF_TEST, "TPL601") == [4, 8]


MODE_SWITCH = """\
import time
import torch

def main(model, loader, opt, epochs):
    model = model.cuda()
    end = time.time()
    for epoch in range(epochs):
        model.train()
        for x in loader:
            loss = model(x.cuda(non_blocking=True)).sum()
            loss.backward()
            opt.step()
            batch_time = time.time() - end
            end = time.time()
"""


def test_a_modules_mode_switch_is_not_a_whole_training_run() -> None:
    assert _lines(MODE_SWITCH, "TPL301") == [6]


SAVED = """\
import time
import torch

def main(model, loader, opt, path):
    model = model.cuda()
    for x in loader:
        model(x.cuda()).sum().backward()
        opt.step()
    t1 = time.time()
    torch.save({"state_dict": model.state_dict(), "optimizer": opt.state_dict()}, path)
    print("saved in", time.time() - t1)
"""


def test_torch_save_copies_device_tensors_to_the_host_and_waits() -> None:
    assert _lines(SAVED, "TPL301") == []


SET_UP = """\
import time
import torch

wall = time.perf_counter()
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
data = load_graph()
data.to(device, "x", "y")
model = get_model("gcn").to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
print(f"set up in {time.perf_counter() - wall:.4f}s")
"""


def test_set_up_that_copies_host_data_and_builds_an_optimizer_is_no_device_work() -> None:
    # an object moved in place and a model moved as it is built are blocking copies
    assert _lines(SET_UP, "TPL301") == []
    ran = SET_UP.replace("optimizer = ", "out = model(data)\noptimizer = ")
    assert _lines(ran, "TPL301") == [4]
