"""Corpus round 30: false positives found on diffusion web UIs and video generation code,
voice cloning and text-to-speech apps, segmentation demos and data-loading libraries, each as
the look-alike that must stay clean next to the pitfall that must still be found."""

from __future__ import annotations

from torchplace.lint import lint_source


def _lines(source: str, code: str, path: str = "pipeline.py") -> list[int]:
    return [f.line for f in lint_source(source, path, select={code})]


# ---- TPL702: a pool of pinned staging buffers filled once, one buffer per turn

BUFFER_POOL = """\
import torch


def allocate(query, batch_size, batches_ahead):
    result = []
    for _ in range(batches_ahead):
        partial = torch.empty(batch_size, *query.shape, dtype=query.dtype, device=query.device)
        try:
            partial = partial.pin_memory()
        except RuntimeError:
            pass
        result.append(partial)
    return result
"""


def test_pinning_each_buffer_of_a_pool_is_left_alone() -> None:
    assert _lines(BUFFER_POOL, "TPL702") == []


def test_pinning_each_batch_of_a_step_loop_is_reported() -> None:
    source = """\
import torch


def run(model, batches, device):
    outs = []
    for batch in batches:
        batch = torch.from_numpy(batch).pin_memory().to(device, non_blocking=True)
        outs.append(model(batch))
    return outs
"""
    assert _lines(source, "TPL702") == [7]


# ---- TPL201: the sizes an all-gather hands back, the local size later rebound to a number

GATHER_SIZES = """\
import pickle

import torch
import torch.distributed as dist


def all_gather(data, world_size):
    buffer = pickle.dumps(data)
    tensor = torch.ByteTensor(torch.ByteStorage.from_buffer(buffer)).to("cuda")
    local_size = torch.tensor([tensor.numel()], device="cuda", dtype=torch.long)
    size_list = [torch.tensor([0], device="cuda", dtype=torch.long) for _ in range(world_size)]
    dist.all_gather(size_list, local_size)
    size_list = [int(size.item()) for size in size_list]
    max_size = max(size_list)
    local_size = int(local_size.item())
    return max_size, local_size
"""


def test_gathered_sizes_of_a_size_rebound_to_a_number_are_left_alone() -> None:
    assert _lines(GATHER_SIZES, "TPL201", "misc.py") == []


def test_gathered_values_computed_on_the_device_are_reported() -> None:
    source = GATHER_SIZES.replace(
        'torch.tensor([tensor.numel()], device="cuda", dtype=torch.long)',
        "tensor.float().sum()",
    )
    assert _lines(source, "TPL201", "misc.py") == [13]


# ---- TPL301: a timed offload of a model to the host

OFFLOAD = """\
import logging
import time

import torch

logger = logging.getLogger(__name__)


def swap(model, helper, device):
    model = model.to(device)
    helper = helper.to(device)
    start = time.time()
    model = model.to("cpu", torch.bfloat16)
    helper.to(device, torch.bfloat16)
    logger.info("offloaded in %s s", time.time() - start)
    return model, helper
"""


def test_a_timed_move_to_the_host_is_left_alone() -> None:
    assert _lines(OFFLOAD, "TPL301") == []


def test_a_timed_copy_that_does_not_wait_is_reported() -> None:
    source = OFFLOAD.replace(
        'model = model.to("cpu", torch.bfloat16)',
        'model = model.to("cpu", torch.bfloat16, non_blocking=True)',
    )
    assert _lines(source, "TPL301") == [12]


# ---- TPL301: a diffusion pipeline's decoded images

PIPELINE = """\
import time

import torch
from diffusers import DiffusionPipeline


def main(prompt, steps):
    pipe = DiffusionPipeline.from_pretrained("model", torch_dtype=torch.float16)
    pipe = pipe.to("cuda")
    start_time = time.time()
    image = pipe(prompt=prompt, num_inference_steps=steps).images[0]
    elapsed = time.time() - start_time
    image.save("out.png")
    return elapsed
"""


def test_a_timed_pipeline_call_decoding_images_is_left_alone() -> None:
    assert _lines(PIPELINE, "TPL301") == []


def test_a_timed_pipeline_call_returning_latents_is_reported() -> None:
    source = PIPELINE.replace("steps).images", 'steps, output_type="latent").images')
    assert _lines(source, "TPL301") == [10]


# ---- TPL401: a data sampler's saved position

SAMPLER = """\
import os

import torch


def load(model, sampler, load_dir, device):
    if device == "cpu":
        model.to("cpu")
    sampler.load_state_dict(torch.load(os.path.join(load_dir, "sampler")))
    model.load_state_dict(torch.load(os.path.join(load_dir, "model.pt")))
"""


def test_a_data_samplers_state_is_left_alone() -> None:
    assert _lines(SAMPLER, "TPL401", "ckpt.py") == [10]


def test_weights_loaded_by_a_sampler_class_are_reported() -> None:
    source = """\
import torch


class DDIMSampler:
    def __init__(self, path, device):
        self.device = device if device != "cpu" else "cpu"
        self.state = torch.load(path)
"""
    assert _lines(source, "TPL401", "sampler.py") == [7]


# ---- TPL201: a pass that moves what each entry of a list holds and stores it back

PREPARE_CONDITIONS = """\
import torch


def resolve_areas(conditions, h, w, device):
    for i in range(len(conditions)):
        c = conditions[i]
        if "mask" in c:
            mask = c["mask"].to(device=device)
            modified = c.copy()
            if mask.shape[1] != h or mask.shape[2] != w:
                mask = torch.nn.functional.interpolate(mask.unsqueeze(1), size=(h, w))
                mask = mask.squeeze(1)
            if modified.get("set_area_to_bounds", False):
                bounds = torch.max(torch.abs(mask), dim=0).values
                box = bounds.nonzero()[0]
                area = (int(box[0]), int(box[1]))
                modified["area"] = area
            modified["mask"] = mask
            conditions[i] = modified
"""


def test_entries_prepared_in_place_are_left_alone() -> None:
    assert _lines(PREPARE_CONDITIONS, "TPL201", "samplers.py") == []


def test_entries_run_through_a_model_in_place_are_reported() -> None:
    source = """\
def run(model, batches, device):
    for i in range(len(batches)):
        x = batches[i].to(device)
        y = model(x)
        batches[i] = y
        print(int(y.argmax()))
"""
    assert _lines(source, "TPL201", "samplers.py") == [6]


# ---- TPL601: a comprehension whose filter keeps CUDA devices only

GPU_NAMES = """\
import torch

PROFILES = [(torch.device("cuda", i), i) for i in range(torch.cuda.device_count())]
INFOS = [
    f"{device.index}\\t{torch.cuda.get_device_name(device.index)}"
    for device, _ in PROFILES
    if device.type == "cuda"
]
"""


def test_a_query_filtered_to_cuda_devices_is_left_alone() -> None:
    assert _lines(GPU_NAMES, "TPL601", "config.py") == []


def test_a_query_filtered_on_something_else_is_reported() -> None:
    source = GPU_NAMES.replace('device.type == "cuda"', "device.index > 0")
    assert _lines(source, "TPL601", "config.py") == [5]
