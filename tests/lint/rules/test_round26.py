"""Corpus round 26: false positives found on federated learning, sentence embedding, metric,
speech recognition and video restoration code, and on self-supervised learning, optimizer,
interpretability, adversarial robustness, graph, recommendation, audio and super-resolution
libraries, each as the look-alike that must stay clean next to the pitfall that must still be
found."""

from __future__ import annotations

from torchplace.lint import lint_source


def _lines(source: str, code: str, path: str = "layers.py") -> list[int]:
    return [f.line for f in lint_source(source, path, select={code})]


# ---- TPL201: a pass over a state dict copy, or over the gradients of the parameters

PARAMS = """\
import torch


class Client:
    def __init__(self, net, device):
        self.net = net.to(device)
        self.kept = {}

    def get_weights(self):
        weights = self.net.state_dict().copy()
        for key in self.kept.keys():
            weights[key] = self.kept[key]
        return [w.cpu().numpy() for _, w in weights.items()]

    def meta_grads(self, loss):
        grads = torch.autograd.grad(loss, list(self.net.parameters()))
        grads = [g.cpu().numpy() for g in grads]
        return grads
"""


def test_a_pass_over_a_state_dict_copy_or_gradients_is_left_alone() -> None:
    assert _lines(PARAMS, "TPL201") == []


def test_a_pass_over_a_list_of_outputs_is_reported() -> None:
    source = PARAMS.replace("self.net.state_dict().copy()", "self.net.heads(self.kept)")
    assert _lines(source, "TPL201") == [13]


# ---- TPL201: per-batch outputs placed by a helper or prepared from a chunk, then returned

EMBED = """\
import numpy as np
import torch


def _collate(batch, device):
    return {k: v.to(device) for k, v in batch.items()}


def embed_all(model, loader, device):
    embs, weights = [], []
    for batch in loader:
        with torch.no_grad():
            batch = _collate(batch, device)
            out = model(batch["ids"], batch["mask"])
        embs.append(out.cpu())
        weights.append(batch["mask"].float().cpu())
    return torch.cat(embs), torch.cat(weights)


class Encoder:
    def __init__(self, model, device):
        self.model = model.to(device)
        self.device = device

    def encode(self, texts, batch_size=32, to_numpy=True):
        found = []
        order = np.argsort([len(t) for t in texts])
        ranked = [texts[i] for i in order]
        for start in range(0, len(ranked), batch_size):
            batch = self.tokenize(ranked[start : start + batch_size])
            batch = {k: v.to(self.device) for k, v in batch.items()}
            with torch.no_grad():
                emb = self.model(**batch)
                if to_numpy:
                    emb = emb.cpu()
                found.extend(emb)
        found = [found[i] for i in np.argsort(order)]
        return found
"""


def test_outputs_placed_by_a_helper_or_from_a_chunk_and_returned_are_left_alone() -> None:
    assert _lines(EMBED, "TPL201") == []


def test_outputs_of_a_loop_that_takes_no_fresh_input_are_reported() -> None:
    source = EMBED.replace(
        "self.tokenize(ranked[start : start + batch_size])", "self.tokenize(texts)"
    )
    source = source.replace("batch = _collate(batch, device)", "batch = _collate(loader, device)")
    assert _lines(source, "TPL201") == [15, 16, 35]


# ---- TPL201: an integer setting of a model in `torch.tensor([...])`

BLANK = """\
import torch


def decode(model, loader, device):
    model = model.eval().to(device)
    for x in loader:
        out = model(x.to(device))
        start = torch.tensor([model.blank]).reshape(1, 1)
        steps = torch.tensor([out.blank])
        yield start, steps
"""


def test_a_setting_of_a_model_is_left_alone_and_an_output_is_reported() -> None:
    assert _lines(BLANK, "TPL201") == [9]


# ---- TPL201: a patch's host copy masked in place, then added into a host canvas

TILES = """\
import torch


def run_tiles(model, lq, device, tile):
    model = model.to(device)
    lq = lq.to(device)
    canvas = torch.zeros(lq.shape)
    weight = torch.zeros_like(canvas)
    for i in range(0, lq.shape[-1], tile):
        patch = model(lq[..., i : i + tile]).detach().cpu()
        mask = torch.ones_like(patch)
        if i > 0:
            patch[..., :2] *= 0
            mask[..., :2] *= 0
        canvas[..., i : i + tile].add_(patch)
        weight[..., i : i + tile].add_(mask)
    return canvas / weight
"""


def test_a_masked_patch_added_into_a_host_canvas_is_left_alone() -> None:
    assert _lines(TILES, "TPL201") == []


def test_a_patch_whose_values_are_read_is_reported() -> None:
    source = TILES.replace("        mask = torch.ones_like(patch)\n", "        mask = patch > 0\n")
    assert _lines(source, "TPL201") == [10]
