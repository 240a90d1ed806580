"""Round 74: the CUDA arm of ``if cpu: torch.load(p, map_location="cpu")``, ``else:
torch.load(p)`` (TPL401); a ``dict(...)`` of keywords unpacked into a load (TPL402); a
``map_location`` parameter that defaults to ``None`` and that no call passes (TPL401)."""

from __future__ import annotations

from pathlib import Path

from .helpers import lines as _lines
from .helpers import project as _project

MIRRORED = """\
import torch


def load_checkpoints(config, checkpoint_path, cpu=False):
    generator = build(config)
    if not cpu:
        generator.cuda()
    if cpu:
        checkpoint = torch.load(checkpoint_path, map_location=torch.device("cpu"))
    else:
        checkpoint = torch.load(checkpoint_path)
    generator.load_state_dict(checkpoint["generator"])
    return generator
"""


def test_the_cuda_arm_of_a_cpu_test_is_left_alone() -> None:
    assert _lines(MIRRORED, "TPL401") == []


def test_a_test_that_is_not_about_the_cpu_is_no_choice() -> None:
    other = MIRRORED.replace("    if cpu:\n        checkpoint", "    if fast:\n        checkpoint")
    assert _lines(other, "TPL401") == [11]


KEYWORD_DICT = """\
import torch


def load_weights(net, model_path):
    kw = dict(map_location="cpu")
    net.load_state_dict(torch.load(model_path, **kw), strict=False)
"""


def test_a_dict_of_keywords_without_weights_only() -> None:
    assert _lines(KEYWORD_DICT, "TPL402") == [6]


def test_a_dict_of_keywords_with_weights_only() -> None:
    safe = KEYWORD_DICT.replace(
        'dict(map_location="cpu")', 'dict(map_location="cpu", weights_only=True)'
    )
    assert _lines(safe, "TPL402") == []


LOAD_URL = """\
import os
import torch


def load_url(url, model_dir="./pretrained", map_location=None):
    cached_file = os.path.join(model_dir, url.split("/")[-1])
    return torch.load(cached_file, map_location=map_location, weights_only=True)
"""

CALLER = """\
import torch
from utils import load_url


def resnet50(pretrained=False):
    model = torch.nn.Linear(2, 2).cuda()
    if pretrained:
        model.load_state_dict(load_url("https://example.com/resnet50.pth"))
    return model
"""


def test_a_default_none_map_location_no_call_passes(tmp_path: Path) -> None:
    found = _project(tmp_path, {"utils.py": LOAD_URL, "resnet.py": CALLER}, "TPL401")
    assert found == [("utils.py", 7)]


def test_a_map_location_some_call_passes(tmp_path: Path) -> None:
    passes = CALLER.replace('resnet50.pth")', 'resnet50.pth", map_location="cpu")')
    found = _project(tmp_path, {"utils.py": LOAD_URL, "resnet.py": passes}, "TPL401")
    assert found == []
