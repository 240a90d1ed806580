"""TPL201 (rules/sync.py): a copy written out only under a flag, but handed to a metric on
every step, is a per-batch read, not the loop's output."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchplace.lint import lint_source
from torchplace.lint.engine import lint_bytes

VALIDATE = """\
import torch
from PIL import Image


def validate(opts, model, loader, device, metrics):
    with torch.no_grad():
        for i, (images, labels) in enumerate(loader):
            images = images.to(device)
            labels = labels.to(device)
            preds = model(images).max(dim=1)[1].cpu().numpy()
            targets = labels.cpu().numpy()
            metrics.update(targets, preds)
            if opts.save_val_results:
                for j in range(len(images)):
                    image = images[j].cpu().numpy()
                    Image.fromarray(image).save("%d_image.png" % j)
                    Image.fromarray(preds[j]).save("%d_pred.png" % j)
    return metrics.get_results()
"""

SAMPLE = """\
import numpy as np
import torch


def sample(model, loader, device, args):
    outputs = []
    for x in loader:
        y = model(x.to(device)).cpu().numpy()
        outputs.append(y)
        print("created", len(outputs))
    if args.rank == 0:
        np.savez("samples.npz", np.concatenate(outputs))
"""


def test_copies_fed_to_a_metric_every_step_are_reported() -> None:
    lines = [f.line for f in lint_source(VALIDATE, "main.py", select={"TPL201"})]
    assert lines == [10, 11]


def test_copies_written_out_are_still_the_output() -> None:
    assert lint_source(SAMPLE, "sample.py", select={"TPL201"}) == []


# ---- a logger made in one module, handed to another's batch loop as a parameter

LOGGER = """\
class Logger:
    def __init__(self, path):
        self.totals = {}

    def update(self, **kwargs):
        for k, v in kwargs.items():
            v = v.item()
            self.totals.update({k: v})
"""

MAIN = """\
import utils
from engine import train


def main(model, loader, device):
    log_writer = utils.Logger("runs")
    train(model, loader, device, log_writer=log_writer)
"""

ENGINE_EVERY_STEP = """\
import utils


def train(model, loader, device, log_writer=None):
    for x, y in loader:
        x = x.to(device)
        loss = model(x).sum()
        loss.backward()
        if log_writer is not None:
            log_writer.update(loss=loss)
"""

ENGINE_AFTER_LOOP = """\
import utils


def train(model, loader, device, log_writer=None):
    for x, y in loader:
        x = x.to(device)
        loss = model(x).sum()
        loss.backward()
    if log_writer is not None:
        log_writer.update(loss=loss)
"""

ENGINE_OWN_WRITER = """\
import utils


def train(model, loader, device, log_writer=None):
    log_writer = Recorder()
    for x, y in loader:
        x = x.to(device)
        loss = model(x).sum()
        loss.backward()
        log_writer.update(loss=loss)
"""


def _logger_findings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> list[tuple[int, str]]:
    (tmp_path / "utils.py").write_text(LOGGER)
    (tmp_path / "main.py").write_text(MAIN)
    (tmp_path / "engine.py").write_text(engine)
    monkeypatch.chdir(tmp_path)
    found = lint_bytes(LOGGER.encode(), "utils.py", select={"TPL201"})
    return [(f.line, f.code) for f in found]


def test_a_method_of_an_instance_handed_to_another_modules_batch_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `log_writer = utils.Logger(...)` in main, `log_writer.update(loss=loss)` in engine's
    # batch loop through the parameter of that name; `is not None` holds on every step
    assert _logger_findings(tmp_path, monkeypatch, ENGINE_EVERY_STEP) == [(7, "TPL201")]


def test_a_handed_instance_called_after_the_loop_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _logger_findings(tmp_path, monkeypatch, ENGINE_AFTER_LOOP) == []


def test_a_parameter_rebound_to_something_else_is_not_the_instance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _logger_findings(tmp_path, monkeypatch, ENGINE_OWN_WRITER) == []


# ---- an identity test of a setting is not a branch taken on few steps

WRITER_SET = """\
def train(model, loader, device, log_writer, optimizer):
    for step, (x, y) in enumerate(loader):
        x = x.to(device)
        loss = model(x).sum()
        loss.backward()
        optimizer.step()
        if log_writer is not None:
            log_writer.add_scalar("loss", loss.item(), step)
        if log_writer is not None and step % 100 == 0:
            log_writer.add_scalar("loss", loss.item(), step)
"""


def test_is_not_none_of_a_logger_holds_on_every_step() -> None:
    # `log` in the name makes a test rare; `is not None` asks only whether it is set
    lines = [f.line for f in lint_source(WRITER_SET, "train.py", select={"TPL201"})]
    assert lines == [8]  # line 10 is every 100 steps


# ---- copies collected and returned as they are, in another dtype

PREDICT = """\
import numpy as np
import torch


def predict(model, loader, device):
    out = []
    with torch.no_grad():
        for (x,) in loader:
            x = x.to(device).float()
            y = model(x).cpu().data.numpy()
            out.append(y)
    return np.concatenate(out).astype("float64")
"""


def test_copies_returned_in_another_dtype_are_the_output() -> None:
    assert lint_source(PREDICT, "predict.py", select={"TPL201"}) == []


def test_a_value_computed_from_the_copies_is_not_the_output() -> None:
    source = PREDICT.replace('.astype("float64")', ".mean()")
    lines = [f.line for f in lint_source(source, "predict.py", select={"TPL201"})]
    assert lines == [10]


REMAINDER = """\
import torch


def train(model, loader, optimizer, device):
    step = 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        step += 1
        if step % 50:
            print(loss.item())
        if step % 50 != 0:
            print(loss.item())
        if step % 50 == 0:
            print(loss.item())
        if not step % 50:
            print(loss.item())
"""


def test_a_remainder_tested_for_truth_holds_on_most_steps() -> None:
    # `if step % 50:` and `step % 50 != 0` skip one step in 50: the reads run every other step
    lines = [f.line for f in lint_source(REMAINDER, "train.py", select={"TPL201"})]
    assert 13 in lines
    assert 15 in lines


def test_a_remainder_equal_to_zero_stays_rare() -> None:
    lines = [f.line for f in lint_source(REMAINDER, "train.py", select={"TPL201"})]
    assert 17 not in lines
    assert 19 not in lines


# ---- `optimizer.zero_grad()` before a nested batch loop resets once per epoch

EPOCH_ZERO_GRAD = """\
import torch

def train(model, loader, optimizer, device, epochs):
    weights = torch.ones(10).to(device)
    for epoch in range(epochs):
        w = weights.cpu().numpy()
        optimizer.zero_grad()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
"""

ZERO_GRAD_STEP = """\
import torch

def train(model, loader, optimizer, device, run_step):
    weights = torch.ones(10).to(device)
    for x in loader:
        w = weights.cpu().numpy()
        optimizer.zero_grad()
        run_step(model, x, w)
"""


def test_a_read_before_the_batch_loop_of_an_epoch_is_left_alone() -> None:
    # the epoch loop's own `optimizer.zero_grad()` runs once per epoch, like the read
    assert lint_source(EPOCH_ZERO_GRAD, "train.py", select={"TPL201"}) == []


def test_zero_grad_without_a_nested_batch_loop_still_marks_a_step() -> None:
    lines = [f.line for f in lint_source(ZERO_GRAD_STEP, "train.py", select={"TPL201"})]
    assert 6 in lines


ACCUMULATE = """\
import torch

def train(model, batches, optimizer, scaler, device, accum):
    while True:
        for micro in range(accum):
            x = next(batches).to(device)
            loss = model(x).sum() / accum
            scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        print(loss.item())
"""

ACCUMULATE_RESET_FIRST = ACCUMULATE.replace(
    "        optimizer.zero_grad(set_to_none=True)\\n", ""
).replace("    while True:\\n", "    while True:\\n        optimizer.zero_grad()\\n")


@pytest.mark.parametrize("source", [ACCUMULATE, ACCUMULATE_RESET_FIRST])
def test_zero_grad_around_accumulated_micro_steps_marks_a_step(source: str) -> None:
    # flushed after the micro-step loop, or reset before it next to `scaler.step(optimizer)`
    lines = [f.line for f in lint_source(source, "train.py", select={"TPL201"})]
    assert 12 in lines


# --- a helper's host read that indexes another value is not the value it returns ---

ONE_HOT = """\
import torch


def to_categorical(y, num_classes):
    new_y = torch.eye(num_classes)[y.cpu().numpy(),]
    if y.is_cuda:
        return new_y.cuda()
    return new_y


def to_host(y):
    out = y.cpu().numpy()
    return out


def main(model, loader, n):
    with torch.no_grad():
        for points, label in loader:
            points, label = points.cuda(), label.cuda()
            pred = model(points, to_categorical(label, n))
            host = to_host(pred)
"""


def test_a_read_used_as_an_index_is_reported_though_the_indexed_value_is_returned() -> None:
    lines = [f.line for f in lint_source(ONE_HOT, "evaluate.py", select={"TPL201"})]
    assert lines == [5]


def test_a_read_returned_as_it_is_stays_the_loop_output() -> None:
    lines = [f.line for f in lint_source(ONE_HOT, "evaluate.py", select={"TPL201"})]
    assert 12 not in lines


# --- a copy returned as it is, without a name in between, is the helper's output too ---

RETURNED = """\
import torch


def segment(img, model):
    with torch.no_grad():
        seg = model(img).argmax(1)
    return seg.detach().cpu()


def first_label(img, model):
    return model(img).argmax(1).cpu().numpy()[0]


def main(model, loader):
    model = model.cuda()
    for batch in loader:
        img = batch.cuda()
        save(segment(img, model), first_label(img, model))
"""


def test_a_copy_returned_directly_is_the_helpers_output() -> None:
    lines = [f.line for f in lint_source(RETURNED, "extract.py", select={"TPL201"})]
    assert 7 not in lines


def test_an_element_picked_from_a_returned_copy_is_still_reported() -> None:
    lines = [f.line for f in lint_source(RETURNED, "extract.py", select={"TPL201"})]
    assert lines == [11]


# --- a read inside the branch a non-finite value takes runs once, on the way out ---

NAN_GUARD = """\
import math
import torch


class Trainer:
    def run_step(self, batch):
        loss = self.model(batch)
        if not math.isfinite(loss.item()):
            msg = f"Loss is {loss.item()}, stopping"
            if self.raise_on_error:
                raise FloatingPointError(msg)
            return
        if torch.isfinite(loss).all():
            print("loss", loss.item())
        else:
            print("skipped", loss.item())
        loss.backward()

    def train(self, loader):
        self.model = self.model.to("cuda")
        for batch in loader:
            batch = batch.to("cuda")
            self.run_step(batch)
"""


def test_a_read_in_a_non_finite_branch_is_left_alone() -> None:
    lines = [f.line for f in lint_source(NAN_GUARD, "trainer.py", select={"TPL201"})]
    assert not {9, 16} & set(lines)


def test_the_finiteness_test_and_its_finite_branch_are_reported() -> None:
    lines = [f.line for f in lint_source(NAN_GUARD, "trainer.py", select={"TPL201"})]
    assert lines == [8, 13, 14]


# --- an f-string that names a key is not the text of a tensor ---

KEYS = """\
def validate(model, loader, device, phase):
    for batch in loader:
        batch = batch.to(device)
        key = batch.dict_key
        losses = model(batch)
        logged = {f"Losses/{phase}_{key}_{k}": v for k, v in losses.items()}
        logged[f"{key}_total"] = sum(logged.values())
        print(f"loss {losses['total']}")
"""


def test_an_f_string_used_as_a_key_is_left_alone() -> None:
    lines = [f.line for f in lint_source(KEYS, "validate.py", select={"TPL201"})]
    assert not {6, 7} & set(lines)


def test_an_f_string_of_a_device_value_is_still_reported() -> None:
    lines = [f.line for f in lint_source(KEYS, "validate.py", select={"TPL201"})]
    assert lines == [8]


# ---- whole tensors of an all_gather list, copied and returned as the function's output

GATHER_SAMPLES = """\
import numpy as np
import torch
import torch.distributed as dist


def sample_all(model, args, device):
    all_images = []
    while len(all_images) * args.batch_size < args.num_samples:
        noise = torch.randn(args.batch_size, 3, device=device)
        sample = model(noise)
        gathered = [torch.zeros_like(sample) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, sample)
        all_images.extend([s.cpu().numpy() for s in gathered])
    arr = np.concatenate(all_images, axis=0)
    return arr[: args.num_samples]
"""

GATHER_TOKENS = """\
import torch
import torch.distributed as dist


def decode(model, steps, device):
    token = torch.zeros(1, dtype=torch.long, device=device)
    out = []
    for _ in range(steps):
        logits = model(token)
        token = logits.argmax(-1)
        gathered = [torch.zeros_like(token) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, token)
        for part in gathered:
            out.append(part.cpu())
    return out
"""


def test_gathered_samples_returned_as_the_output_are_left_alone() -> None:
    assert lint_source(GATHER_SAMPLES, "sample.py", select={"TPL201"}) == []


def test_gathered_tokens_of_a_decoding_loop_are_still_reported() -> None:
    lines = [f.line for f in lint_source(GATHER_TOKENS, "decode.py", select={"TPL201"})]
    assert lines == [14]


# --- a walk over the items of one batch's output, with no step around it, reads per item ---

PER_ITEM = """\
import numpy as np
import torch


def detect(self, frames, device):
    frames = frames.to(device)
    loc, conf, marks = self.net(frames)
    both = torch.cat((loc, conf.unsqueeze(-1)), dim=2).float()
    boxes, points = [], []
    for pred, mark, keep in zip(both, marks, conf > 0.5):
        pred, mark = pred[keep, :], mark[keep, :]
        kept_boxes, kept_marks = pred.cpu().numpy(), mark.cpu().numpy()
        boxes.append(kept_boxes)
        points.append(kept_marks)
    return boxes, points
"""


def test_per_item_copies_of_a_batch_output_outside_any_step_loop_are_reported() -> None:
    lines = [f.line for f in lint_source(PER_ITEM, "detect.py", select={"TPL201"})]
    assert lines == [12, 12]


# ---- a mapping's keys are names, its values whole tensors, never the rows of one tensor

DICT_KEYS = """\
def quantize(model, names):
    layer = model.layers[0].to("cuda")
    full = {n: m for n, m in layer.named_modules()}
    subset = {n: full[n] for n in names}
    for name in subset:
        print(f"Quantizing {name}")
"""

OUTPUT_ITEMS = """\
def evaluate(model, loader, device):
    model.to(device)
    results = []
    for batch in loader:
        outs = model(batch.to(device))
        outputs = {}
        for k, v in outs.items():
            outputs[k] = v.cpu()
        results.append(outputs)
    return results
"""

OUTPUT_ITEMS_READ = """\
def evaluate(model, loader, device):
    model.to(device)
    for batch in loader:
        outs = model(batch.to(device))
        for k, v in outs.items():
            print(k, v.item())
"""


def test_iterating_a_dict_of_device_modules_yields_host_keys() -> None:
    assert lint_source(DICT_KEYS, "quant.py", select={"TPL201"}) == []


def test_copies_of_a_mappings_values_collected_and_returned_are_the_output() -> None:
    assert lint_source(OUTPUT_ITEMS, "eval.py", select={"TPL201"}) == []


def test_a_read_of_each_value_of_a_device_mapping_per_batch_is_reported() -> None:
    found = lint_source(OUTPUT_ITEMS_READ, "eval.py", select={"TPL201"})
    assert [f.line for f in found] == [6]
    assert "once per device tensor of a list" in found[0].message


# ---- a tokenizer's `return_tensors="pt"` output stays on the host until moved

TOKENIZED = """\
class Trainer:
    def training_step(self, model, inputs):
        prompt_inputs = self.processing_class(text=inputs["prompt"], return_tensors="pt")
        prompt_ids = [tokens.tolist() for tokens in prompt_inputs["input_ids"]]
        loss = model(**inputs).loss
        loss.backward()
        return prompt_ids
"""


def test_rows_of_a_tokenizer_output_never_moved_are_host_values() -> None:
    assert lint_source(TOKENIZED, "trainer.py", select={"TPL201"}) == []


def test_rows_of_a_tokenizer_output_moved_to_the_device_are_reported() -> None:
    source = TOKENIZED.replace('return_tensors="pt")', 'return_tensors="pt").to(self.device)')
    assert [f.line for f in lint_source(source, "trainer.py", select={"TPL201"})] == [4]


# ---- `preds += y.tolist()` in a loop over chunks of the input, returned: the output

CHUNKED = """\
import torch


@torch.no_grad()
def predict(model, tokenizer, prompts, batch_size=1):
    predictions, probs = [], []
    for i in range(0, len(prompts), batch_size):
        batch_prompts = prompts[i : i + batch_size]
        ids = tokenizer(batch_prompts, return_tensors="pt").input_ids
        if model.device.type == "cuda":
            ids = ids.cuda()
        batch_probs = torch.softmax(model(ids).logits[:, -1, :], dim=-1)
        predictions += torch.argmax(batch_probs, dim=-1).tolist()
        probs += batch_probs.tolist()
    return predictions, probs
"""

DECODING = """\
import torch


@torch.no_grad()
def generate(model, prompt, steps, device):
    tokens = []
    token = prompt.to(device)
    for i in range(steps):
        token = model(token).argmax(-1)
        tokens += token.tolist()
    return tokens
"""


def test_copies_of_each_input_chunk_collected_with_plus_equals_are_the_output() -> None:
    assert lint_source(CHUNKED, "eval.py", select={"TPL201"}) == []


def test_a_decoding_loop_collecting_with_plus_equals_is_still_reported() -> None:
    assert [f.line for f in lint_source(DECODING, "gen.py", select={"TPL201"})] == [10]


def test_a_value_computed_from_the_copy_is_not_the_output() -> None:
    source = CHUNKED.replace(
        "probs += batch_probs.tolist()", "probs += [p * 2 for p in batch_probs.tolist()]"
    )
    assert [f.line for f in lint_source(source, "eval.py", select={"TPL201"})] == [14]


READ_BEFORE_MOVE = """\
import torch
from feats import extract


def run(data_list, device, model):
    meta = {}
    out = []
    for beg in range(0, len(data_list), 4):
        speech, lengths = extract(data_list[beg : beg + 4])
        meta["seconds"] = lengths.sum().item() / 100
        speech, lengths = speech.to(device), lengths.to(device)
        out.append(model(speech, lengths))
    return out, meta
"""


def test_a_value_read_before_the_step_moves_it_is_on_the_host() -> None:
    assert lint_source(READ_BEFORE_MOVE, "frontend.py", select={"TPL201"}) == []


def test_a_value_read_after_the_step_moves_it_is_reported() -> None:
    source = READ_BEFORE_MOVE.replace(
        '        meta["seconds"] = lengths.sum().item() / 100\n'
        "        speech, lengths = speech.to(device), lengths.to(device)\n",
        "        speech, lengths = speech.to(device), lengths.to(device)\n"
        '        meta["seconds"] = lengths.sum().item() / 100\n',
    )
    assert [f.line for f in lint_source(source, "frontend.py", select={"TPL201"})] == [11]
