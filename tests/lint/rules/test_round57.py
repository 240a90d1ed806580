"""Round 57: a ``while`` loop that recomputes a device value every step is a batch loop, as a
``for`` loop that does is (litgpt's speculative decoding: ``input_pos = torch.tensor([n],
device=device)``, then ``while input_pos < max_tokens - 1:`` reading ``(max_tokens - input_pos
- 1).item()`` and advancing ``input_pos.add_(accepted)`` each step), and so is a loop that
updates a device tensor in place (TPL201). A streaming generator that builds each item on the
host from the read (sam2's demo server: ``masks = (...).cpu().numpy()``, ``rles =
encode(masks)``, ``yield Response(frame, rles)`` every step) hands the read out as its
output; a yield every N steps does not (TPL201)."""

from __future__ import annotations

from .helpers import lines

DECODE = """\
import torch


def generate(model, step, prompt, max_tokens, device):
    input_pos = torch.tensor([prompt.shape[0]], device=device)
    tokens = []
    while input_pos < max_tokens - 1:
        k = min(4, (max_tokens - input_pos - 1).item())
        new = step(model, prompt, input_pos, k)
        tokens.extend(new)
        input_pos.add_(len(new))
    return tokens
"""


def test_a_while_loop_advancing_a_device_position_in_place_reads_every_step() -> None:
    assert lines(DECODE, "TPL201") == [7, 8]


def test_a_while_loop_rebinding_a_device_position_reads_every_step() -> None:
    source = DECODE.replace("input_pos.add_(len(new))", "input_pos = input_pos + len(new)")
    source = source.replace("while input_pos < max_tokens - 1:", "while len(tokens) < max_tokens:")
    assert lines(source, "TPL201") == [8]


def test_a_while_loop_over_a_host_position_is_left_alone() -> None:
    source = DECODE.replace(
        "torch.tensor([prompt.shape[0]], device=device)", "torch.tensor([prompt.shape[0]])"
    )
    assert lines(source, "TPL201") == []


def test_a_setting_changed_in_place_is_not_a_step() -> None:
    """``requires_grad_`` flips a flag; nothing is computed on the device."""
    source = DECODE.replace("input_pos.add_(len(new))", "input_pos.requires_grad_(False)")
    assert lines(source, "TPL201") == []


STREAM = """\
import torch


def encode(masks):
    return [m.tobytes() for m in masks]


class Predictor:
    def __init__(self, model, device):
        self.model = model.to(device)
        self.device = device

    def propagate(self, frames):
        for frame in frames:
            logits = self.model(frame.to(self.device))
            masks = (logits > 0).cpu().numpy()
            rles = encode(masks)
            yield {"frame": frame, "masks": rles}
"""


def test_a_stream_built_every_step_from_the_read_is_its_output() -> None:
    assert lines(STREAM, "TPL201") == []


def test_a_stream_yielding_every_few_steps_reads_on_the_others_too() -> None:
    source = STREAM.replace(
        "        for frame in frames:", "        for i, frame in enumerate(frames):"
    )
    source = source.replace(
        '            yield {"frame": frame, "masks": rles}',
        '            if i % 8 == 0:\n                yield {"frame": frame, "masks": rles}',
    )
    assert lines(source, "TPL201") == [16]


# ---- TPL201: Python's min/max compares tensors with `<`, each comparison a `bool()` read

BEST = """\
import torch


def train(model, loader, opt, device, params):
    model.to(device)
    best = 0.0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        best = max(best, loss)
        worst = min(loss.item(), 10.0)
        longest = max(params.max_len, len(x))
    return best, worst, longest
"""


def test_min_and_max_of_a_device_value_in_a_batch_loop_are_reads() -> None:
    """``max(best, loss)`` compares ``loss > best``; ``.item()`` first reads once, as the
    finding on that line says; a field of another object (an int beside its tensors) is not
    taken for one."""
    assert lines(BEST, "TPL201") == [12, 13]


def test_min_and_max_after_the_loop_are_left_alone() -> None:
    source = BEST.replace("        best = max(best, loss)\n", "")
    source = source.replace(
        "    return best, worst", "    best = max(best, loss)\n    return best, worst"
    )
    assert lines(source, "TPL201") == [12]
