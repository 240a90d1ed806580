"""Corpus round 31: false positives found on a 3D renderer's scripts, tabular-model libraries and
text-to-speech apps, each as the look-alike that must stay clean next to the pitfall that must
still be found."""

from __future__ import annotations

from .helpers import lines


def _lines(source: str, code: str, path: str = "pipeline.py") -> list[int]:
    return lines(source, code, path)


# ---- TPL301: a loop header walking the rows of a placed tensor

FRAME_CLOCK = """\
import time

import torch


def sweep(net, cameras):
    images = []
    tick = time.time()
    for k, cam in enumerate(cameras):
        print(k, time.time() - tick)
        tick = time.time()
        images.append(net(cam).cpu().numpy())
    return images


def run(net, cameras, device):
    return sweep(net.to(device), torch.as_tensor(cameras).to(device))
"""


def test_a_clock_read_first_in_a_loop_over_placed_rows_is_left_alone() -> None:
    assert _lines(FRAME_CLOCK, "TPL301") == []


def test_a_clock_read_after_the_model_runs_on_each_row_is_reported() -> None:
    source = """\
import time

import torch


def sweep(net, cameras):
    tick = time.time()
    for k, cam in enumerate(cameras):
        image = net(cam)
        print(k, time.time() - tick)
    return image


def run(net, cameras, device):
    return sweep(net.to(device), torch.as_tensor(cameras).to(device))
"""
    assert _lines(source, "TPL301") == [7]


# ---- TPL201: a value found to be a list by `isinstance`, copied head by head

HEADS = """\
import torch


class Runner:
    def __init__(self, net, device):
        self.net = net.to(device)
        self.device = device

    def _one_batch(self, feats):
        feats = feats.to(self.device).float()
        logits, _ = self.net(feats)
        if isinstance(logits, (list, tuple)):
            logits = [head.cpu().detach().numpy() for head in logits]
        else:
            logits = logits.cpu().detach().numpy()
        return logits

    def infer(self, loader):
        return [self._one_batch(feats) for feats, _ in loader]
"""


def test_copies_of_the_heads_a_list_test_finds_are_left_alone() -> None:
    assert _lines(HEADS, "TPL201", "runner.py") == []


def test_a_scalar_read_of_each_head_is_reported() -> None:
    source = HEADS.replace(
        "logits = [head.cpu().detach().numpy() for head in logits]",
        "logits = sum(head.max().item() for head in logits)",
    )
    assert _lines(source, "TPL201", "runner.py") == [13]


# ---- TPL201: copies returned inside a dict display

SPEAKER = """\
import torch


class Speaker:
    def __init__(self, vocoder, device):
        self.vocoder = vocoder.to(device)
        self.device = device

    def say(self, lines):
        chunks = []
        for line in lines:
            ids = torch.LongTensor(self.tokenize(line)).unsqueeze(0).to(self.device)
            with torch.no_grad():
                chunks.append(self.vocoder(ids).cpu().squeeze())
        return {"audio": torch.cat(chunks, dim=0).numpy(), "parts": len(chunks)}
"""


def test_copies_returned_joined_in_a_dict_are_left_alone() -> None:
    assert _lines(SPEAKER, "TPL201", "speaker.py") == []


def test_a_value_computed_from_the_copies_in_a_dict_is_reported() -> None:
    source = SPEAKER.replace(
        '{"audio": torch.cat(chunks, dim=0).numpy(), "parts": len(chunks)}',
        '{"peak": torch.cat(chunks, dim=0).abs().max(), "parts": len(chunks)}',
    )
    assert _lines(source, "TPL201", "speaker.py") == [14]


# ---- TPL201: copies joined after the loop and decoded once into what the function returns

PREDICT = """\
import numpy as np
import torch


class Tabular:
    def __init__(self, net, device):
        self.net = net.to(device)
        self.device = device

    def to_labels(self, scores):
        return np.argmax(scores, axis=1)

    def predict(self, loader):
        self.net.eval()
        parts = []
        for rows in loader:
            rows = rows.to(self.device).float()
            scores = self.net(rows)
            parts.append(scores.cpu().detach().numpy())
        stacked = np.vstack(parts)
        return self.to_labels(stacked)
"""


def test_copies_joined_and_decoded_into_the_result_are_left_alone() -> None:
    assert _lines(PREDICT, "TPL201", "tabular.py") == []


def test_copies_joined_only_to_be_scored_are_reported() -> None:
    source = PREDICT.replace(
        "return self.to_labels(stacked)", "return f1_score(self.labels, stacked.argmax(1))"
    )
    assert _lines(source, "TPL201", "tabular.py") == [19]


# ---- TPL301: a helper whose test of a torch result reads the device back

CLIP_CHECK = """\
import time

import torch


def clip_checked(net, limit):
    norm = torch.nn.utils.clip_grad_norm_(net.parameters(), limit)
    if torch.isinf(norm):
        print("gradient overflow")
        return True
    return False


def fit(net, batches, opt, device):
    net = net.to(device)
    for x, y in batches:
        began = time.time()
        x, y = x.to(device), y.to(device)
        loss = (net(x) - y).abs().mean()
        loss.backward()
        clip_checked(net, 5.0)
        opt.step()
        print(time.time() - began)
"""


def test_a_timed_step_whose_helper_tests_a_torch_result_is_left_alone() -> None:
    assert _lines(CLIP_CHECK, "TPL301") == []


def test_a_timed_step_whose_helper_only_clips_is_reported() -> None:
    source = CLIP_CHECK.replace("if torch.isinf(norm):", "if limit > 100:")
    assert _lines(source, "TPL301") == [17]


# ---- TPL301: a batch reshaped on the host, moved only below the clock's read

HOST_RESHAPE = """\
import time


def fit(net, batches, opt):
    net = net.cuda()
    for batch in batches:
        began = time.time()
        feats, marks = batch
        feats = feats.view(4, -1).t().reshape(feats.shape)
        marks = marks.view(4, -1).t().reshape(marks.shape)
        wait = time.time() - began
        feats = feats.cuda(non_blocking=True)
        marks = marks.cuda(non_blocking=True)
        loss = net(feats, marks)
        loss.backward()
        opt.step()
        print(wait)
"""


def test_a_batch_reshaped_before_its_move_is_left_alone() -> None:
    assert _lines(HOST_RESHAPE, "TPL301") == []


def test_a_batch_reshaped_after_its_move_is_reported() -> None:
    source = HOST_RESHAPE.replace(
        "        feats, marks = batch\n",
        "        feats, marks = batch\n        feats = feats.cuda(non_blocking=True)\n",
    )
    assert _lines(source, "TPL301") == [7]
