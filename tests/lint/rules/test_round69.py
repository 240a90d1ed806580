"""Round 69: code under a one-process flag (`if single_device:`) is not multi-rank (TPL104)."""

from __future__ import annotations

from pathlib import Path

from .helpers import lines as _lines
from .helpers import project as _project

SINGLE_DEVICE = """\
import torch
from accelerate import Accelerator

class HFLM:
    def __init__(self, device=None, parallelize=False):
        accelerator = Accelerator()
        if accelerator.num_processes > 1:
            self.accelerator = accelerator
        single_device = not parallelize and not getattr(self, "accelerator", None)
        if single_device:
            self._device = (
                torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
            )
        else:
            self._device = torch.device("cuda")
        torch.distributed.all_reduce(torch.ones(1, device=self._device))
"""


def test_a_fallback_under_a_single_device_flag_runs_in_one_process() -> None:
    assert _lines(SINGLE_DEVICE, "TPL104") == [15]


TOPK_BRANCH = """\
import torch

def top(model, x, device, as_dict):
    probs = model(x.to(device))
    values, indices = torch.topk(probs, k=5)
    if as_dict:
        values = [float(v) for v in values]
        return values
    return indices

def after_early_return(model, x, device, done):
    if done:
        return None
    else:
        ids = model(x.to(device)).argmax(-1)
        return [int(i) for i in ids]
"""


def test_a_comprehension_in_a_branch_that_returns_is_still_a_loop_over_rows() -> None:
    # the branch runs once, but the comprehension inside it reads every row; and the `else`
    # of an `if` whose body returns is no branch that leaves
    assert _lines(TOPK_BRANCH, "TPL201") == [7, 16]


SETTINGS_MODULE = """\
import torch
from modules import shared

def logits(prompt, device):
    tokens = shared.tokenizer.encode(prompt, return_tensors="pt").to(device)
    output = shared.model(input_ids=tokens)
    values, indices = torch.topk(output["logits"][-1][-1], k=5)
    words = [shared.tokenizer.decode(i) for i in indices]
    for word in words:
        print(word)
    return [float(v) for v in values]
"""


def test_a_model_held_by_an_imported_module_runs_where_its_inputs_are() -> None:
    # the decoded words are host text: printing them reads nothing
    assert _lines(SETTINGS_MODULE, "TPL201") == [11]


ACCUMULATION = """\
import torch

def train_epoch(model, loader, optim, accum_grad, log_every, to_device, device):
    for batch_idx, batch in enumerate(loader):
        batch = to_device(batch, device)
        loss, stats = model(**batch)
        loss.backward()
        if (batch_idx + 1) % accum_grad == 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if not torch.isfinite(grad_norm):
                optim.zero_grad()
                continue
            optim.step()
            optim.zero_grad()
        if (batch_idx + 1) % log_every == 0:
            print(stats["acc"].item())
"""


def test_a_step_of_gradient_accumulation_is_every_optimizer_step_not_a_log_interval() -> None:
    # the norm of a module that ran on device inputs (whatever placed it) is on the device
    assert _lines(ACCUMULATION, "TPL201") == [10]


ANNEALED_POLICY = """\
import torch

def main(model, loader, opt, policy, log_every, device):
    model.to(device)
    for optim_step, batch in enumerate(loader):
        loss = model(batch.to(device))
        loss.backward()
        opt.step()
        if (optim_step + 1) % log_every == 0:
            print(loss.item())
            policy[1].step(optim_step)
"""


def test_a_step_given_a_count_trains_nothing_in_a_logging_branch() -> None:
    # TorchRL's exploration-noise annealing, `policy[1].step(frames)`, is no optimizer step
    assert _lines(ANNEALED_POLICY, "TPL201") == []


LAYER_WALK = """\
import matplotlib.pyplot as plt
import torch

def show_attention(model, src, device):
    model.to(device)
    model(src.to(device))
    for i, layer in enumerate(model.encoder.encoder_layers):
        plt.imshow(layer.attention.weights.cpu().numpy()[0])
    for module in model.modules():
        print(module.weight.sum().item())
"""


def test_a_walk_over_a_models_layers_is_not_a_walk_over_rows() -> None:
    assert _lines(LAYER_WALK, "TPL201") == []


CUDA_PICKED = """\
import os
import torch

def main():
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        local_rank = int(os.environ["LOCAL_RANK"])
        device = torch.device("cuda:{}".format(local_rank))
    else:
        device = torch.device("cuda:%d" % 0)
    torch.cuda.set_device(device)

if __name__ == "__main__":
    x = torch.ones(2).to(0)
    torch.cuda.synchronize()
"""

MAYBE_CPU = """\
import os
import torch

def main():
    if os.environ.get("X"):
        device = torch.device("cuda:{}".format(1))
    else:
        device = "cpu"
    torch.cuda.set_device(device)
"""


def test_cuda_picked_on_every_path_or_by_index_needs_no_check() -> None:
    assert _lines(CUDA_PICKED, "TPL601") == []
    assert _lines(MAYBE_CPU, "TPL601") == [9]  # the other arm runs on the CPU


LAZY_OR = """\
import gradio as gr
from transformers import BlipForConditionalGeneration

blip_model = None

def run(image):
    global blip_model
    blip_model = blip_model or BlipForConditionalGeneration.from_pretrained("b").to("cuda")
    return blip_model.generate(image)

demo = gr.Interface(fn=run, inputs="image", outputs="text")
"""


def test_a_load_behind_or_runs_once_per_process() -> None:
    assert _lines(LAZY_OR, "TPL403") == []


ENCODER = """\
import torch
from torch import nn

class TextEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x, lengths, skip_head=None):
        x = self.proj(x)
        if skip_head is not None:
            head = int(skip_head.item()) if isinstance(skip_head, torch.Tensor) else int(skip_head)
            x = x[:, head:]
        n = int(lengths.max().item())
        return x[:, :n]
"""

TRAIN = """\
import torch
from models import TextEncoder

def main(loader, device):
    model = TextEncoder().to(device)
    opt = torch.optim.Adam(model.parameters())
    for x, lengths in loader:
        loss = model(x.to(device), lengths.to(device)).sum()
        loss.backward()
        opt.step()
"""


def test_the_tensor_arm_of_an_optional_number_or_tensor_is_not_a_device_read(
    tmp_path: Path,
) -> None:
    # RVC's `int(skip_head.item()) if isinstance(skip_head, torch.Tensor) else int(skip_head)`
    # of a forward's `skip_head=None`: a number or a tensor, and nothing says which
    found = _project(tmp_path, {"models.py": ENCODER, "train.py": TRAIN}, "TPL201")
    assert found == [("models.py", 14)]


HELPER_MOVES = """\
import torch

class Engine:
    def __init__(self, model, loader_val, device):
        self.model, self.dataloader_val, self.device = model, loader_val, device

    def load_data_compute_loss(self, data):
        rgb = data["rgb"].to(self.device, dtype=torch.float32)
        label = data["label"].to(self.device)
        return {"l1": (self.model(rgb) - label).abs().mean()}

    @torch.inference_mode()
    def validate(self):
        total = 0.0
        for data in self.dataloader_val:
            losses = self.load_data_compute_loss(data)
            loss = torch.tensor(0.0).to(self.device)
            for key, value in losses.items():
                loss += value
            total += float(loss.item())
        return total
"""


def test_a_loop_that_hands_its_batch_to_a_method_that_moves_it_is_a_batch_loop() -> None:
    assert _lines(HELPER_MOVES, "TPL201") == [20]


SCALER_METHOD = """\
import torch
from torch.cuda.amp.grad_scaler import GradScaler

class Trainer:
    def __init__(self, model, opt):
        self.model = model.cuda()
        self.opt = opt
        self.grad_scaler = GradScaler(enabled=True)

    def train_iteration(self, batch):
        loss = self.model(batch.cuda()).sum()
        self.grad_scaler.scale(loss).backward()
        self.grad_scaler.step(self.opt)
        scale = self.grad_scaler.get_scale()
        self.grad_scaler.update()
        return scale

    def train(self, loader):
        for batch in loader:
            self.train_iteration(batch)
"""


def test_get_scale_in_a_step_method_reads_the_scale_kept_with_the_loss() -> None:
    assert _lines(SCALER_METHOD, "TPL201") == [14]


DECODED = """\
import numpy as np
import torch

@torch.no_grad()
def generate_until(model, tokenizer, chunks, device):
    res = []
    for chunk in chunks:
        ids = tokenizer(chunk, return_tensors="pt").input_ids.to(device)
        cont = model.generate(ids)
        cont_toks_list = cont.tolist()
        for toks in cont_toks_list:
            res.append(tokenizer.decode(toks))
    return res

@torch.no_grad()
def greedy(model, tokenizer, ids, device, max_len):
    ids = ids.to(device)
    text = []
    for _ in range(max_len):
        nxt = model(ids).argmax(-1)
        text.append(tokenizer.decode(nxt.tolist()))
        ids = torch.cat([ids, nxt[:, None]], 1)
    return text

@torch.no_grad()
def recognize(model, converter, loader, device):
    out = []
    for images in loader:
        prob = model(images.to(device)).softmax(2)
        prob = prob.cpu().numpy()
        prob = prob / prob.sum(axis=2, keepdims=True)
        prob = torch.from_numpy(prob).to(device)
        out.append(converter.decode_greedy(prob.argmax(2)))
    return out
"""


def test_each_batchs_generated_ids_copied_to_be_decoded_are_the_loops_output() -> None:
    # not a decoding loop of one token a step, nor a round trip back to the device
    assert _lines(DECODED, "TPL201") == [21, 30]


COMPARED = """\
import torch
from transformers import AutoModelForCausalLM

def train_loop(model, optimizer, loader, steps):
    history = []
    for step, batch in enumerate(loader):
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        history.append(loss.item())
    return history

def main(args, loader):
    trainer_args = dict(per_device_train_batch_size=8, use_cpu=True)
    results = {}
    for label, make_opt in [("a", torch.optim.SGD), ("b", torch.optim.AdamW)]:
        model = AutoModelForCausalLM.from_pretrained(args.model)
        results[label] = train_loop(model, make_opt(model.parameters()), loader, 10)
    return results

if __name__ == "__main__":
    main(None, [])
"""


def test_a_cpu_script_comparing_optimizers_from_fresh_weights_is_left_alone() -> None:
    # `per_device_train_batch_size` names no device; each compared run trains a fresh load
    assert _lines(COMPARED, "TPL201") == []
    assert _lines(COMPARED, "TPL403") == []


CLAMPED = """\
import torch
from torch import nn

class SSIMLoss(nn.Module):
    def forward(self, y_hat, y):
        ssim_loss = 1 - torch.cosine_similarity(y_hat, y).mean()
        if ssim_loss.item() > 1.0:
            print(f" > SSIM loss is out-of-range {ssim_loss.item()}, setting it 1.0")
            ssim_loss = torch.tensor(1.0, device=ssim_loss.device)
        return ssim_loss
"""

CLAMPED_TRAIN = """\
import torch
from losses import SSIMLoss

def main(model, loader, device):
    model = model.to(device)
    crit = SSIMLoss()
    opt = torch.optim.Adam(model.parameters())
    for x, y in loader:
        loss = crit(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
"""


def test_a_branch_that_says_a_value_is_out_of_range_and_clamps_it_is_rare(tmp_path: Path) -> None:
    found = _project(tmp_path, {"losses.py": CLAMPED, "train.py": CLAMPED_TRAIN}, "TPL201")
    assert found == [("losses.py", 7)]  # the test itself runs every step


COMPREHENDED = """\
import torch

def train(model, loader, opt, device, n):
    model.to(device)
    for x, mask in loader:
        mask = mask.to(device)
        loss = model(x.to(device)).sum()
        counts = torch.tensor([mask[i].sum() for i in range(n)], device=device)
        loss.backward()
        opt.step()
"""


def test_torch_tensor_of_a_comprehension_of_device_scalars_reads_each() -> None:
    assert _lines(COMPREHENDED, "TPL201") == [8]


NCCL_EITHER_WAY = """\
import os
import torch
import torch.distributed as dist

def main(args):
    try:
        rank = int(os.environ["RANK"])
        dist.init_process_group("nccl")
    except KeyError:
        rank = 0
        dist.init_process_group(backend="nccl", init_method="tcp://127.0.0.1:12584", rank=0, world_size=1)
    torch.cuda.set_device(args.local_rank)
"""


def test_nccl_started_in_a_try_and_in_its_handler_already_needs_cuda() -> None:
    assert _lines(NCCL_EITHER_WAY, "TPL601") == []


REDUCED_AT_BOUNDARY = """\
import torch

def main(args, model, optimizer, dataloader, accelerator, device):
    model, optimizer, dataloader = accelerator.prepare(model, optimizer, dataloader)
    local_metrics = torch.zeros((5,), device=device)
    training_step = 0
    for data in dataloader:
        training_step += 1
        loss = model(data).mean()
        accelerator.backward(loss)
        optimizer.step()
        if training_step % args.gradient_accumulation_steps == 0:
            local_metrics[0] = loss
            print(local_metrics.tolist())
        if training_step % args.logging_steps == 0:
            print(local_metrics.tolist())
"""


def test_a_read_at_every_accumulation_boundary_is_read_every_optimizer_step() -> None:
    assert _lines(REDUCED_AT_BOUNDARY, "TPL201") == [14]


GAN_CADENCE = """\
import torch

def train(netG, netD, loader, optG, optD, ratio, log_every, device):
    for step, (lr, hr) in enumerate(loader):
        lr, hr = lr.to(device), hr.to(device)
        fake = netG(lr)
        if step % ratio == 0:
            optG.zero_grad()
            g_loss = (fake - hr).abs().mean()
            g_loss.backward()
            optG.step()
        optD.zero_grad()
        d_loss = netD(fake.detach()).mean() - netD(hr).mean()
        d_loss.backward()
        optD.step()
        if step % ratio == 0:
            print(g_loss.item())
        if step % log_every == 0:
            print(d_loss.item())
"""


def test_a_log_under_the_test_of_a_branch_that_trains_runs_at_that_training_cadence() -> None:
    assert _lines(GAN_CADENCE, "TPL201") == [17]


BATCHIFIED = """\
import torch

def batchify(func, x, y, batch_size, device, *args, **kwargs):
    results = []
    for start in range(0, len(x), batch_size):
        results.append(func(x[start:start + batch_size].to(device), y.to(device), *args, **kwargs))
    return torch.cat(results)

def evaluate(scores, positives, batch_size, device, recall_k_list):
    metrics = {}
    for recall_k in recall_k_list:
        hits = batchify(torch.topk, scores, positives, batch_size, device, k=recall_k)
        metrics[recall_k] = (hits.values > 0).float().mean().item()
    return metrics

def get_batch(split, data, device):
    return data[split].to(device)

def estimate(model, data, device, iters):
    for _ in range(iters):
        x = get_batch("val", data, device)
        print(model(x).mean().item())
"""


def test_a_helper_named_batchify_fetches_no_batch_per_step() -> None:
    # a loop over a few values of k, each scored in batches; `get_batch` does fetch one
    assert _lines(BATCHIFIED, "TPL201") == [22]


GATHERED_LOSSES = """\
import torch
import torch.distributed as dist

def train(model, loader, opt, device):
    for x in loader:
        loss = model(x.to(device)).mean()
        loss.backward()
        opt.step()
        loss_list = [torch.zeros_like(loss) for _ in range(dist.get_world_size())]
        dist.all_gather(loss_list, loss)
        loss_list = torch.tensor(loss_list)
        print(loss_list.mean())
"""


def test_torch_tensor_of_a_gathered_list_of_device_losses_reads_each() -> None:
    assert _lines(GATHERED_LOSSES, "TPL201") == [11]


LION = """\
import torch

class Lion(torch.optim.Optimizer):
    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                moment_norm = torch.linalg.vector_norm(state["exp_avg"])
                scale = moment_norm.item()
                p.add_(p.grad, alpha=-group["lr"] * scale)
"""


def test_an_optimizer_step_reads_its_parameters_wherever_the_model_runs() -> None:
    # no device named in the file: an optimizer's parameters are the model's
    assert _lines(LION, "TPL201") == [10]


CHAT_LOOP = """\
import torch
from utils.chat import chat

def main(model, tokenizer):
    model = model.cuda()
    history = None
    while True:
        query = input("User: ")
        response, history, cache = chat(query, model, tokenizer, history=history)
        print("Model: " + response)
"""


def test_a_string_joined_to_a_literal_is_text() -> None:
    # a tensor beside a str raises: `response` is the decoded answer
    assert _lines(CHAT_LOOP, "TPL201") == []


NAN_ALERT = """\
import numpy as np
import torch

def train(model, loader, opt, device, main_node, project):
    for x in loader:
        loss = model(x.to(device)).mean()
        loss.backward()
        opt.step()
        if main_node and project is not None and np.isnan(loss.item()):
            print(f"NaN loss {loss.item()}")
"""


def test_a_branch_for_a_nan_behind_settings_is_taken_on_failure_only() -> None:
    assert _lines(NAN_ALERT, "TPL201") == [9]  # the test itself runs every step


CACHE_IN_HANDLER = """\
import torch

def get_features(path, examples, tokenizer, device):
    try:
        features = torch.load(path, weights_only=True)
    except FileNotFoundError:
        features = [tokenizer(e) for e in examples]
        torch.save(features, path)
    return torch.tensor(features).to(device)
"""


def test_a_cache_its_handler_computes_and_saves_is_host_data() -> None:
    assert _lines(CACHE_IN_HANDLER, "TPL401") == []


SHAPED = """\
import torch

def train(model, loader, opt, device):
    for x, valid in loader:
        valid = valid.to(device)
        out = model(x.to(device))
        sel = out[valid].view(valid.sum(), -1)
        flat = out.reshape(x.shape[0], -1)
        loss = sel.mean() + flat.mean()
        loss.backward()
        opt.step()
"""


def test_a_device_reduction_given_as_a_size_to_view_is_read() -> None:
    assert _lines(SHAPED, "TPL201") == [7]  # a shape is no read
