"""Round 53: a per-batch host copy appended to an object built on a file path (fairseq's
wav2vec feature scripts: ``npaa = NpyAppendArray(save_path + ".npy")``, then
``npaa.append(x.cpu().numpy())`` for each batch) is written to that file: the loop's output in
inference, as ``np.save`` of it is (TPL201). A list, or an object built from anything but a
path, collects in memory and is still reported."""

from __future__ import annotations

from .helpers import lines

APPEND = """\
import numpy as np
import torch
from npy_append_array import NpyAppendArray


def main(args):
    features = np.load(args.data + ".npy", mmap_mode="r")
    pca_A = torch.from_numpy(np.load(args.pca + "_A.npy")).cuda()
    npaa = NpyAppendArray(args.save_path + ".npy")
    with torch.no_grad():
        for start in range(0, features.shape[0], args.batch_size):
            x = torch.from_numpy(features[start : start + args.batch_size]).cuda()
            x = torch.matmul(x, pca_A)
            npaa.append(x.cpu().numpy())
"""


def test_append_to_file_writer_is_output() -> None:
    assert lines(APPEND, "TPL201", "apply_pca.py") == []


def test_append_to_writer_opened_by_with_is_output() -> None:
    opened = APPEND.replace(
        '    npaa = NpyAppendArray(args.save_path + ".npy")\n    with torch.no_grad():\n',
        "    with NpyAppendArray(out_path) as npaa, torch.no_grad():\n",
    )
    assert lines(opened, "TPL201", "apply_pca.py") == []


def test_append_to_a_list_still_reported() -> None:
    listed = APPEND.replace('NpyAppendArray(args.save_path + ".npy")', "[]")
    assert lines(listed, "TPL201", "apply_pca.py") == [14]


def test_append_to_an_object_not_built_on_a_path_still_reported() -> None:
    meter = APPEND.replace('NpyAppendArray(args.save_path + ".npy")', "Meter(window=20)")
    assert lines(meter, "TPL201", "apply_pca.py") == [14]


def test_append_in_training_still_reported() -> None:
    trains = APPEND.replace(
        "            npaa.append(x.cpu().numpy())\n",
        "            x.sum().backward()\n            npaa.append(x.cpu().numpy())\n",
    ).replace("    with torch.no_grad():\n", "    if True:\n")
    assert lines(trains, "TPL201", "apply_pca.py") == [15]
