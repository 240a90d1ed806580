"""Round 92, what round 32 of the corpus showed: TPL201 reads a slice bound that a
comprehension walks, ``[u[:v] for u, v in zip(context, seq_lens)]``; TPL103 knows diffusers'
layers for modules (``class SparseCausalAttention(CrossAttention)``) and takes a cast,
``h.to(query.dtype)``, for no move of what it is built from; TPL104 reads the device of
``torch.Generator("cuda")`` and counts a diffusers pipeline a class keeps (``self.pipe =
...Pipeline.from_pretrained(...)``) as a model it holds, not a ``self.pipe`` of settings."""

from __future__ import annotations

from .helpers import lines as _lines

ENCODER = """\
import torch


class T5Encoder:
    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer

    def __call__(self, texts, device):
        ids, mask = self.tokenizer(texts)
        ids = ids.to(device)
        mask = mask.to(device)
        seq_lens = mask.gt(0).sum(dim=1).long()
        context = self.model(ids, mask)
        return [u[:v] for u, v in zip(context, seq_lens)]
"""


def test_a_slice_bound_a_comprehension_walks() -> None:
    assert _lines(ENCODER, "TPL201") == [14]


ATTENTION = """\
import torch
from diffusers.models.attention import CrossAttention


class SparseCausalAttention(CrossAttention):
    def forward(self, hidden_states, video_length=None):
        key = self.to_k(hidden_states)
        former = torch.arange(video_length) - 1
        key = torch.cat([key[:, [0] * video_length], key[:, former]], dim=2)
        out = self.attend(hidden_states, key)
        return out.to(hidden_states.dtype)
"""


def test_a_factory_in_a_diffusers_layers_forward() -> None:
    assert _lines(ATTENTION, "TPL103") == [8]


def test_a_plain_class_of_that_name_is_no_module() -> None:
    plain = ATTENTION.replace("from diffusers.models.attention import CrossAttention\n", "")
    assert _lines(plain.replace("(CrossAttention)", ""), "TPL103") == []


PREDICTOR = """\
import torch
from cog import BasePredictor


class Predictor(BasePredictor):
    def setup(self):
        self.pipe = build_pipeline().to("cuda:0")

    def predict(self, prompt, seed: int = 0):
        generator = torch.Generator("cuda").manual_seed(seed)
        return self.pipe(prompt, generator=generator)
"""


def test_a_generator_on_bare_cuda_beside_a_held_pipeline() -> None:
    assert _lines(PREDICTOR, "TPL104") == [10]


def test_a_pipe_of_settings_holds_no_model() -> None:
    settings = PREDICTOR.replace('build_pipeline().to("cuda:0")', "edict(steps=4)")
    assert _lines(settings, "TPL104") == []
