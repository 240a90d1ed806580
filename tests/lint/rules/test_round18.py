"""Corpus round 18: false positives found on new real code (a TTS trainer and its inference
notebooks, GNN benchmarks, LLM-from-scratch chapters and chat apps, minimal RL agents, a
detector's DataParallel wrapper), each as the look-alike that must stay clean next to the
pitfall that must still be found."""

from __future__ import annotations

from .helpers import lines

# ---- TPL201: an inference helper returns its output copy trimmed by a slice

TRIMMED = """\
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
model = Net().to(device)


def compute_style(path):
    mel = preprocess(load(path)).to(device)
    return model.style_encoder(mel)


def inference(text, ref_s):
    tokens = torch.LongTensor(text).to(device)
    with torch.no_grad():
        out = model(tokens, ref_s)
    return out.squeeze().cpu().numpy()[..., :-50]


for k, path in refs.items():
    ref_s = compute_style(path)
    wav = inference(texts[k], ref_s)
    play(wav)
"""


def test_a_returned_output_copy_trimmed_by_a_slice_is_left_alone() -> None:
    assert lines(TRIMMED, "TPL201") == []


def test_an_element_picked_from_the_returned_copy_is_reported() -> None:
    source = TRIMMED.replace("[..., :-50]", "[..., 0]")
    assert lines(source, "TPL201") == [16]


# ---- TPL201: a loop that leaves after a few steps by its own counter

CAPPED = """\
import torch

device = "cuda"
model = Net().to(device)
opt = torch.optim.Adam(model.parameters())

for epoch in range(10):
    for batch in loader:
        mels = batch.to(device)
        loss = model(mels).mean()
        loss.backward()
        opt.step()
    with torch.no_grad():
        for bib in range(len(mels)):
            n = int(lengths[bib].item())
            y_rec = model.decoder(mels[bib, :, :n])
            writer.add_audio("eval/y" + str(bib), y_rec.cpu().numpy(), epoch)
            if bib >= 5:
                break
"""


def test_a_loop_capped_at_a_few_steps_after_the_batch_loop_is_left_alone() -> None:
    assert lines(CAPPED, "TPL201") == []


def test_a_loop_capped_by_a_setting_is_reported() -> None:
    source = CAPPED.replace("if bib >= 5:", "if bib >= n_samples:")
    assert lines(source, "TPL201") == [15, 17]


CAPPED_INSIDE = """\
import torch

device = "cuda"
model = Net().to(device)
opt = torch.optim.Adam(model.parameters())

for batch in loader:
    mels = batch.to(device)
    loss = model(mels).mean()
    loss.backward()
    opt.step()
    for bib in range(len(mels)):
        n = int(mels[bib].sum().item())
        if bib >= 5:
            break
"""


def test_a_capped_loop_inside_the_batch_loop_is_reported() -> None:
    assert lines(CAPPED_INSIDE, "TPL201") == [13]


# ---- TPL201: a loop that sets up a whole training run per step

PER_SPLIT = """\
import torch
from torch import optim


def train_val_pipeline(dataset, params, device):
    for split_num in range(len(dataset.train_masks)):
        train_mask = dataset.train_masks[split_num].to(device)
        print("Training Nodes: ", train_mask.int().sum().item())
        model = gnn_model(params).to(device)
        optimizer = optim.Adam(model.parameters(), lr=params["init_lr"])
        for epoch in range(params["epochs"]):
            train_epoch(model, optimizer, device, dataset.g, train_mask)
"""


def test_a_loop_that_builds_an_optimizer_per_step_is_left_alone() -> None:
    assert lines(PER_SPLIT, "TPL201") == []


def test_a_loop_that_builds_an_optimizer_and_steps_it_is_reported() -> None:
    source = PER_SPLIT.replace(
        "        for epoch in range",
        "        optimizer.step()\n        for epoch in range",
    )
    assert lines(source, "TPL201") == [8]


# ---- TPL201: a streamed generation, one token per step, decoded for the user

STREAMED = """\
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
model = Model(cfg).to(device)
ids = torch.tensor(tokenizer.encode(prompt), device=device).unsqueeze(0)

for token in generate_text_basic_stream(model=model, token_ids=ids, max_new_tokens=500):
    token_id = token.squeeze(0).tolist()
    print(tokenizer.decode(token_id), end="", flush=True)
"""


def test_a_loop_over_a_streamed_generation_is_left_alone() -> None:
    assert lines(STREAMED, "TPL201") == []


def test_a_loop_over_the_rows_of_a_generated_tensor_is_reported() -> None:
    source = STREAMED.replace("generate_text_basic_stream(", "generate_text_basic(")
    assert lines(source, "TPL201") == [8]


CHAT = """\
import chainlit
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
MODEL = Qwen3Model(CFG).to(device)


@chainlit.on_message
async def main(message):
    ids = torch.tensor(TOKENIZER.encode(message.content), device=device).unsqueeze(0)
    out_msg = chainlit.Message(content="")
    for tok in generate_text_simple_stream(model=MODEL, token_ids=ids, max_new_tokens=512):
        token_id = tok.squeeze(0)
        piece = TOKENIZER.decode(token_id.tolist())
        await out_msg.stream_token(piece)
"""


def test_a_token_streamed_to_a_chat_client_is_left_alone() -> None:
    assert lines(CHAT, "TPL201") == []


def test_a_token_kept_on_the_side_each_step_is_reported() -> None:
    source = CHAT.replace("await out_msg.stream_token(piece)", "pieces.add(piece)")
    assert lines(source, "TPL201") == [14]


# ---- TPL501: a 0-dim tensor of a module-level number

MODULE_NUMBER = """\
import numpy as np
import torch
import torch.nn as nn

init_alpha = 0.01
clip_rho_threshold = 1.0
levels = [8, 5, 5]


class PolicyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.log_alpha = torch.tensor(np.log(init_alpha))
        self.clip_rho = torch.tensor(clip_rho_threshold, dtype=torch.float)
        self.levels = torch.tensor(levels)

    def forward(self, x):
        y = self.fc(x) * self.log_alpha.exp() + self.levels.sum()
        return torch.clamp(y, max=self.clip_rho)
"""


def test_a_tensor_of_a_module_level_number_is_left_alone() -> None:
    assert lines(MODULE_NUMBER, "TPL501") == [16]


def test_a_tensor_of_a_module_level_name_rebound_to_a_list_is_reported() -> None:
    source = MODULE_NUMBER.replace("clip_rho_threshold = 1.0", "clip_rho_threshold = [1.0, 2.0]")
    assert lines(source, "TPL501") == [15, 16]


# ---- TPL102: a wrapper placed on an element of the devices its caller hands it

WRAPPER = """\
import torch
from torch.nn.modules import Module


class _DataParallel(Module):
    def __init__(self, module, device_ids=None, chunk_sizes=None):
        super().__init__()
        if device_ids is None:
            device_ids = list(range(torch.cuda.device_count()))
        self.module = module
        self.device_ids = device_ids
        if len(self.device_ids) == 1:
            self.module.cuda(device_ids[0])
"""


def test_a_module_placed_on_an_element_of_a_device_parameter_is_left_alone() -> None:
    assert lines(WRAPPER, "TPL102") == []


def test_a_module_placed_on_an_element_of_its_own_list_is_reported() -> None:
    source = WRAPPER.replace("self.module.cuda(device_ids[0])", "self.module.cuda(GPUS[0])")
    assert lines(source, "TPL102") == [13]


# ---- TPL401: a script loads a file it saved above under the same name template

BEST_EPOCH = """\
import argparse
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--no-cuda", action="store_true")
args = parser.parse_args()
model = GAT(nfeat=16)
if not args.no_cuda:
    model.cuda()
best_epoch = 0
for epoch in range(100):
    loss = train(epoch)
    torch.save(model.state_dict(), "{}.pkl".format(epoch))
    if loss < best:
        best_epoch = epoch
model.load_state_dict(torch.load("{}.pkl".format(best_epoch)))
"""


def test_a_load_of_a_file_saved_above_under_the_same_name_is_left_alone() -> None:
    assert lines(BEST_EPOCH, "TPL401") == []


def test_a_load_of_a_file_saved_under_another_name_is_reported() -> None:
    source = BEST_EPOCH.replace('torch.load("{}.pkl"', 'torch.load("{}.pth"')
    assert lines(source, "TPL401") == [16]


def test_a_load_above_the_save_of_its_name_is_reported() -> None:
    source = BEST_EPOCH.replace(
        "best_epoch = 0\n",
        'model.load_state_dict(torch.load("{}.pkl".format(0)))\nbest_epoch = 0\n',
    )
    assert lines(source, "TPL401") == [10]


# ---- TPL201: a script that never names a device reads its loss on the CPU

HOST_SCRIPT = """\
import torch

model = Model()
criterion = torch.nn.MSELoss(reduction="sum")
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

for epoch in range(500):
    y_pred = model(x_data)
    loss = criterion(y_pred, y_data)
    print(f"Epoch: {epoch} | Loss: {loss.item()} ")
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_a_loss_read_in_a_script_that_names_no_device_is_left_alone() -> None:
    assert lines(HOST_SCRIPT, "TPL201") == []


def test_a_loss_read_in_a_script_that_names_a_device_is_reported() -> None:
    source = HOST_SCRIPT.replace("model = Model()", "model = Model()\ndevice = pick()")
    assert lines(source, "TPL201") == [11]


def test_a_loss_read_in_a_library_method_that_names_no_device_is_reported() -> None:
    source = """\
class PPO:
    def update(self, rollouts):
        for sample in rollouts.feed_forward_generator():
            loss = self.actor_critic.evaluate_actions(sample).mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            total += loss.item()
        return total
"""
    assert lines(source, "TPL201") == [8]


def test_a_load_of_a_fixed_name_written_as_another_path_is_reported() -> None:
    source = BEST_EPOCH.replace('"{}.pkl".format(epoch)', '"best.pkl"').replace(
        '"{}.pkl".format(best_epoch)', '"./best.pkl"'
    )
    assert lines(source, "TPL401") == [16]


def test_a_tensor_of_a_numpy_array_of_a_module_level_number_is_reported() -> None:
    source = MODULE_NUMBER.replace("np.log(init_alpha)", "np.ones(init_alpha)")
    assert lines(source, "TPL501") == [14, 16]


# ---- TPL201: a generator yields each decoded token to its consumer

YIELDS = """\
import torch


class GPT(torch.nn.Module):
    @torch.inference_mode()
    def generate(self, tokens, max_tokens):
        device = self.get_device()
        ids = torch.tensor([tokens], dtype=torch.long, device=device)
        for _ in range(max_tokens):
            logits = self.forward(ids)[:, -1, :]
            next_ids = torch.argmax(logits, dim=-1, keepdim=True)
            ids = torch.cat((ids, next_ids), dim=1)
            token = next_ids.item()
            yield token
"""


def test_a_token_read_and_yielded_by_a_generator_is_left_alone() -> None:
    assert lines(YIELDS, "TPL201") == []


def test_a_token_read_and_collected_by_a_generator_is_reported() -> None:
    source = YIELDS.replace("            yield token\n", "            out.append(token)\n")
    assert lines(source, "TPL201") == [13]
