"""Round 83 (TPL104): a diffusers pipeline holds its models through
``self.register_modules(unet=..., vae=...)``: a bare ``"cuda"`` in its methods ignores the
device the pipeline runs on."""

from __future__ import annotations

from .helpers import lines as _lines

PIPELINE = """\
import torch
from diffusers import DiffusionPipeline


class KolorsPipeline(DiffusionPipeline):
    def __init__(self, vae, text_encoder, tokenizer, unet, scheduler):
        super().__init__()
        self.register_modules(
            vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet, scheduler=scheduler
        )

    def encode_prompt(self, prompt, device=None):
        device = device or self._execution_device
        inputs = self.tokenizer(prompt, return_tensors="pt").to("cuda")
        return self.text_encoder(**inputs)
"""


def test_a_bare_cuda_in_a_pipeline_that_registers_its_models() -> None:
    assert _lines(PIPELINE, "TPL104") == [14]


def test_a_class_that_holds_no_model_is_left_alone() -> None:
    plain = PIPELINE.replace("        self.register_modules(\n", "        dict(\n")
    assert _lines(plain, "TPL104") == []
