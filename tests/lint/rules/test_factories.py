"""TPL103 (rules/factories.py): a factory on the ``forward`` path that is placed after all,
by a later move of the attribute it is stored on, or by every caller of the method that
returns it."""

from __future__ import annotations

from torchplace.lint import lint_source

FUTURE_MASK = """\
import torch
from torch import nn


class Decoder(nn.Module):
    def forward(self, x):
        return x + self.future_mask(x) + self.other_mask(x)

    def future_mask(self, tensor):
        dim = tensor.size(0)
        if self._future_mask.size(0) < dim:
            self._future_mask = torch.triu(torch.zeros([dim, dim]), 1)
        self._future_mask = self._future_mask.to(tensor)
        return self._future_mask[:dim, :dim]

    def other_mask(self, tensor):
        dim = tensor.size(0)
        if self._other_mask.size(0) < dim:
            self._other_mask = torch.triu(torch.zeros([dim, dim]), 1)
        self._cache = self._cache.to(tensor)
        return self._other_mask[:dim, :dim]
"""

WEIGHTS = """\
import torch
from torch import nn


class GuidedLoss(nn.Module):
    def _weights(self, src_lens, tgt_lens):
        weights = torch.zeros((len(src_lens), max(tgt_lens), max(src_lens)))
        for i, (s, t) in enumerate(zip(src_lens, tgt_lens)):
            weights[i, :t, :s] = 1.0
        return weights

    def _masks(self, src_lens, tgt_lens):
        masks = torch.ones((len(src_lens), max(tgt_lens), max(src_lens)))
        return masks

    def forward(self, attn, src_lens, tgt_lens):
        weights = self._weights(src_lens, tgt_lens).to(attn.device)
        masks = self._masks(src_lens, tgt_lens)
        return (weights * attn * masks).mean()
"""


def test_a_factory_on_an_attribute_moved_below_is_left_alone() -> None:
    lines = [f.line for f in lint_source(FUTURE_MASK, "decoder.py", select={"TPL103"})]
    assert lines == [19]  # another attribute is moved; the mask itself never is


def test_a_factory_every_caller_places_is_left_alone() -> None:
    lines = [f.line for f in lint_source(WEIGHTS, "loss.py", select={"TPL103"})]
    assert lines == [13]  # `_masks` is returned to a caller that uses it unplaced
