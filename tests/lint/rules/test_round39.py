"""Corpus round 39: false positives found on beginners' and students' code (course and
tutorial repositories), web demos that wrap a model (Gradio apps), Chinese-language community
code (voice conversion, talking heads, text classification, image-processing lessons) and
robot-learning policies (ACT, diffusion policies, robomimic), each as the look-alike that must
stay clean next to the pitfall that must still be found.

Tried and found right, so left as they are: per-batch ``.item()``/``.cpu()`` in training loops,
``torch.load`` without ``map_location``/``weights_only``, ``.cuda()`` inside ``forward`` and
``initHidden``, bare ``"cuda"`` defaults of ``device`` parameters, bare ``"cuda"`` in DETR's
multi-rank helpers, tensors kept as plain attributes of a module, ``time.time()`` around
device work, optimizers built before the model is moved."""

from __future__ import annotations

from .helpers import lines, notebook, notebook_cells

# ---- TPL201: the few entries of a dict a helper returns, converted by key, not rows

COEFFS = """\
import numpy as np
import torch
from torch import nn


def split_coeff(coeffs):
    return {"id": coeffs[:, :80], "exp": coeffs[:, 80:144], "rest": coeffs[:, 144:]}


class FaceRecon:
    def __init__(self, device):
        self.device = device
        self.net = nn.Linear(3, 256).to(device)

    def save_coeff(self, image, name):
        x = torch.tensor(image).to(self.device)
        with torch.no_grad():
            full = self.net(x)
            coeffs = split_coeff(full)
        pred = {read}
        np.save(name, pred)
"""


def test_rows_of_a_device_tensor_read_one_by_one_are_found() -> None:
    source = COEFFS.replace("{read}", "[row.cpu().numpy() for row in full]")
    assert lines(source, "TPL201") == [20]


def test_a_helpers_dict_of_a_few_device_tensors_converted_by_key_is_clean() -> None:
    source = COEFFS.replace("{read}", "{key: coeffs[key].cpu().numpy() for key in coeffs}")
    assert lines(source, "TPL201") == []


def test_a_for_loop_over_the_helpers_dict_is_clean() -> None:
    source = COEFFS.replace(
        "        pred = {read}\n",
        "        pred = {}\n        for key in coeffs:\n            pred[key] = coeffs[key].cpu()\n",
    )
    assert lines(source, "TPL201") == []


# ---- TPL403: a Gradio handler that reloads only when the chosen model changes

SWITCH = """\
import gradio as gr
import torch

model = None
current_name = None


def generate(text, name):
    global model, current_name
    if model is None or {test}:
        model = torch.load(name, map_location="cpu", weights_only=True)
        current_name = name
    return model(text)


gr.Interface(generate, "text", "text")
"""


def test_a_load_on_a_test_that_changes_per_request_is_found() -> None:
    assert lines(SWITCH.format(test="len(text) > 3"), "TPL403", "app.py") == [11]


def test_a_load_only_when_the_chosen_model_changes_is_clean() -> None:
    assert lines(SWITCH.format(test="name != current_name"), "TPL403", "app.py") == []


# ---- TPL000: IPython's automagic `cd` (no `%`) in a Colab notebook


def test_a_cell_of_cd_without_percent_is_not_a_syntax_error() -> None:
    raw = notebook("!git clone https://example.com/demo.git", "cd demo/", "import torch\n")
    assert notebook_cells(raw, "TPL000") == []


def test_a_python_keyword_after_the_name_is_still_python() -> None:
    raw = notebook("cd if ready\n")
    assert notebook_cells(raw, "TPL000") == [(1, 1)]


def test_code_after_an_automagic_cell_is_still_linted() -> None:
    raw = notebook("cd demo/", "import torch\nstate = torch.load('m.pt', weights_only=True)\n")
    assert notebook_cells(raw, "TPL401") == [(2, 2)]


# ---- TPL403: the handler of a "load" button that stores the model for the other handlers

INSTALL = """\
import gradio as gr
import torch

model = None


def analyse(model_path, device):
    global model
    model = torch.load(model_path, map_location=device, weights_only=False)
    speakers = list(model.spk2id.keys())
    {run}
    return "loaded: " + " ".join(speakers)


def convert(audio):
    return model.infer(audio)


with gr.Blocks() as app:
    load_button = gr.Button("load")
    load_button.click(analyse, [], [])
"""


def test_a_global_model_loaded_and_run_in_the_same_handler_is_found() -> None:
    source = INSTALL.replace("{run}", "model.infer(speakers[0])")
    assert lines(source, "TPL403", "webui.py") == [9]


def test_a_handler_storing_a_global_model_it_does_not_run_is_clean() -> None:
    source = INSTALL.replace("{run}", "pass")
    assert lines(source, "TPL403", "webui.py") == []


# ---- TPL403: a web UI's tool button that merges checkpoints into a new file

MERGE = """\
import gradio as gr
import torch


def mix_model(paths, rates):
    merged = torch.load(paths[0], map_location="cpu", weights_only=True)
    models = [torch.load(p, map_location="cpu", weights_only=True) for p in paths]
    for key in merged:
        merged[key] = sum(m[key] * r for m, r in zip(models, rates))
    {end}


def mix_click(paths, rates):
    path = mix_model(paths, rates)
    return f"saved to {path}"


with gr.Blocks() as app:
    gr.Button("mix").click(mix_click, [], [])
"""


def test_a_helper_loading_a_model_for_each_click_is_found() -> None:
    source = MERGE.replace("{end}", "return merged")
    assert lines(source, "TPL403", "webui.py") == [14]


def test_a_helper_writing_the_merged_checkpoint_back_is_clean() -> None:
    source = MERGE.replace("{end}", 'torch.save(merged, "output.pth")\n    return "output.pth"')
    assert lines(source, "TPL403", "webui.py") == []


# ---- TPL201: the loader item left on the host beside the images stacked onto the device

STACKED = """\
import torch


@torch.no_grad()
def evaluate(model, data_loader, device, coco_evaluator):
    cpu_device = torch.device("cpu")
    model.eval()
    for images, targets in data_loader:
        images = torch.stack(images, dim=0).to(device)
        {targets}
        results = model(images, targets=None)
        outputs = [{"boxes": r["boxes"].to(cpu_device)} for r in results]
        res = {t["image_id"].item(): out for t, out in zip(targets, outputs)}
        coco_evaluator.update(res)
"""


def test_an_id_read_from_targets_moved_to_the_device_is_found() -> None:
    moved = "targets = [{k: v.to(device) for k, v in t.items()} for t in targets]"
    assert lines(STACKED.replace("{targets}", moved), "TPL201") == [13]


def test_an_id_read_from_targets_left_on_the_host_is_clean() -> None:
    assert lines(STACKED.replace("{targets}", "pass"), "TPL201") == []


def test_a_dict_grown_from_elsewhere_converted_by_key_is_found() -> None:
    source = COEFFS.replace(
        "            coeffs = split_coeff(full)\n",
        "            coeffs = split_coeff(full)\n            coeffs.update(self.extra)\n",
    ).replace("{read}", "{key: coeffs[key].cpu().numpy() for key in coeffs}")
    assert lines(source, "TPL201") == [21]


# ---- TPL201: an eval log printed only for the entries a type test finds to be floats

EVAL_LOG = """\
import torch


def evaluate(policy, env_runner, device):
    policy.to(device)
    policy.eval()
    runner_log = env_runner.run(policy)
    for key, value in runner_log.items():
        if {test}:
            print(f"{key}: {value:.4f}")
"""


def test_an_entry_tested_to_be_a_tensor_and_formatted_is_found() -> None:
    source = EVAL_LOG.replace("{test}", "isinstance(value, torch.Tensor)")
    assert lines(source, "TPL201") == [10]


def test_an_entry_tested_to_be_a_python_float_is_clean() -> None:
    source = EVAL_LOG.replace("{test}", "isinstance(value, (float, int))")
    assert lines(source, "TPL201") == []
