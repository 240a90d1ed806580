"""Recall round 33: pitfalls missed in detection and training code, each next to the look-alike that
must stay clean: a loop over a counter that reads back, one by one, the rows of a tensor on the
device (``for k in range(n): crops[k].cpu()``, ``[float(s[i]) for i in range(len(s))]``), where
one copy of the whole tensor would do; and a read under ``if hits[t] == 1:``, a test of an
element the loop picks by its index, which holds on any step (data), not a few of them."""

from __future__ import annotations

from .helpers import lines as _lines

# ---- TPL201: a counter loop that reads back each row of a device tensor

CROP_RANKER = """\
import torch


def rank_crops(net, crops, count, device):
    net = net.to(device)
    crops = crops.to(device)
    logits = net(crops)
    ranked = []
    for k in range(count):
        value = logits[k].item()
        ranked.append((value, k))
    return sorted(ranked)
"""


def test_a_counter_loop_reading_back_each_row_of_a_device_output_is_reported() -> None:
    assert _lines(CROP_RANKER, "TPL201") == [10]
    # the row of a moved tensor, copied as a whole row, by index in a tuple
    copied = CROP_RANKER.replace("logits[k].item()", "crops[k, :].cpu().numpy()")
    assert _lines(copied, "TPL201") == [10]
    # in a comprehension over `range(len(...))`
    listed = CROP_RANKER.replace(
        "    for k in range(count):\n        value = logits[k].item()\n"
        "        ranked.append((value, k))\n",
        "    ranked = [float(logits[k]) for k in range(len(logits))]\n",
    )
    assert _lines(listed, "TPL201") == [9]


def test_a_counter_loop_over_host_values_a_few_steps_or_one_step_is_left_alone() -> None:
    # the loop indexes a host copy taken once before it
    host = CROP_RANKER.replace("    ranked = []\n", "    logits = logits.cpu()\n    ranked = []\n")
    assert _lines(host, "TPL201") == []
    # the loop indexes a Python list of host numbers
    listed = CROP_RANKER.replace("logits[k].item()", "float(weights[k])").replace(
        "    ranked = []\n", "    weights = [0.5] * count\n    ranked = []\n"
    )
    assert _lines(listed, "TPL201") == []
    # a loop over a few constant steps: the heads of a model, one read each
    heads = CROP_RANKER.replace("range(count)", "range(3)")
    assert _lines(heads, "TPL201") == []
    # a loop that leaves after its first step
    once = CROP_RANKER.replace(
        "        ranked.append((value, k))\n", "        ranked.append((value, k))\n        break\n"
    )
    assert _lines(once, "TPL201") == []
    # each row's copy is written out as its own file: the loop's output
    saved = CROP_RANKER.replace(
        "        value = logits[k].item()\n        ranked.append((value, k))\n",
        "        np.save(f'crop{k}.npy', crops[k].cpu().numpy())\n",
    ).replace("import torch\n", "import numpy as np\nimport torch\n")
    assert _lines(saved, "TPL201") == []


# ---- TPL201: a read under a test of an element picked by the loop's index

ANCHOR_TARGETS = """\
import torch


def fit(net, loader, opt, device):
    net.to(device)
    for imgs, labels in loader:
        imgs, labels = imgs.to(device), labels.to(device)
        out = net(imgs)
        hits = (out[0, :, 0] > 0.5).cpu()
        for t in range(hits.shape[0]):
            if hits[t] == 1:
                out[0, t, int(labels[0, t].cpu())] += 1
        loss = out.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_a_read_under_a_test_of_an_element_picked_by_index_is_reported() -> None:
    assert _lines(ANCHOR_TARGETS, "TPL201") == [9, 12]


def test_a_read_under_a_test_of_the_counter_or_a_setting_stays_rare() -> None:
    # `if t == 1:` holds on one step of the loop
    counter = ANCHOR_TARGETS.replace("if hits[t] == 1:", "if t == 1:")
    assert _lines(counter, "TPL201") == [9]
    # a setting picked by a constant key is the same on every step
    setting = ANCHOR_TARGETS.replace("if hits[t] == 1:", 'if flags["debug"] == 1:')
    assert _lines(setting, "TPL201") == [9]
