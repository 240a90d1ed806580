"""Corpus round 28: false positives found on anomaly detection, protein models, trajectory
prediction, continual and active learning, pruning, temporal graph networks and video
understanding code, each as the look-alike that must stay clean next to the pitfall that must
still be found."""

from __future__ import annotations

from torchplace.lint import lint_source


def _lines(source: str, code: str, path: str = "layers.py") -> list[int]:
    return [f.line for f in lint_source(source, path, select={code})]


# ---- TPL104: a bare `.cuda()` in the branch a script runs when it is not distributed

IMAGENET_SETUP = """\
import torch
import torch.distributed as dist


def main(args):
    args.distributed = args.world_size > 1
    if args.distributed:
        dist.init_process_group(backend="nccl", world_size=args.world_size)
    model = build()
    if args.gpu is not None:
        model = model.cuda(args.gpu)
    elif args.distributed:
        model.cuda()
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        model = torch.nn.DataParallel(model).cuda()
"""


def test_a_bare_cuda_in_the_single_process_branch_is_left_alone() -> None:
    assert _lines(IMAGENET_SETUP, "TPL104", "train.py") == [13]


def test_a_bare_cuda_after_the_distributed_branch_is_reported() -> None:
    source = IMAGENET_SETUP + "    criterion = torch.nn.CrossEntropyLoss().cuda()\n"
    assert _lines(source, "TPL104", "train.py") == [13, 17]


# ---- TPL104: "cuda" in a model holder under a test of CUDA's availability

EMBEDDER = """\
import torch


class EmbeddingGenerator:
    def __init__(self, nogpu=False):
        self.model = torch.hub.load("org/repo", "m")
        self.nogpu = nogpu
        if torch.cuda.is_available() and not self.nogpu:
            self.model = self.model.to(device="cuda")

    def run(self, loader):
        for toks in loader:
            if torch.cuda.is_available() and not self.nogpu:
                toks = toks.to(device="cuda")
            yield self.model(toks)
"""


def test_cuda_under_an_availability_test_in_a_model_holder_is_left_alone() -> None:
    assert _lines(EMBEDDER, "TPL104", "embed.py") == []


def test_cuda_under_a_setting_alone_in_a_model_holder_is_reported() -> None:
    source = EMBEDDER.replace("torch.cuda.is_available() and not self.nogpu", "not self.nogpu")
    assert _lines(source, "TPL104", "embed.py") == [9, 14]


# ---- TPL103: a factory used in a method of another factory's tensor, placed at the end

CAUSAL_MASK = """\
import numpy as np
import torch
from torch import nn


class MaskedSelfAttention(nn.Module):
    def forward(self, x):
        n = x.shape[1]
        mask = (
            torch.zeros(n, n)
            .masked_fill(torch.tril(torch.ones(n, n)) == 0, -np.inf)
            .to(x.device)
        )
        return x + mask
"""


def test_a_factory_operand_of_a_placed_factory_chain_is_left_alone() -> None:
    assert _lines(CAUSAL_MASK, "TPL103") == []


def test_a_factory_operand_of_the_input_is_reported() -> None:
    source = CAUSAL_MASK.replace("torch.zeros(n, n)\n", "x\n").replace(
        "            .to(x.device)\n", ""
    )
    assert _lines(source, "TPL103") == [11]


# ---- TPL103: a method's table stored on an attribute that the next statement places

SINUSOIDAL = """\
import math

import torch
from torch import nn


class SinusoidalPositionalEmbedding(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim
        self.register_buffer("_float_tensor", torch.FloatTensor(1))
        self.weights = None

    def forward(self, x):
        n = x.shape[1]
        if self.weights is None or n > self.weights.size(0):
            self.weights = self.get_embedding(n)
        self.weights = self.weights.type_as(self._float_tensor)
        return self.weights[:n]

    def get_embedding(self, n):
        emb = torch.exp(torch.arange(self.dim // 2, dtype=torch.float) * -math.log(1e4))
        emb = torch.arange(n, dtype=torch.float).unsqueeze(1) * emb.unsqueeze(0)
        return torch.cat([torch.sin(emb), torch.cos(emb)], dim=1)
"""


def test_a_table_stored_then_placed_by_its_caller_is_left_alone() -> None:
    assert _lines(SINUSOIDAL, "TPL103") == []


def test_a_table_stored_and_used_unplaced_is_reported() -> None:
    source = SINUSOIDAL.replace(
        "        self.weights = self.weights.type_as(self._float_tensor)\n", ""
    )
    assert _lines(source, "TPL103") == [21, 22]


# ---- TPL103: factories collected in a list, then placed element by element

SCALES = """\
import torch
from torch import nn


class PoseExtractor(nn.Module):
    def forward(self, batch, boxes, sizes):
        images = self.transform(batch)
        scales = [torch.Tensor(new) / torch.Tensor([old[0], old[1]]) for old, new in sizes]
        boxes = [box * scale.repeat(2).to(box.device) for box, scale in zip(boxes, scales)]
        return self.head(images, boxes)
"""


def test_factories_placed_element_by_element_later_are_left_alone() -> None:
    assert _lines(SCALES, "TPL103") == []


def test_factories_combined_element_by_element_unplaced_are_reported() -> None:
    source = SCALES.replace(".to(box.device)", "")
    assert _lines(source, "TPL103") == [8, 8]


# ---- TPL501: empty placeholder tensors in a plain container

PLACEHOLDERS = """\
import torch
from torch import nn


class FeatureExtractor(nn.Module):
    def __init__(self, backbone, layers):
        super().__init__()
        self.backbone = backbone
        self.layers = layers
        self._features = {layer: torch.empty(0) for layer in self.layers}

    def forward(self, x):
        self._features = {layer: torch.empty(0) for layer in self.layers}
        self.backbone(x)
        return self._features
"""


def test_empty_placeholders_rebound_per_call_are_left_alone() -> None:
    assert _lines(PLACEHOLDERS, "TPL501") == []


def test_empty_placeholders_kept_as_a_cache_across_calls_are_reported() -> None:
    source = PLACEHOLDERS.replace(
        "        self._features = {layer: torch.empty(0) for layer in self.layers}\n"
        "        self.backbone(x)\n",
        "        self._features[0] = self.backbone(x)\n",
    )
    assert _lines(source, "TPL501") == [10]


# ---- TPL201: copies added in place into a host table by index

DROPOUT_PASSES = """\
import torch
import torch.nn.functional as F


def predict_prob_dropout(clf, loader, n, k, n_drop, device):
    probs = torch.zeros([n_drop, n, k])
    for i in range(n_drop):
        for x, y, idxs in loader:
            x = x.to(device)
            out = clf(x)
            probs[i][idxs] += F.softmax(out, dim=1).cpu()
    return probs
"""


def test_copies_added_into_a_host_table_are_left_alone() -> None:
    assert _lines(DROPOUT_PASSES, "TPL201") == []


def test_copies_added_into_a_device_table_are_reported() -> None:
    source = DROPOUT_PASSES.replace("[n_drop, n, k])", "[n_drop, n, k], device=device)")
    assert _lines(source, "TPL201") == [11]


# ---- TPL201: a copy stored through its name into a host buffer, its size read beside it

PREPROCESS = """\
import torch
from torch.utils.data import TensorDataset


def preprocess(feature_extractor, dataset_list, get_loader, size):
    device = feature_extractor.device()
    out = []
    for dataset in dataset_list:
        loader = get_loader(dataset)
        all_features = torch.empty((len(loader.dataset), size))
        all_labels = torch.empty((len(loader.dataset)), dtype=torch.long)
        count = 0
        for x, y in loader:
            x = feature_extractor(x.to(device)).cpu()
            all_features[count : (count + x.shape[0])] = x
            all_labels[count : (count + x.shape[0])] = y
            count += x.shape[0]
        out.append(TensorDataset(all_features, all_labels))
    return out
"""


def test_a_copy_stored_into_a_host_buffer_through_its_name_is_left_alone() -> None:
    assert _lines(PREPROCESS, "TPL201") == []


def test_a_copy_whose_values_are_also_read_is_reported() -> None:
    source = PREPROCESS.replace(
        "            count += x.shape[0]\n",
        "            count += x.shape[0]\n            norms.append(x.norm())\n",
    )
    assert _lines(source, "TPL201") == [14]


# ---- TPL201: a pass that stores each metric of a mapping, converted, under its own key,
# inside a loop over a few literal settings rows

METRICS = """\
import torch


def compute(pred, target, sep):
    return {"auc": (pred * target)[sep:].mean(), "p": pred[sep:].max()}


def evaluate_prediction(predictions, targets):
    metrics = {}
    targets = targets.to(predictions.device)
    ranges = [("local", 3), ("short", 6), ("long", 12)]
    for name, sep in ranges:
        scores = compute(predictions, targets, sep)
        for key, val in scores.items():
            metrics[f"{name}_{key}"] = val.item()
    return metrics
"""


def test_metrics_stored_by_key_from_a_mapping_are_left_alone() -> None:
    assert _lines(METRICS, "TPL201") == []


def test_metrics_also_summed_in_the_pass_are_reported() -> None:
    source = METRICS.replace(
        '            metrics[f"{name}_{key}"] = val.item()\n',
        '            metrics[f"{name}_{key}"] = val.item()\n            total += val.item()\n',
    )
    assert _lines(source, "TPL201") == [15, 16]


# ---- TPL301: a timed call of a method of a helper object whose body reads back

PREDICTOR = """\
import time

import torch


class Predictor:
    def __init__(self, model, device):
        self.model = model.to(device)
        self.device = device

    def predict(self, task):
        with torch.no_grad():
            scores = self.model(task.frames.to(self.device))
        task.preds = scores.cpu().numpy()


def main(model, tasks, args):
    device = args.device
    predictor = Predictor(model, device=device)
    for task in tasks:
        start = time.time()
        predictor.predict(task)
        print(f"inference {time.time() - start:.3f}s")
"""


def test_a_helper_method_that_reads_back_is_left_alone() -> None:
    assert _lines(PREDICTOR, "TPL301", "demo.py") == []


def test_a_helper_method_that_only_launches_is_reported() -> None:
    source = PREDICTOR.replace("scores.cpu().numpy()", "scores")
    assert _lines(source, "TPL301", "demo.py") == [21]


# ---- TPL301: a timed rollout that steps a host environment on the policy's output

ROLLOUT = """\
import time

import torch


def collect(env, policy, device, n):
    policy.to(device)
    start = time.time()
    obs = env.reset()
    for _ in range(n):
        action, _ = policy.get_action(obs)
        obs, _, _, _ = env.step(action)
    print("collected", time.time() - start)
"""


def test_a_rollout_stepping_an_environment_on_the_policy_output_is_left_alone() -> None:
    assert _lines(ROLLOUT, "TPL301", "collect.py") == []


def test_a_rollout_stepping_on_random_actions_is_reported() -> None:
    source = ROLLOUT.replace("env.step(action)", "env.step(env.action_space.sample())")
    assert _lines(source, "TPL301", "collect.py") == [8]


# ---- TPL201: the sizes an all-gather hands back of a packed host value

GATHER_SIZES = """\
import pickle

import torch
import torch.distributed as dist


def all_gather(data, world_size):
    buffer = pickle.dumps(data)
    tensor = torch.ByteTensor(torch.ByteStorage.from_buffer(buffer)).to("cuda")
    local_size = torch.IntTensor([tensor.numel()]).to("cuda")
    size_list = [torch.IntTensor([0]).to("cuda") for _ in range(world_size)]
    dist.all_gather(size_list, local_size)
    size_list = [int(size.item()) for size in size_list]
    return max(size_list)
"""


def test_gathered_sizes_of_a_packed_host_value_are_left_alone() -> None:
    assert _lines(GATHER_SIZES, "TPL201", "comm.py") == []


def test_gathered_values_computed_on_the_device_are_reported() -> None:
    source = GATHER_SIZES.replace(
        "    dist.all_gather(size_list, local_size)\n",
        "    local_size = local_size * 2\n    dist.all_gather(size_list, local_size)\n",
    )
    assert _lines(source, "TPL201", "comm.py") == [14]


# ---- TPL103: a layer-drop draw walked through `zip` as a comprehension's filter

LAYER_DROP = """\
import torch
from torch import nn


class ReversibleSequence(nn.Module):
    def __init__(self, blocks, layer_dropout=0.0):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.layer_dropout = layer_dropout

    def forward(self, x):
        blocks = self.blocks
        if self.training and self.layer_dropout > 0:
            to_drop = torch.empty(len(self.blocks)).uniform_(0, 1) < self.layer_dropout
            blocks = [block for block, drop in zip(self.blocks, to_drop) if not drop]
        for block in blocks:
            x = block(x)
        return x
"""


def test_a_layer_drop_draw_read_as_filter_tests_is_left_alone() -> None:
    assert _lines(LAYER_DROP, "TPL103") == []


def test_a_layer_drop_draw_combined_with_the_input_is_reported() -> None:
    source = LAYER_DROP.replace(
        "[block for block, drop in zip(self.blocks, to_drop) if not drop]",
        "self.blocks\n            x = x * to_drop.float().mean()",
    )
    assert _lines(source, "TPL103") == [14]
