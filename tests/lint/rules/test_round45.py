"""Round 45: a text generator that copies its sequence back under a repeated ``if
train_on_gpu:``, and checkpoints a program loads after saving them through a helper (a
notebook's ``load_checkpoint(filepath)``, a training function's ``save_path``, Informer's
``EarlyStopping``)."""

from __future__ import annotations

import pytest

from .helpers import lines, notebook, notebook_cells, project

# ---- TPL201: a name copied back to the host under a test that an earlier branch repeats

GENERATE = """\
import numpy as np
import torch

train_on_gpu = torch.cuda.is_available()


def generate(rnn, prime_id, pad_value, predict_len=100):
    current_seq = np.full((1, 20), pad_value)
    predicted = [prime_id]
    for _ in range(predict_len):
        if train_on_gpu:
            current_seq = torch.LongTensor(current_seq).cuda()
        else:
            current_seq = torch.LongTensor(current_seq)
        output, _ = rnn(current_seq, None)
        word_i = int(np.argmax(output.detach().cpu().numpy()))
        predicted.append(word_i)
        if train_on_gpu:
            current_seq = current_seq.cpu()
{between}        if {test}:
            current_seq = current_seq.cpu()
        current_seq = np.roll(current_seq, -1, 1)
    return predicted
"""


def test_second_copy_under_the_same_test_is_clean() -> None:
    # the second body runs only where the first did: `current_seq` is a host tensor there
    source = GENERATE.format(between="", test="train_on_gpu")
    assert lines(source, "TPL201") == [16, 19]


def test_second_copy_under_a_repeated_availability_query_is_clean() -> None:
    source = GENERATE.replace("if train_on_gpu:", "if torch.cuda.is_available():").format(
        between="", test="torch.cuda.is_available()"
    )
    assert lines(source, "TPL201") == [16, 19]


UNCONDITIONAL = """\
import torch


def generate(rnn, seq, n, use_gpu, other):
    for _ in range(n):
        seq = torch.LongTensor(seq).cuda()
        out = rnn(seq)
        if use_gpu:
            seq = seq.cpu()
{between}        if {test}:
            seq = seq.cpu()
        print(seq.cpu())
"""


def test_copy_under_a_repeated_test_of_a_value_moved_on_every_path_is_clean() -> None:
    # the second `if use_gpu:` runs only after the first copied `seq` back; without
    # `use_gpu` nothing copied it: the `print` still waits
    source = UNCONDITIONAL.format(between="", test="use_gpu")
    assert lines(source, "TPL201") == [9, 12]


def test_copy_under_another_test_is_found() -> None:
    source = UNCONDITIONAL.format(between="", test="other")
    assert lines(source, "TPL201") == [9, 11, 12]


def test_copy_after_the_test_is_rebound_is_found() -> None:
    source = UNCONDITIONAL.format(between="        use_gpu = other\n", test="use_gpu")
    assert lines(source, "TPL201") == [9, 12, 13]


def test_copy_after_the_name_is_moved_again_is_found() -> None:
    source = UNCONDITIONAL.format(between="        seq = seq.cuda()\n", test="use_gpu")
    assert lines(source, "TPL201") == [9, 12, 13]


# ---- TPL401: a checkpoint saved through a helper of the linted code, then loaded

TOOLS = """\
import numpy as np
import torch


class EarlyStopping:
    def __init__(self, patience=7, verbose=False):
        self.patience = patience
        self.best_score = None
        self.early_stop = False

    def __call__(self, val_loss, model, path):
        score = -val_loss
        if self.best_score is None or score > self.best_score:
            self.best_score = score
            self.save_checkpoint(val_loss, model, path)

    def save_checkpoint(self, val_loss, model, path):
        torch.save(model.state_dict(), path + '/' + '{saved}')
"""

EXP = """\
import os

import torch

from utils.tools import EarlyStopping


class Exp:
    def __init__(self, args):
        self.device = torch.device("cuda" if args.use_gpu else "cpu")

    def train(self, setting):
        path = os.path.join(self.args.checkpoints, setting)
        early_stopping = EarlyStopping(patience=self.args.patience, verbose=True)
        for epoch in range(self.args.train_epochs):
            vali_loss = self.vali()
            early_stopping(vali_loss, self.model, path)
        best_model_path = path + '/' + 'checkpoint.pth'
        self.model.load_state_dict(torch.load(best_model_path))
        return self.model

    def predict(self, setting):
        path = os.path.join(self.args.checkpoints, setting)
        best_model_path = path + '/' + 'checkpoint.pth'
        self.model.load_state_dict(torch.load(best_model_path))
"""


def test_checkpoint_an_early_stopping_instance_saved_is_clean(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # `predict` reads a checkpoint of an earlier run: still reported
    root = tmp_path_factory.mktemp("project")
    files = {"utils/tools.py": TOOLS.format(saved="checkpoint.pth"), "exp/exp.py": EXP}
    assert project(root, files, "TPL401") == [("exp/exp.py", 25)]


def test_checkpoint_the_helper_saves_under_another_name_is_found(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("project")
    files = {"utils/tools.py": TOOLS.format(saved="last.pth"), "exp/exp.py": EXP}
    assert project(root, files, "TPL401") == [("exp/exp.py", 19), ("exp/exp.py", 25)]


SAVE_HELPER = """\
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"


def {helper}(model, {param}):
    {body}


def main(model, out_dir):
    {helper}(model, out_dir + "/best.pt")
    model.load_state_dict(torch.load(out_dir + "/best.pt"))
"""


def test_load_after_a_function_that_saves_to_its_parameter_is_clean() -> None:
    source = SAVE_HELPER.format(
        helper="keep", param="dest", body="torch.save(model.state_dict(), dest)"
    )
    assert lines(source, "TPL401") == []


def test_load_after_a_function_that_saves_a_file_of_its_own_is_found() -> None:
    source = SAVE_HELPER.format(
        helper="keep", param="dest", body='dest = "other.pt"\n    torch.save(model, dest)'
    )
    assert lines(source, "TPL401") == [13]


def test_load_after_a_download_to_its_save_path_is_found() -> None:
    # a download helper's `save_path` holds a file from elsewhere
    source = SAVE_HELPER.format(
        helper="download",
        param="save_path",
        body='urllib.request.urlretrieve("https://example.com/w.pt", save_path)',
    )
    assert lines("import urllib.request\n" + source, "TPL401") == [13]


TRAIN_TODO = """\
import torch

use_cuda = torch.cuda.is_available()


def train(n_epochs, loaders, model, optimizer, criterion, use_cuda, save_path):
    for epoch in range(1, n_epochs + 1):
        model.train()
        for data, target in loaders["train"]:
            if use_cuda:
                data, target = data.cuda(), target.cuda()
        model.eval()
        ## TODO: save the model if validation loss has decreased
    return model


model_scratch = train(100, loaders, model_scratch, optimizer, criterion, use_cuda, {given})
model_scratch.load_state_dict(torch.load('model_scratch.pt'))
"""


def test_load_after_training_given_the_path_as_its_save_path_is_clean() -> None:
    source = TRAIN_TODO.format(given="'model_scratch.pt'")
    assert lines(source, "TPL401") == []


def test_load_after_training_given_another_save_path_is_found() -> None:
    source = TRAIN_TODO.format(given="'model_transfer.pt'")
    assert lines(source, "TPL401") == [18]


SETUP = "import torch\ndevice = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
SAVE = "torch.save(checkpoint, 'checkpoint.pth')\n"
LOADER = (
    "def load_checkpoint(filepath):\n    checkpoint = torch.load(filepath)\n    return checkpoint\n"
)


def test_notebook_helper_loading_what_an_earlier_cell_saved_is_clean() -> None:
    raw = notebook(SETUP, SAVE, LOADER, "model = load_checkpoint('checkpoint.pth')\n")
    assert notebook_cells(raw, "TPL401") == []


def test_notebook_helper_loading_another_file_is_found() -> None:
    raw = notebook(SETUP, SAVE, LOADER, "model = load_checkpoint('downloaded.pth')\n")
    assert notebook_cells(raw, "TPL401") == [(3, 2)]


def test_notebook_helper_called_before_the_save_is_found() -> None:
    raw = notebook(SETUP, LOADER, "model = load_checkpoint('checkpoint.pth')\n", SAVE)
    assert notebook_cells(raw, "TPL401") == [(2, 2)]


def test_notebook_helper_also_called_from_a_function_is_found() -> None:
    caller = "def restore(path):\n    return load_checkpoint(path)\n"
    raw = notebook(SETUP, SAVE, LOADER, "model = load_checkpoint('checkpoint.pth')\n", caller)
    assert notebook_cells(raw, "TPL401") == [(3, 2)]
