"""Round 78 (TPL201): a helper a module's ``forward`` calls runs on every batch too, with what
``forward`` hands it (CosyVoice's ``text_token_len.cpu()`` in the method its ``forward``
calls with the lengths it moved)."""

from __future__ import annotations

from .helpers import lines as _lines

HELPER = """\
import torch
from torch import nn


class LM(nn.Module):
    def __init__(self, vocab, dim):
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)

    def pad_unpad(self, tokens, token_len):
        return unpad_sequence(tokens, token_len.cpu(), batch_first=True)

    def forward(self, batch, device):
        tokens = self.embedding(batch["tokens"].to(device))
        token_len = batch["token_len"].to(device)
        return self.pad_unpad(tokens, token_len)
"""


def test_a_helper_of_forward_reads_what_forward_hands_it() -> None:
    assert _lines(HELPER, "TPL201") == [11]


def test_a_helper_handed_only_host_values_is_left_alone() -> None:
    host = HELPER.replace(
        'token_len = batch["token_len"].to(device)', 'token_len = batch["token_len"]'
    )
    assert _lines(host, "TPL201") == []
