"""Corpus round 20: false positives found on new real code (LoRA and diffusion trainers, an
RLHF reward server, a deep-learning book's notebooks, Hugging Face's documentation notebooks),
each as the look-alike that must stay clean next to the pitfall that must still be found."""

from __future__ import annotations

from torchplace.lint.notebook import lint_notebook

from .helpers import lines, notebook, notebook_cells

# ---- TPL201: a learning-rate scheduler's rates are Python floats

LOGS = """\
import torch

model = Net().to(accelerator.device)
model, opt, loader, scheduler = accelerator.prepare(model, opt, loader, scheduler)


def step_logs(loss, lr_scheduler):
    logs = {}
    lrs = lr_scheduler.get_last_lr()
    for i in range(len(lrs)):
        logs[f"lr/group{i}"] = float(lrs[i])
    return logs


for batch in loader:
    loss = model(batch).mean()
    loss.backward()
    opt.step()
    logs = step_logs(loss, scheduler)
"""


def test_a_schedulers_last_rates_read_per_step_are_left_alone() -> None:
    assert lines(LOGS, "TPL201") == []


def test_rates_read_from_a_device_tensor_are_reported() -> None:
    source = LOGS.replace("lr_scheduler.get_last_lr()", "loss.detach() * 0.1")
    assert lines(source, "TPL201") == [11]


# ---- TPL201: `for i, (a, b) in enumerate(zip(xs, ys))` binds each name to its own sequence

SEEDS = """\
import torch

device = "cuda"
pipe = Pipeline().to(device)

for batch in batches:
    seeds = [b.seed for b in batch]
    images = pipe(batch.to(device))
    for i, (image, seed) in enumerate(zip(images, seeds)):
        image.save(f"{i}.png", meta=str(seed))
"""


def test_a_host_element_of_an_enumerated_zip_is_left_alone() -> None:
    assert lines(SEEDS, "TPL201") == []


def test_a_device_element_of_an_enumerated_zip_is_reported() -> None:
    source = SEEDS.replace("str(seed)", "str(image.sum().item())")
    assert lines(source, "TPL201") == [10]


# ---- TPL201: `with torch.cuda.device(v.device):` selects a device; it moves nothing

SAVE = """\
import torch


def save_file(tensors, f):
    for k, v in tensors.items():
        if v.is_cuda:
            with torch.cuda.device(v.device):
                data = v.contiguous().view(torch.uint8)
                data.cpu().numpy().tofile(f)
"""


def test_a_save_loop_under_a_device_context_is_left_alone() -> None:
    assert lines(SAVE, "TPL201") == []


def test_a_save_loop_that_moves_each_tensor_is_reported() -> None:
    source = SAVE.replace("v.contiguous()", "v.to(device).contiguous()")
    assert lines(source, "TPL201") == [9]


# ---- TPL201: an inference loop hands a fresh chunk of its input to a call with the device

REWARDS = """\
import torch


class RewardServer:
    def __init__(self, path):
        self.reward_model = RewardModel(path).to("cuda")

    def get_rewards(self, queries, batch_size):
        scores = []
        with torch.no_grad():
            for i in range(0, len(queries), batch_size):
                inputs = self.tokenize_fn(
                    queries[i : i + batch_size], device=self.reward_model.device
                )
                r = self.reward_model(inputs["input_ids"], inputs["attention_mask"])
                r = r.tolist()
                scores.extend(r)
        return scores
"""


def test_scores_of_chunks_placed_by_a_call_collected_and_returned_are_left_alone() -> None:
    assert lines(REWARDS, "TPL201") == []


def test_scores_printed_rather_than_returned_are_reported() -> None:
    source = REWARDS.replace("scores.extend(r)", "print(r)")
    assert lines(source, "TPL201") == [16]


# ---- TPL201: a notebook that never names a device runs on the CPU

BOOK_TRAIN = """\
def train_ch3(net, train_iter, loss, num_epochs, optimizer):
    for epoch in range(num_epochs):
        train_l_sum = 0.0
        for X, y in train_iter:
            l = loss(net(X), y).sum()
            optimizer.zero_grad()
            l.backward()
            optimizer.step()
            train_l_sum += l.item()
        print(epoch, train_l_sum)
"""


def test_a_loss_read_in_a_notebook_that_never_names_a_device_is_left_alone() -> None:
    raw = notebook("import torch\n", BOOK_TRAIN, "train_ch3(net, it, loss, 5, opt)\n")
    assert notebook_cells(raw, "TPL201") == []


def test_a_loss_read_in_a_notebook_that_moves_its_model_is_reported() -> None:
    raw = notebook(
        "import torch\nnet = net.to('cuda')\n", BOOK_TRAIN, "train_ch3(net, it, loss, 5, opt)\n"
    )
    assert notebook_cells(raw, "TPL201") == [(2, 9)]


# ---- TPL403: a benchmark loads a copy for each device it compares

PROVIDERS = """\
from transformers import BertModel

PROVIDERS = {("cpu", "PyTorch CPU"), ("cuda:0", "PyTorch GPU")}

for device, label in PROVIDERS:
    model = BertModel.from_pretrained("bert-base-cased").to(device)
    results[label] = bench(model)
"""


def test_a_load_moved_to_each_steps_device_is_left_alone() -> None:
    assert lines(PROVIDERS, "TPL403") == []


def test_the_same_load_moved_to_a_fixed_device_is_reported() -> None:
    source = PROVIDERS.replace(".to(device)", '.to("cuda")')
    assert lines(source, "TPL403") == [6]


# ---- TPL000: a notebook cell pasted from a console session (`>>>` prompts)


def test_a_cell_of_console_prompts_parses_as_ipython_strips_them() -> None:
    raw = notebook(
        ">>> from diffusers import DiffusionPipeline\n>>> pipe = DiffusionPipeline()\n",
        '>>> for p in prompts:\n...     pipe(p).images[0].save("x.png")\n',
    )
    assert notebook_cells(raw, "TPL000") == []


def test_a_cell_whose_later_prompt_is_indented_still_does_not_parse() -> None:
    raw = notebook(">>> import torch\n\n >>> x = torch.ones(1)\n")
    assert notebook_cells(raw, "TPL000") == [(1, 3)]


def test_findings_in_a_prompted_cell_keep_the_columns_as_written() -> None:
    raw = notebook(">>> import torch\n>>> x = torch.ones(3)\n>>> x.to('cuda')\n>>> y = 1\n")
    found = lint_notebook(raw, "nb.ipynb", select={"TPL101"})
    assert [(f.cell, f.line, f.col) for f in found] == [(1, 3, 5)]


# ---- TPL401: a notebook that moves its pipeline to one GPU, the call spanning lines

PINNED = """\
import torch

pipe = Pipeline.from_pretrained(model_id, torch_dtype=torch.float16).to(
    "cuda:1"
)
monkeypatch_lora(pipe.unet, torch.load("lora_weight.pt"))
"""


def test_a_load_in_a_file_pinned_to_one_gpu_by_a_move_is_left_alone() -> None:
    assert lines(PINNED, "TPL401") == []


def test_a_load_in_a_file_that_moves_to_a_chosen_device_is_reported() -> None:
    source = PINNED.replace('"cuda:1"', "device")
    assert lines(source, "TPL401") == [6]


# ---- TPL301: a timed training run that prints its cost, formatted, as it goes

TIMED = """\
import time
import torch
import torch.nn.functional as F

device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
model = Net().to(device)
optimizer = torch.optim.Adam(model.parameters())

start_time = time.time()
for epoch in range(num_epochs):
    for features in train_loader:
        features = features.to(device)
        cost = F.binary_cross_entropy(model(features), features)
        optimizer.zero_grad()
        cost.backward()
        optimizer.step()
        print("Epoch: %03d | Cost: %.4f" % (epoch + 1, cost))
    print("Time elapsed: %.2f min" % ((time.time() - start_time) / 60))
"""


def test_a_timed_loop_that_formats_a_device_value_each_step_is_left_alone() -> None:
    assert lines(TIMED, "TPL301") == []


def test_a_timed_loop_that_formats_only_host_values_is_reported() -> None:
    source = TIMED.replace('"Epoch: %03d | Cost: %.4f" % (epoch + 1, cost)', "epoch")
    assert lines(source, "TPL301") == [9]


def test_an_f_string_of_a_device_value_is_a_read_too() -> None:
    source = TIMED.replace(
        '"Epoch: %03d | Cost: %.4f" % (epoch + 1, cost)', 'f"{epoch}: {cost:.4f}"'
    )
    assert lines(source, "TPL301") == []


# ---- TPL103: an element-wise function of the factory, placed with the input's device

EMBED = """\
import math
import torch
from torch import nn


class UNetModel(nn.Module):
    def time_step_embedding(self, time_steps, max_period=10000):
        half = self.channels // 2
        frequencies = torch.exp(
            -math.log(max_period) * torch.arange(start=0, end=half, dtype=torch.float32) / half
        ).to(device=time_steps.device)
        args = time_steps[:, None].float() * frequencies[None]
        return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)

    def forward(self, x, time_steps):
        return self.body(x, self.time_step_embedding(time_steps))
"""


def test_an_element_wise_function_of_a_factory_placed_right_away_is_left_alone() -> None:
    assert lines(EMBED, "TPL103") == []


def test_an_element_wise_function_of_a_factory_left_on_the_cpu_is_reported() -> None:
    source = EMBED.replace(".to(device=time_steps.device)", "")
    assert lines(source, "TPL103") == [10]


# ---- TPL401: a rank's random states, saved and loaded by name

RANDOM = """\
import torch
import torch.distributed as dist


def load_random_states(root_folder):
    filename = root_folder / f"random/rank-{dist.get_rank()}.pt"
    return torch.load(filename)


def load_optimizer(root_folder):
    filename = root_folder / f"optimizer/rank-{dist.get_rank()}.pt"
    return torch.load(filename)
"""


def test_a_load_of_random_states_is_left_alone_and_one_of_optimizer_state_is_not() -> None:
    assert lines(RANDOM, "TPL401") == [12]


# ---- TPL403: a loop whose step fine-tunes a fresh copy of the pretrained model

SLICES = """\
from transformers import AutoModelForSequenceClassification, Trainer

for train_slice in train_slices:
    model = AutoModelForSequenceClassification.from_pretrained(model_ckpt, config=config)
    trainer = Trainer(model=model, args=args, train_dataset=ds.select(train_slice))
    trainer.train()
    scores.append(trainer.evaluate())
"""


def test_a_load_in_a_loop_that_trains_each_copy_is_left_alone() -> None:
    assert lines(SLICES, "TPL403") == []


def test_a_load_in_a_loop_that_only_evaluates_is_reported() -> None:
    source = SLICES.replace("    trainer.train()\n", "")
    assert lines(source, "TPL403") == [4]


EVAL_COPY = """\
import torch
from transformers import AutoModelForSequenceClassification

model = AutoModelForSequenceClassification.from_pretrained(ckpt).to(device)
optimizer = torch.optim.AdamW(model.parameters())
for epoch in range(epochs):
    for batch in loader:
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
    eval_model = AutoModelForSequenceClassification.from_pretrained(ckpt)
    eval_model.load_state_dict(model.state_dict())
    evaluate(eval_model.to(device), val_loader)
"""


def test_a_load_beside_the_training_of_another_model_is_reported() -> None:
    """The epoch trains ``model``; the evaluation copy is rebuilt from its pretrained file
    every epoch, then overwritten: the load is the same every time (pytorch-YOLOv4)."""
    assert lines(EVAL_COPY, "TPL403") == [11]


def test_a_load_whose_copy_an_optimizer_in_the_step_trains_is_left_alone() -> None:
    source = """\
from transformers import AutoModelForSequenceClassification
import torch

for seed in seeds:
    model = AutoModelForSequenceClassification.from_pretrained(ckpt)
    optimizer = torch.optim.AdamW(model.parameters())
    for batch in loader:
        model(**batch).loss.backward()
        optimizer.step()
"""
    assert lines(source, "TPL403") == []


# ---- TPL201: what a `transformers.pipeline` answers is Python data

PIPE = """\
from transformers import pipeline

pipe = pipeline("zero-shot-classification", device=0)
for sample in samples:
    output = pipe(sample["text"], all_labels, multi_label=True)
    for label, score in zip(output["labels"], output["scores"]):
        print(f"{label}, {score:.2f}")
"""


def test_labels_and_scores_of_a_pipeline_are_left_alone() -> None:
    assert lines(PIPE, "TPL201") == []


def test_scores_of_a_model_moved_to_the_device_are_reported() -> None:
    source = PIPE.replace('pipeline("zero-shot-classification", device=0)', 'Net().to("cuda")')
    assert lines(source, "TPL201") == [7]


# ---- TPL601: a notebook that loads its pipeline onto CUDA before it asks CUDA for memory


def test_a_cuda_query_after_a_move_to_cuda_is_left_alone() -> None:
    raw = notebook(
        'import torch\npipe = Pipeline.from_pretrained("sdxl").to("cuda")\n',
        "image = pipe(prompt).images[0]\nprint(torch.cuda.max_memory_allocated())\n",
    )
    assert notebook_cells(raw, "TPL601") == []


def test_a_cuda_query_after_a_load_onto_cuda_by_device_map_is_left_alone() -> None:
    raw = notebook(
        'import torch\npipe = Pipeline.from_pretrained("sdxl", device_map="cuda")\n',
        "print(torch.cuda.max_memory_allocated())\n",
    )
    assert notebook_cells(raw, "TPL601") == []


def test_a_cuda_query_after_a_load_placed_automatically_is_reported() -> None:
    raw = notebook(
        'import torch\npipe = Pipeline.from_pretrained("sdxl", device_map="auto")\n',
        "print(torch.cuda.get_device_name())\n",
    )
    assert notebook_cells(raw, "TPL601") == [(2, 1)]


# ---- TPL201: a parameter read in the statement that rebinds it to its device copy

LABEL = """\
import torch

device = "cuda"
model = Net().to(device)


def step(image, label):
    image = image.to(device)
    label = torch.tensor([label]).to(device)
    cost = F.cross_entropy(model(image), label)
    cost.backward()
    return cost


for path, lab in pairs:
    step(load(path), lab)
"""


def test_the_argument_read_as_the_statement_moves_it_is_left_alone() -> None:
    assert lines(LABEL, "TPL201") == []


def test_a_list_of_the_moved_value_is_reported() -> None:
    moved = "    cost.backward()\n    torch.tensor([label])\n"
    source = LABEL.replace("    cost.backward()\n", moved)
    assert lines(source, "TPL201") == [12]


# ---- TPL201: a notebook's prediction loop collects host copies and joins them after it

TRAIN_CELL = """\
import torch

device = "cuda"
model = Net().to(device)
for batch in train_loader:
    loss = model(batch.to(device)).mean()
    loss.backward()
    opt.step()
"""

PREDICT_CELL = """\
forecasts = []
for batch in test_loader:
    outputs = model.generate(past_values=batch["past_values"].to(device))
    forecasts.append(outputs.sequences.cpu().numpy())
"""


def test_copies_joined_into_the_collecting_name_after_the_loop_are_left_alone() -> None:
    raw = notebook(TRAIN_CELL, PREDICT_CELL, "forecasts = np.vstack(forecasts)\n")
    assert notebook_cells(raw, "TPL201") == []


def test_copies_reduced_to_a_score_after_the_loop_are_reported() -> None:
    raw = notebook(TRAIN_CELL, PREDICT_CELL, "score = np.mean(np.vstack(forecasts))\n")
    assert notebook_cells(raw, "TPL201") == [(2, 4)]
