"""Corpus round 22: false positives found on scientific code (graph neural network examples,
medical-imaging training, time-series forecasting, molecule generation), each as the
look-alike that must stay clean next to the pitfall that must still be found."""

from __future__ import annotations

from .helpers import lines

# ---- every rule: a file of another array framework that never imports torch

MXNET = """\
import mxnet as mx
from mxnet import gluon

ctx = mx.gpu(0)
g = g.to(ctx)
model = Net()
trainer = gluon.Trainer(model.collect_params(), "adam")
for epoch in range(200):
    with mx.autograd.record():
        logits = model(g, features)
        loss = loss_fcn(logits, labels)
    loss.backward()
    trainer.step(batch_size=1)
    print("loss {:.4f}".format(loss.asscalar()))
"""


def test_an_mxnet_training_loop_is_left_alone() -> None:
    assert lines(MXNET, "TPL201") == []


def test_the_same_loop_in_a_file_that_imports_torch_is_reported() -> None:
    source = MXNET.replace("import mxnet as mx\n", "import mxnet as mx\nimport torch\n")
    assert lines(source, "TPL201") == [15]


# ---- TPL104: a `torch.device("cuda")` default in multi-rank code places nothing by itself

TRAINER = """\
import torch
import torch.distributed as dist


class Trainer:
    def __init__(self, plans, device: torch.device = torch.device("cuda")):
        self.is_ddp = dist.is_available() and dist.is_initialized()
        self.local_rank = 0 if not self.is_ddp else dist.get_rank()
        self.device = device
        if self.is_ddp:
            self.device = torch.device(type="cuda", index=self.local_rank)
"""


def test_a_device_default_the_trainer_resolves_per_rank_is_left_alone() -> None:
    assert lines(TRAINER, "TPL104") == []


def test_a_bare_cuda_placement_in_the_same_trainer_is_reported() -> None:
    source = TRAINER + "        self.buf = torch.zeros(4, device=torch.device('cuda'))\n"
    assert lines(source, "TPL104") == [12]


# ---- TPL104: the `else` of a branch that starts the process group runs one process

SETUP = """\
import torch
import torch.distributed as dist


def main(args):
    local_rank = args.local_rank
    if args.multi_gpu_flag:
        dist.init_process_group(backend="nccl", init_method="env://")
        device = torch.device(f"cuda:{local_rank}")
        torch.cuda.set_device(device)
    else:
        device = torch.device("cuda")
    net = get_network().to(device)
"""


def test_cuda_in_the_else_of_the_group_set_up_is_left_alone() -> None:
    assert lines(SETUP, "TPL104") == []


def test_cuda_after_the_group_set_up_is_reported() -> None:
    source = SETUP.replace('    else:\n        device = torch.device("cuda")\n', "")
    source = source.replace('f"cuda:{local_rank}"', '"cuda"')
    assert lines(source, "TPL104") == [9]


# ---- TPL104: a `device="cuda"` default rebound to the CPU when CUDA is unavailable

LOAD = """\
import torch


class Learner:
    def load(self, fname, device="cuda"):
        if not torch.cuda.is_available():
            device = "cpu"
        state = torch.load(fname, map_location=device)
        self.model.load_state_dict(state)
        self.model.to(device)
"""


def test_a_cuda_default_with_a_cpu_fallback_is_left_alone() -> None:
    assert lines(LOAD, "TPL104") == []


def test_a_cuda_default_without_the_fallback_is_reported() -> None:
    source = LOAD.replace(
        '        if not torch.cuda.is_available():\n            device = "cpu"\n', ""
    )
    assert lines(source, "TPL104") == [5]


# ---- TPL103: a factory handed to the project's helper that moves its argument

DECODER = """\
import torch
import torch.nn as nn


def cuda(x):
    if torch.cuda.is_available():
        return x.to(torch.device("cuda"))
    return x


class Decoder(nn.Module):
    def forward(self, tree):
        n = tree.num_nodes()
        h = cuda(torch.zeros(n, self.hidden_size))
        return self.cell(tree.x, h)
"""


def test_a_factory_moved_by_the_projects_helper_is_left_alone() -> None:
    assert lines(DECODER, "TPL103") == []


def test_a_factory_handed_to_a_helper_that_keeps_it_on_the_cpu_is_reported() -> None:
    source = DECODER.replace('x.to(torch.device("cuda"))', 'x.to("cpu")')
    assert lines(source, "TPL103") == [14]


# ---- TPL201: matplotlib's `plt.xlabel(...)` does not make a CPU-only script device code

REGRESSION = """\
import matplotlib.pyplot as plt
import torch

optimizer = torch.optim.Adam(gpr.parameters(), lr=0.005)
losses = []
for i in range(2000):
    optimizer.zero_grad()
    loss = loss_fn(gpr.model, gpr.guide)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
plt.plot(losses)
plt.xlabel("Iterations")
"""


def test_a_cpu_only_script_that_labels_its_plot_is_left_alone() -> None:
    assert lines(REGRESSION, "TPL201", "gp.py") == []


def test_the_same_script_on_an_xla_device_is_reported() -> None:
    source = REGRESSION.replace("import torch\n", "import torch\nimport torch_xla\n")
    assert lines(source, "TPL201", "gp.py") == [12]


# ---- TPL201: a keyed item of a batch the loop never moves stays on the host

KEYED = """\
import torch


def infer(val_loader, model, device):
    for batch in val_loader:
        labels = batch["label"].to(device)
        dim = batch["dim"]
        output_size = (dim[0].item(), dim[1].item())
        model(labels, output_size)
"""


def test_a_keyed_item_the_loop_never_moves_is_left_alone() -> None:
    assert lines(KEYED, "TPL201") == []


def test_a_keyed_item_the_loop_moves_is_reported() -> None:
    source = KEYED.replace('dim = batch["dim"]', 'dim = batch["dim"].to(device)')
    assert lines(source, "TPL201") == [8, 8]


# ---- TPL201: a MONAI MetaTensor's metadata (`img.meta["filename_or_obj"]`) is Python data

META = """\
import torch


def extract(loader, model, device):
    for batch_data in loader:
        img = batch_data["image"].to(device)
        fn = img.meta["filename_or_obj"][0]
        print(f"extracting {fn}")
        torch.save(model(img), fn.replace(".nii.gz", ".pt"))
"""


def test_a_file_name_from_a_meta_tensors_metadata_is_left_alone() -> None:
    assert lines(META, "TPL201") == []


def test_a_value_of_the_moved_image_itself_is_reported() -> None:
    source = META.replace('fn = img.meta["filename_or_obj"][0]', "fn = img.max()")
    assert lines(source, "TPL201") == [8]


# ---- TPL501: a branch rebinds the attribute to a `ModuleDict` before storing modules in it

EMBEDS = """\
import torch.nn as nn


class EmbedLayer(nn.Module):
    def __init__(self, g, sparse_emb, dist_emb):
        super().__init__()
        if sparse_emb and dist_emb:
            self.node_embeds = {}
            for ntype in g.ntypes:
                self.node_embeds[ntype] = DistEmbedding(g.num_nodes(ntype), 16)
        else:
            self.node_embeds = nn.ModuleDict()
            for ntype in g.ntypes:
                self.node_embeds[ntype] = nn.Embedding(g.num_nodes(ntype), 16)
"""


def test_modules_stored_in_a_rebound_module_dict_are_left_alone() -> None:
    assert lines(EMBEDS, "TPL501", "model.py") == []


def test_modules_stored_in_the_plain_dict_are_reported() -> None:
    source = EMBEDS.replace("DistEmbedding(g.num_nodes(ntype), 16)", "nn.Linear(4, 16)")
    source = source.replace("            self.node_embeds = nn.ModuleDict()\n", "")
    assert lines(source, "TPL501", "model.py") == [10, 13]


# ---- TPL801: a model already on the device, moved again after training

RELOAD = """\
import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = SwinUNETR(in_channels=4, out_channels=3).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
train(model, optimizer)
model.load_state_dict(torch.load("model.pt", map_location=device, weights_only=True))
model.to(device)
train(model, optimizer)
"""


def test_a_model_moved_again_after_the_optimizer_is_left_alone() -> None:
    assert lines(RELOAD, "TPL801") == []


def test_a_model_moved_first_after_the_optimizer_is_reported() -> None:
    source = RELOAD.replace(".to(device)\noptimizer", "\noptimizer")
    assert lines(source, "TPL801") == [5]


# ---- TPL103: a 0-dim `torch.tensor` of a name bound only to Python numbers

MASK = """\
import numpy as np
import torch
import torch.nn as nn


class SequenceAttLayer(nn.Module):
    def forward(self, queries, keys, mask):
        if self.softmax_stag:
            mask_value = -np.inf
        else:
            mask_value = 0.0
        output = self.att(queries, keys)
        output = output.masked_fill(mask=mask, value=torch.tensor(mask_value))
        return output
"""


def test_a_0_dim_tensor_of_a_python_number_is_left_alone() -> None:
    assert lines(MASK, "TPL103", "layers.py") == []


def test_a_tensor_of_a_name_bound_to_a_list_is_reported() -> None:
    source = MASK.replace("mask_value = 0.0", "mask_value = [0.0, 1.0]")
    assert lines(source, "TPL103", "layers.py") == [13]
