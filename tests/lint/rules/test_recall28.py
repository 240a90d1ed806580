"""Recall round 28: pitfalls missed on reinforcement-learning agents, tutorial notebooks,
self-supervised multi-crop training, a text-to-speech model's submodules, detection reference
engines, optical-flow evaluation, retrieval fine-tuning, latency measurement, NeRF embeddings
and preference-tuning trainers, each next to the look-alike that must stay clean: the loss a
training-step helper is handed and backpropagates, a submodule's ``forward`` whose per-batch
caller was first asked about deep in a chain of callers, device values handed to a logger's
``**kwargs``, a NumPy function that hands back the tensor it is given, ``non_blocking`` copies
of a join or a host conversion, input built on the device of a model's parameters, a greedy
decoding loop that grows its token list, a helper named ``InputPadder`` taken for an output, a
``collate_fn`` that places each batch, arithmetic of a factory kept as an attribute, and a
``Trainer`` subclass's ``compute_loss``."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import lines as _lines
from .helpers import project as _project

# ---- TPL201: the loss a training-step helper is handed and backpropagates

AGENT = """\
import torch


class Agent:
    def __init__(self, config):
        self.device = "cuda:0" if config.use_gpu else "cpu"

    def take_optimisation_step(self, optimizer, network, loss, clipping_norm=None):
        optimizer.zero_grad()
        loss.backward()
        self.logger.info("Loss -- {}".format(loss.item()))
        if clipping_norm is not None:
            torch.nn.utils.clip_grad_norm_(network.parameters(), clipping_norm)
        optimizer.step()
"""


def test_the_loss_a_step_helper_backpropagates_is_read_per_batch() -> None:
    assert _lines(AGENT, "TPL201") == [11]


def test_another_value_the_step_helper_is_handed_is_left_alone() -> None:
    # `lengths` is the caller's data, maybe host lengths for packing: not what it trains on
    source = AGENT.replace(
        "take_optimisation_step(self, optimizer, network, loss, clipping_norm=None)",
        "take_optimisation_step(self, optimizer, network, loss, lengths, clipping_norm=None)",
    ).replace("format(loss.item())", "format(lengths.tolist())")
    assert _lines(source, "TPL201") == []


def test_the_handed_loss_in_a_file_that_names_no_device_is_left_alone() -> None:
    source = AGENT.replace(
        '        self.device = "cuda:0" if config.use_gpu else "cpu"\n', "        pass\n"
    )
    assert _lines(source, "TPL201") == []


# ---- TPL201: a submodule's forward, whatever was asked about first

INNER = """\
import torch.nn as nn


class LengthRegulator(nn.Module):
    def forward(self, x, duration):
        out = []
        for i, vec in enumerate(x):
            out.append(vec.expand(int(duration[i].item()), -1))
        return out


class VarianceAdaptor(nn.Module):
    def __init__(self):
        super().__init__()
        self.length_regulator = LengthRegulator()

    def forward(self, x, duration):
        total = duration.sum().item()
        return self.length_regulator(x, duration), total
"""

OUTER = """\
import torch.nn as nn

from .modules import VarianceAdaptor


class Synthesizer(nn.Module):
    def __init__(self):
        super().__init__()
        self.variance_adaptor = VarianceAdaptor()

    def forward(self, texts, durations):
        return self.variance_adaptor(texts, durations)
"""

TRAIN = """\
import torch

from model.synthesizer import Synthesizer

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def main(loader):
    model = Synthesizer().to(device)
    optimizer = torch.optim.Adam(model.parameters())
    for step, (texts, durations) in enumerate(loader):
        texts, durations = texts.to(device), durations.to(device)
        out, total = model(texts, durations)
        loss = out[0].sum()
        loss.backward()
        optimizer.step()
"""


def _synthesizer(root: Path, train: str) -> list[tuple[str, int]]:
    files = {
        "model/__init__.py": "",
        "model/modules.py": INNER,
        "model/synthesizer.py": OUTER,
        "train.py": train,
    }
    return _project(root, files, "TPL201")


def test_a_submodule_forward_reached_from_the_batch_loop_is_reported(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # the inner module's read comes first in its file and is two submodules deep, out of the
    # callers' depth; asking about it first must not hide the outer module's read
    root = tmp_path_factory.mktemp("project")
    assert ("model/modules.py", 18) in _synthesizer(root, TRAIN)


def test_a_submodule_forward_run_only_every_few_steps_is_left_alone(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("project")
    train = TRAIN.replace(
        "        out, total = model(texts, durations)\n",
        "        out = model.encode(texts)\n"
        "        if step % 500 == 0:\n"
        "            out, total = model(texts, durations)\n",
    )
    assert _synthesizer(root, train) == []


# ---- TPL201: device values handed to a logger's **kwargs

LOGGER = """\
from collections import defaultdict

import torch


class SmoothedValue:
    def __init__(self):
        self.total = 0.0

    def update(self, value):
        self.total += value


class MetricLogger:
    def __init__(self, delimiter="\\t"):
        self.meters = defaultdict(SmoothedValue)
        self.delimiter = delimiter

    def update(self, **kwargs):
        for k, v in kwargs.items():
            if isinstance(v, torch.Tensor):
                v = v.item()
            self.meters[k].update(v)
"""

EVALUATE = """\
import utils


def evaluate(model, data_loader, device):
    metric_logger = utils.MetricLogger(delimiter="  ")
    for images, targets in data_loader:
        images = list(image.to(device) for image in images)
        targets = [{k: v.to(device) for k, v in t.items()} for t in targets]
        loss_dict = model(images, targets)
        losses = sum(loss for loss in loss_dict.values())
        metric_logger.update(loss=losses, **loss_dict)
    return metric_logger
"""


def test_device_values_handed_to_a_loggers_kwargs_are_read_per_batch(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("project")
    files = {"utils.py": LOGGER, "engine.py": EVALUATE}
    assert _project(root, files, "TPL201") == [("utils.py", 22)]


def test_host_numbers_handed_to_a_loggers_kwargs_are_left_alone(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("project")
    evaluate = EVALUATE.replace(
        "metric_logger.update(loss=losses, **loss_dict)",
        "metric_logger.update(loss=losses.item(), n=len(images))",
    )
    files = {"utils.py": LOGGER, "engine.py": evaluate}
    assert _project(root, files, "TPL201") == [("engine.py", 11)]


# ---- TPL201: a NumPy function that hands back the tensor it is given

SQUEEZE = """\
import numpy as np
import torch


def test(loaders, model, use_cuda):
    correct = 0.0
    model.eval()
    for data, target in loaders["test"]:
        if use_cuda:
            data, target = data.cuda(), target.cuda()
        output = model(data)
        pred = output.data.max(1, keepdim=True)[1]
        correct += np.sum(np.squeeze(pred.eq(target.data.view_as(pred))).cpu().numpy())
        labels = np.squeeze(np.array([1, 2])).tolist()
    print(correct)
"""


def test_a_copy_of_what_np_squeeze_hands_back_is_reported() -> None:
    # `np.squeeze(t)` runs `t.squeeze()`: still a device tensor, copied back every batch
    assert _lines(SQUEEZE, "TPL201") == [13]


def test_np_squeeze_of_a_host_array_stays_on_the_host() -> None:
    source = SQUEEZE.replace(
        "np.squeeze(pred.eq(target.data.view_as(pred))).cpu().numpy()",
        "np.squeeze(np.ones(3)).tolist()",
    )
    assert _lines(source, "TPL201") == []


# ---- TPL701: a non_blocking copy of a join or of a host conversion

MULTI_CROP = """\
import torch
import torch.nn as nn


class MultiCropWrapper(nn.Module):
    def __init__(self, backbone):
        super().__init__()
        self.backbone = backbone

    def forward(self, inputs, idx_crops):
        start_idx, output = 0, []
        for end_idx in idx_crops:
            _out = self.backbone(torch.cat(inputs[start_idx:end_idx]).cuda(non_blocking=True))
            output.append(_out)
            start_idx = end_idx
        return torch.cat(output)
"""


def test_a_non_blocking_copy_of_a_join_is_reported() -> None:
    # `torch.cat` of the loader's crops allocates new pageable memory: nothing to overlap
    assert _lines(MULTI_CROP, "TPL701") == [13]


def test_a_non_blocking_copy_of_a_pinned_join_is_left_alone() -> None:
    source = MULTI_CROP.replace(
        "torch.cat(inputs[start_idx:end_idx]).cuda(",
        "torch.cat(inputs[start_idx:end_idx]).pin_memory().cuda(",
    )
    assert _lines(source, "TPL701") == []


def test_a_join_of_device_tensors_is_left_alone() -> None:
    source = """\
import torch


def gather(parts, device):
    moved = [p.to(device) for p in parts]
    return torch.cat(moved).to(device, non_blocking=True)
"""
    assert _lines(source, "TPL701") == []


def test_a_host_conversion_before_the_copy_is_reported() -> None:
    source = """\
import numpy as np
import torch


def to_device(tokens, device):
    ids = torch.cat([torch.from_numpy(t) for t in tokens])
    inputs = ids[:-1].to(dtype=torch.int32).to(device, non_blocking=True)
    frames = torch.from_numpy(np.stack(tokens)).float().cuda(non_blocking=True)
    return inputs, frames
"""
    assert _lines(source, "TPL701") == [7, 8]


# ---- TPL301: input built on the device a model's parameters are on

LATENCY = """\
import time

import torch


def get_net_device(net):
    return next(net.parameters()).device


def measure_latency(net, data_shape, n_sample):
    images = torch.zeros(data_shape, device=next(net.parameters()).device)
    net.eval()
    with torch.no_grad():
        start = time.time()
        for _ in range(n_sample):
            net(images)
        total = time.time() - start
    return total / n_sample
"""


def test_timing_a_model_on_the_device_of_its_parameters_is_reported() -> None:
    assert _lines(LATENCY, "TPL301") == [14]


def test_the_device_helper_counts_as_the_models_device() -> None:
    source = LATENCY.replace("device=next(net.parameters()).device", "device=get_net_device(net)")
    assert _lines(source, "TPL301") == [14]


def test_input_built_on_the_device_of_another_tensor_is_left_alone() -> None:
    # `device=batch[0].device` follows data whose place nothing here says
    source = LATENCY.replace(
        "def measure_latency(net, data_shape, n_sample):",
        "def measure_latency(net, data_shape, n_sample, batch):",
    ).replace("device=next(net.parameters()).device", "device=batch[0].device")
    assert _lines(source, "TPL301") == []


def test_timing_with_a_synchronize_is_left_alone() -> None:
    source = LATENCY.replace(
        "        total = time.time() - start",
        "        torch.cuda.synchronize()\n        total = time.time() - start",
    )
    assert _lines(source, "TPL301") == []


# ---- TPL201: a greedy decoding loop that grows its token list in place

DECODE = """\
import torch


def translate_sentence(src_indexes, trg_field, model, device, max_len=50):
    model.eval()
    src_tensor = torch.LongTensor(src_indexes).unsqueeze(0).to(device)
    with torch.no_grad():
        enc_src = model.encoder(src_tensor)
    trg_indexes = [trg_field.init_index]
    for i in range(max_len):
        trg_tensor = torch.LongTensor(trg_indexes).unsqueeze(0).to(device)
        with torch.no_grad():
            output = model.decoder(trg_tensor, enc_src)
        pred_token = output.argmax(2)[:, -1].item()
        trg_indexes.append(pred_token)
        if pred_token == trg_field.eos_index:
            break
    return trg_indexes
"""


def test_a_decoding_loop_fed_by_the_list_it_grows_reads_per_token() -> None:
    assert _lines(DECODE, "TPL201") == [14]


def test_a_loop_that_only_collects_into_a_list_is_not_a_decoding_loop() -> None:
    # the list is read nowhere before it grows: each step starts from the same input
    source = DECODE.replace(
        "torch.LongTensor(trg_indexes).unsqueeze(0)", "torch.LongTensor(src_indexes).unsqueeze(0)"
    )
    assert _lines(source, "TPL201") == []


# ---- TPL201: a helper whose name holds "put" (`InputPadder`) writes nothing out

VALIDATE = """\
import numpy as np
import torch


def validate(model, names):
    results = {}
    for dstype in names:
        dataset = FlowDataset(split="training", dstype=dstype)
        epe_list = []
        for val_id in range(len(dataset)):
            image1, image2, flow_gt = dataset[val_id]
            image1 = image1[None].cuda()
            image2 = image2[None].cuda()
            padder = InputPadder(image1.shape)
            image1, image2 = padder.pad(image1, image2)
            flow_pr = model(image1, image2)
            flow = padder.unpad(flow_pr[0]).cpu()
            epe = torch.sum((flow - flow_gt) ** 2, dim=0).sqrt()
            epe_list.append(epe.view(-1).numpy())
        results[dstype] = np.mean(np.concatenate(epe_list))
    return results
"""


def test_a_metric_copy_beside_an_input_padder_is_reported() -> None:
    # neither `InputPadder(...)` nor the key `dstype` the mean is stored under is an output
    assert _lines(VALIDATE, "TPL201") == [17]


def test_a_copy_put_on_a_queue_is_the_loops_output() -> None:
    source = VALIDATE.replace(
        "def validate(model, names):", "def validate(model, names, out_queue):"
    ).replace(
        "            flow = padder.unpad(flow_pr[0]).cpu()\n",
        "            flow = padder.unpad(flow_pr[0]).cpu()\n            out_queue.put(flow)\n",
    )
    assert _lines(source, "TPL201") == []


def test_a_copy_set_as_another_runtimes_input_is_left_alone() -> None:
    # OpenCV DNN takes NumPy: the copy is that runtime's input, whatever the loop computes
    source = VALIDATE.replace(
        "def validate(model, names):", "def validate(model, names, net):"
    ).replace(
        "            flow = padder.unpad(flow_pr[0]).cpu()\n",
        "            flow = padder.unpad(flow_pr[0]).cpu()\n            net.setInput(flow.numpy())\n",
    )
    assert _lines(source, "TPL201") == []


# ---- TPL201: a loader whose collate_fn puts each batch on the device

COLLATE = """\
import functools

import torch
from torch.utils.data import DataLoader, SequentialSampler
from tqdm import tqdm


def evaluate_retriever(model, dataset, tokenizer, args):
    model.eval()
    sampler = SequentialSampler(dataset)
    model_collate_fn = functools.partial(
        make_retriever_batch, tokenizer=tokenizer, max_len=args.max_length, device="cuda:0"
    )
    data_loader = DataLoader(dataset, batch_size=8, sampler=sampler, collate_fn=model_collate_fn)
    epoch_iterator = tqdm(data_loader, desc="Iteration")
    tot_loss = 0.0
    with torch.no_grad():
        for step, batch in enumerate(epoch_iterator):
            q_ids, q_mask, a_ids, a_mask = batch
            loss = model(q_ids, q_mask, a_ids, a_mask)
            tot_loss += loss.item()
    return tot_loss / (step + 1)
"""


def test_a_loss_read_from_batches_a_collate_fn_placed_is_reported() -> None:
    assert _lines(COLLATE, "TPL201") == [21]


def test_a_lambda_collate_that_moves_the_batch_counts_too() -> None:
    source = COLLATE.replace(
        "collate_fn=model_collate_fn)",
        "collate_fn=lambda b: to_device(collate(b), args.device))",
    )
    assert _lines(source, "TPL201") == [21]


def test_a_collate_fn_given_no_device_is_left_alone() -> None:
    source = COLLATE.replace(', device="cuda:0"', "")
    assert _lines(source, "TPL201") == []


def test_a_collate_fn_given_the_cpu_is_left_alone() -> None:
    source = COLLATE.replace('device="cuda:0"', 'device="cpu"')
    assert _lines(source, "TPL201") == []


# ---- TPL501: arithmetic of a factory kept as a plain attribute

EMBEDDING = """\
import torch
from torch import nn


class Embedding(nn.Module):
    def __init__(self, in_channels, n_freqs, logscale=True):
        super().__init__()
        self.funcs = [torch.sin, torch.cos]
        if logscale:
            self.freq_bands = 2 ** torch.linspace(0, n_freqs - 1, n_freqs)
        else:
            self.freq_bands = torch.linspace(1, 2 ** (n_freqs - 1), n_freqs)

    def forward(self, x):
        out = [x]
        for freq in self.freq_bands:
            for func in self.funcs:
                out += [func(freq * x)]
        return torch.cat(out, -1)
"""


def test_arithmetic_of_a_factory_kept_as_an_attribute_is_reported() -> None:
    assert _lines(EMBEDDING, "TPL501") == [10, 12]


def test_arithmetic_of_a_zero_dim_value_is_left_alone() -> None:
    source = """\
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.scale = torch.tensor(dim) ** -0.5
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        return self.proj(x) * self.scale
"""
    assert _lines(source, "TPL501") == []


def test_arithmetic_of_a_factory_moved_where_it_is_read_is_left_alone() -> None:
    source = EMBEDDING.replace(
        "        for freq in self.freq_bands:",
        "        for freq in self.freq_bands.to(x.device):",
    )
    assert _lines(source, "TPL501") == []


# ---- TPL201: a Trainer subclass's compute_loss runs on every step

REWARD = """\
import torch
import torch.nn as nn
from transformers import Trainer


class RewardTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        chosen, rejected = torch.chunk(outputs.logits.squeeze(-1), chunks=2)
        loss = -nn.functional.logsigmoid(chosen - rejected).mean()
        with torch.no_grad():
            all_rewards = self.accelerator.gather(outputs.logits)
            self._metrics["mean_reward"].append(all_rewards.mean().item())
            accuracy = (chosen > rejected).float().mean()
            self._metrics["accuracy"].append(accuracy.item())
        return (loss, outputs) if return_outputs else loss
"""


def test_reads_in_a_trainers_compute_loss_are_per_batch() -> None:
    assert _lines(REWARD, "TPL201") == [13, 15]


def test_compute_loss_of_a_class_that_is_no_trainer_is_left_alone() -> None:
    # a loss helper of the project's own, called from who knows where
    source = REWARD.replace("class RewardTrainer(Trainer):", "class RewardHead:")
    assert _lines(source, "TPL201") == []


def test_a_trainer_method_with_another_signature_is_left_alone() -> None:
    source = REWARD.replace(
        "def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):",
        "def compute_loss(self, batch):\n        model, inputs = self.model, batch",
    )
    assert _lines(source, "TPL201") == []


# ---- TPL201: a method that runs its class's training-step helper is one step too

BASE_AGENT = """\
import torch


class BaseAgent:
    def __init__(self, config):
        self.device = "cuda:0" if config.use_gpu else "cpu"

    def take_optimisation_step(self, optimizer, network, loss):
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""

DQN = """\
import torch
import torch.nn.functional as F

from agents.base_agent import BaseAgent


class DQN(BaseAgent):
    def learn(self):
        states, actions, rewards = self.sample_experiences()
        q_values = self.q_network(states).gather(1, actions.long())
        loss = F.mse_loss(q_values, rewards)
        actions_list = [action.item() for action in actions]
        self.logger.info("Action counts {}".format(actions_list))
        self.take_optimisation_step(self.optimizer, self.q_network, loss)
"""


def test_a_method_that_runs_a_base_class_step_helper_reads_per_step(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("project")
    files = {
        "agents/__init__.py": "",
        "agents/base_agent.py": BASE_AGENT,
        "agents/dqn.py": DQN.replace("import torch\n", 'import torch\n\ndevice = "cuda"\n'),
    }
    assert _project(root, files, "TPL201") == [("agents/dqn.py", 14)]


def test_a_method_that_runs_the_step_helper_in_its_own_loop_is_left_alone(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # a whole round of updates, each a step of its own: the read above runs once per round
    root = tmp_path_factory.mktemp("project")
    dqn = DQN.replace("import torch\n", 'import torch\n\ndevice = "cuda"\n').replace(
        "        self.take_optimisation_step(self.optimizer, self.q_network, loss)",
        "        for _ in range(self.updates_per_round):\n"
        "            self.take_optimisation_step(self.optimizer, self.q_network, loss)",
    )
    files = {
        "agents/__init__.py": "",
        "agents/base_agent.py": BASE_AGENT,
        "agents/dqn.py": dqn,
    }
    assert _project(root, files, "TPL201") == []


def test_a_step_helper_of_the_same_file_counts_too() -> None:
    source = BASE_AGENT + "\n\n" + DQN.split("\n\n\n", 1)[1]
    assert _lines(source, "TPL201") == [19]
