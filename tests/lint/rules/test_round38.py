"""Corpus round 38: false positives found on training templates and frameworks (Lightning +
Hydra, MosaicML examples, FairScale), DDP/Horovod/Apex data-parallel scripts, pruning,
distillation and quantization-aware training repositories, a recommendation model at scale
(DLRM), mobile network training and FLOPs/profiling tools, each as the look-alike that must
stay clean next to the pitfall that must still be found.

Tried and kept as findings: per-step ``.item()``/``.cpu()`` reads of losses and accuracies in
training and evaluation loops (also of all-reduced metrics), per-row reads of detections,
``.cuda()`` and bare ``"cuda"`` devices inside modules' ``__init__`` and ``forward``, bare
``"cuda"`` devices and ``--device`` defaults in multi-rank code, pruning masks built with a
bare ``.cuda()`` in multi-rank scripts that place the model with ``.cuda(args.gpu)``, optimizers
built before ``model.cuda()``, plain tensor attributes of a data-parallel wrapper,
``torch.cuda.synchronize()`` in a benchmark's batch loop, factories without ``device=`` in a
feature-interaction layer, ``torch.load`` without ``map_location``/``weights_only``, per-batch
timers and a latency helper read without a synchronize, a bare ``.cuda()`` before a
``DistributedDataParallel(model)`` given no ``device_ids``, and a Horovod script's unguarded
``torch.cuda.set_device(hvd.local_rank())`` (the first CUDA-only call of a CUDA-only script is
still the one reported)."""

from __future__ import annotations

from .helpers import lines

# ---- TPL201: the best score of an epoch loop, kept from what a whole validation pass returns

EPOCH_LOOP = """\
import torch
import torch.nn as nn


def count_zeros(model):
    total = 0
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            total += torch.sum(m.weight.data.eq(0))
    return total


def train(train_loader, model, criterion, optimizer):
    for images, target in train_loader:
        loss = criterion(model(images.cuda()), target.cuda())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def validate(val_loader, model):
    correct = 0
    for images, target in val_loader:
        output = model(images.cuda())
        correct += output.argmax(1).eq(target.cuda()).sum()
    return correct / len(val_loader.dataset)


def main(args, model, train_loader, val_loader, probe):
    model = model.cuda()
    criterion = nn.CrossEntropyLoss().cuda()
    optimizer = torch.optim.SGD(model.parameters(), args.lr)
    best_prec1 = 0.0
    for epoch in range(args.epochs):
        zeros = count_zeros(model)
        print("Zero parameters: {{}}".format(zeros))
        train(train_loader, model, criterion, optimizer)
        prec1 = {score}
        is_best = prec1 > best_prec1
        best_prec1 = max(prec1, best_prec1)
        torch.save({{"state_dict": model.state_dict(), "best_prec1": best_prec1}}, "last.pth")
"""


def test_best_scores_kept_from_a_whole_validation_pass_are_clean() -> None:
    source = EPOCH_LOOP.format(score="validate(val_loader, model)")
    assert lines(source, "TPL201", "main.py") == []


def test_scores_computed_on_the_device_every_epoch_step_are_found() -> None:
    source = EPOCH_LOOP.format(score="model(probe.cuda()).max()")
    # and `max(prec1, best_prec1)` compares the device score with `<`: a read too
    assert lines(source, "TPL201", "main.py") == [36, 40]


def test_a_pass_result_rebound_to_device_work_in_the_step_is_found() -> None:
    score = "validate(val_loader, model)\n        prec1 = prec1 + model(probe.cuda()).max()"
    assert lines(EPOCH_LOOP.format(score=score), "TPL201", "main.py") == [36, 41]


# ---- TPL201: activations parked back on the host in the slot they were fetched from

OFFLOAD_MODEL = """\
import torch
import torch.nn as nn


class OffloadModel(nn.Module):
    def __init__(self, slices):
        super().__init__()
        self.model_slices = nn.ModuleList(slices)
        self._activations = []

    def forward(self, *inputs):
        self._activations = [inputs]
        for index in range(len(self.model_slices)):
            self._activations[index] = tuple([a.cuda() for a in list(self._activations[index])])
            self.model_slices[index].cuda()
            outputs = self.model_slices[index](*self._activations[index])
            self._activations.append((outputs,))
            {park}
            self.model_slices[index].cpu()
        return self._activations[-1][0]
"""

PARKED = "self._activations[index] = tuple([a.cpu() for a in list(self._activations[index])])"


def test_activations_offloaded_back_to_their_own_slot_are_clean() -> None:
    assert lines(OFFLOAD_MODEL.format(park=PARKED), "TPL201", "offload.py") == []


def test_activations_copied_to_the_host_into_another_slot_are_found() -> None:
    park = PARKED.replace("[index])])", "[index + 1])])")
    assert lines(OFFLOAD_MODEL.format(park=park), "TPL201", "offload.py") == [18]


def test_activations_copied_to_the_host_into_a_local_are_found() -> None:
    park = "kept = [a.cpu() for a in self._activations[index]]"
    assert lines(OFFLOAD_MODEL.format(park=park), "TPL201", "offload.py") == [18]


def test_activations_parked_without_being_fetched_to_the_device_are_found() -> None:
    source = OFFLOAD_MODEL.format(park=PARKED).replace("a.cuda() for a", "a.float() for a")
    assert lines(source, "TPL201", "offload.py") == [18]


# ---- TPL103: a helper that a module's `__init__` hands the parameter it just built on the host

AFFINE_INIT = """\
import torch
import torch.nn as nn
from torch.nn import Parameter


def _initialize_affine_weight(weight, out_features, in_features, init_method, rank, world_size):
    master_weight = torch.empty(out_features, in_features, dtype=weight.dtype)
    init_method(master_weight)
    weight_list = torch.split(master_weight, out_features // world_size, dim=0)
    with torch.no_grad():
        torch.cat(weight_list[rank::world_size], dim=0, out=weight)
    return master_weight


class ColumnParallelLinear(nn.Module):
    def __init__(self, in_features, out_features, init_method, rank, world_size, device=None):
        super().__init__()
        self.weight = {weight}
        self.master_weight = _initialize_affine_weight(
            self.weight, out_features, in_features, init_method, rank, world_size
        )

    def forward(self, x):
        return x @ self.weight.t()
"""

HOST_WEIGHT = "Parameter(torch.empty(out_features // world_size, in_features))"


def test_helpers_given_a_parameter_just_built_on_the_host_are_clean() -> None:
    assert lines(AFFINE_INIT.format(weight=HOST_WEIGHT), "TPL103", "layers.py") == []


def test_helpers_given_a_parameter_built_on_a_device_are_found() -> None:
    weight = HOST_WEIGHT.replace("in_features))", "in_features, device=device))")
    assert lines(AFFINE_INIT.format(weight=weight), "TPL103", "layers.py") == [7]


def test_helpers_given_a_parameter_moved_before_the_call_are_found() -> None:
    weight = HOST_WEIGHT + "\n        self.weight = Parameter(self.weight.to(device))"
    assert lines(AFFINE_INIT.format(weight=weight), "TPL103", "layers.py") == [7]


# ---- TPL103: a bare `torch.Tensor()` standing in for an input a branch does not use

SPLIT_TARGETS = """\
import torch
import torch.nn as nn


class VocabOutput(nn.Module):
    def __init__(self, scale=None):
        super().__init__()
        self.scale = scale
        self.proj = nn.Linear(8, 32)

    def forward(self, input, target):
        inputs = torch.split(input, 4, 0)
        targets = tuple([{placeholder}] * len(inputs))
        if self.scale is not None:
            targets = torch.split(target, 4, 0)
        outs = []
        for i, tgt in zip(inputs, targets):
            outs.append(self.proj(i) + tgt.sum())
        return torch.cat(outs)
"""


def test_bare_empty_tensors_as_stand_ins_are_clean() -> None:
    source = SPLIT_TARGETS.format(placeholder="torch.Tensor()")
    assert lines(source, "TPL103", "vocab.py") == []


def test_stand_ins_with_elements_are_found() -> None:
    for placeholder in ("torch.Tensor(1)", "torch.zeros(1, 32)"):
        source = SPLIT_TARGETS.format(placeholder=placeholder)
        assert lines(source, "TPL103", "vocab.py") == [13]


# ---- TPL201: a loop over the ranks of a process group, each one the source of a broadcast

CONSOLIDATE = """\
import io

import torch
import torch.distributed as dist


def _broadcast_object(obj, src_rank, group=dist.group.WORLD, dist_device=torch.device("cpu")):
    if dist.get_rank() == src_rank:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        data = bytearray(buffer.getbuffer())
        length_tensor = torch.LongTensor([len(data)]).to(dist_device)
        data_send_tensor = torch.ByteTensor(data).to(dist_device)
        dist.broadcast(length_tensor, src=src_rank, group=group)
        dist.broadcast(data_send_tensor, src=src_rank, group=group)
    else:
        length_tensor = torch.LongTensor([0]).to(dist_device)
        dist.broadcast(length_tensor, src=src_rank, group=group)
        data_recv_tensor = torch.empty([int(length_tensor.item())], dtype=torch.uint8, device=dist_device)
        dist.broadcast(data_recv_tensor, src=src_rank, group=group)
        buffer = io.BytesIO(data_recv_tensor.cpu().numpy())
        obj = torch.load(buffer, map_location=dist_device)
    return obj


class OSS:
    def consolidate_state_dict(self, recipient_rank=0):
        self._all_states = []
        dist_device = torch.device("cuda") if self.backend == "nccl" else self._default_device
        for rank in range({ranks}):
            if rank == self.rank:
                state_to_share = self.optim.state_dict()
                _broadcast_object(state_to_share, src_rank=rank, dist_device=dist_device)
            else:
                replica_state = _broadcast_object(
                    torch.tensor([0], dtype=torch.uint8, device=dist_device),
                    src_rank=rank,
                    dist_device=dist_device,
                )
                self._all_states.append(replica_state)
"""


def test_loops_over_the_ranks_of_a_group_are_clean() -> None:
    for ranks in ("self.world_size", "dist.get_world_size()"):
        assert lines(CONSOLIDATE.format(ranks=ranks), "TPL201", "oss.py") == []


def test_the_same_exchange_in_a_loop_over_chunks_is_found() -> None:
    assert lines(CONSOLIDATE.format(ranks="self.num_chunks"), "TPL201", "oss.py") == [19]


# ---- TPL401: a cached dataset loaded back into a name for a dataset

CACHED_DATASET = """\
import os

import torch
import torchvision


def load_data(traindir, args):
    cache_path = os.path.expanduser(os.path.join("~", ".torch", "imagefolder.pt"))
    if args.cache_dataset and os.path.exists(cache_path):
        {target} = torch.load(cache_path)
    else:
        dataset = torchvision.datasets.ImageFolder(traindir)
        if args.cache_dataset:
            torch.save((dataset, traindir), cache_path)
    return dataset


def main(args):
    device = torch.device(args.device if torch.cuda.is_available() else "cpu")
    dataset = load_data(args.data_path, args)
    model = torchvision.models.resnet18().to(device)
    return model, dataset
"""


def test_cached_datasets_loaded_into_a_dataset_name_are_clean() -> None:
    for target in ("dataset, _", "dataset_test"):
        assert lines(CACHED_DATASET.format(target=target), "TPL401", "train.py") == []


def test_loads_into_other_names_are_found() -> None:
    for target in ("state, _", "weights"):
        assert lines(CACHED_DATASET.format(target=target), "TPL401", "train.py") == [10]
