"""Round 89: TPL402 takes a ``seek`` for a rewound buffer only when the load reads that
buffer (Oscar's dataset seeks rows of a TSV reader, then loads a caption file: no round
trip); TPL201 takes a module's own decoding loop, ``outputs = self(**inputs)`` in a
``generate`` method, for a loop that runs the model every step."""

from __future__ import annotations

from .helpers import lines as _lines

DATASET = """\
import io
import torch
from torch.utils.data import Dataset


class RetrievalDataset(Dataset):
    def __init__(self, caption_file, label_tsv):
        self.captions = torch.load(caption_file)
        self.rows = [label_tsv.seek(i) for i in range(3)]
"""


def test_a_load_beside_another_objects_seek_is_reported() -> None:
    assert _lines(DATASET, "TPL402") == [8]


def test_a_load_of_the_rewound_buffer_is_left_alone() -> None:
    buffer = DATASET.replace(
        "        self.captions = torch.load(caption_file)\n",
        "        buf = io.BytesIO()\n        torch.save({}, buf)\n        buf.seek(0)\n"
        "        self.captions = torch.load(buf)\n",
    )
    assert _lines(buffer, "TPL402") == []


CAPTIONER = """\
import torch
from torch import nn


class Captioner(nn.Module):
    def forward(self, input_ids):
        return self.head(input_ids)

    def generate(self, input_ids, max_length):
        cur_len = 1
        while cur_len < max_length:
            outputs = self(input_ids)
            next_token = torch.argmax(outputs[0][:, -1, :], dim=-1)
            for i in range(input_ids.shape[0]):
                seen = set(input_ids[i].tolist())
            input_ids = torch.cat([input_ids, next_token.unsqueeze(-1)], dim=-1)
            cur_len = cur_len + 1
        return input_ids
"""


def test_a_modules_own_decoding_loop_runs_per_step() -> None:
    assert _lines(CAPTIONER, "TPL201") == [15]


def test_a_plain_class_calling_itself_is_left_alone() -> None:
    plain = CAPTIONER.replace("class Captioner(nn.Module):", "class Captioner:")
    assert _lines(plain, "TPL201") == []
