"""Round 73 (TPL103): a factory's values followed through arithmetic with host numbers into
the names it binds (SAM's ``get_rel_pos``: ``q = torch.arange(n)[:, None] * scale``, then
``table[(q - k).long()]``), a tensor made by ``F.<function>`` of a tensor parameter as that
parameter's, and one element of a host tensor as an index (``x[perm[i]]``) left alone."""

from __future__ import annotations

from .helpers import lines as _lines

REL_POS = """\
import torch
import torch.nn.functional as F


def get_rel_pos(q_size: int, k_size: int, rel_pos: torch.Tensor) -> torch.Tensor:
    max_rel_dist = int(2 * max(q_size, k_size) - 1)
    if rel_pos.shape[0] != max_rel_dist:
        resized = F.interpolate(rel_pos.reshape(1, rel_pos.shape[0], -1), size=max_rel_dist)
        resized = resized.reshape(-1, max_rel_dist).permute(1, 0)
    else:
        resized = rel_pos
    q_coords = torch.arange(q_size)[:, None] * max(k_size / q_size, 1.0)
    k_coords = torch.arange(k_size)[None, :] * max(q_size / k_size, 1.0)
    relative_coords = (q_coords - k_coords) + (k_size - 1) * max(q_size / k_size, 1.0)
    return resized[relative_coords.long()]
"""


def test_host_coordinates_that_index_a_parameter_derived_table() -> None:
    assert _lines(REL_POS, "TPL103") == [12, 13]


def test_coordinates_placed_on_the_tables_device_are_left_alone() -> None:
    placed = REL_POS.replace("torch.arange(q_size)", "torch.arange(q_size, device=rel_pos.device)")
    placed = placed.replace("torch.arange(k_size)", "torch.arange(k_size, device=rel_pos.device)")
    assert _lines(placed, "TPL103") == []


def test_coordinates_read_back_as_numbers_are_left_alone() -> None:
    host = REL_POS.replace(
        "return resized[relative_coords.long()]", "return relative_coords.tolist(), resized"
    )
    assert _lines(host, "TPL103") == []


ELEMENTS = """\
import torch


def mix(output: torch.Tensor, intervals):
    mixed = torch.zeros_like(output)
    ex = 0
    for end in intervals:
        order = torch.randperm(end - ex) + ex
        for idx in range(end - ex):
            mixed[idx + ex] = output[order[idx]]
        ex = end
    return mixed
"""


def test_one_element_of_a_host_permutation_as_an_index_is_an_int() -> None:
    assert _lines(ELEMENTS, "TPL103") == []


def test_the_whole_host_permutation_as_an_index_is_copied_over() -> None:
    whole = ELEMENTS.replace(
        "        for idx in range(end - ex):\n            mixed[idx + ex] = output[order[idx]]\n",
        "        mixed[ex:end] = output[order]\n",
    )
    assert _lines(whole, "TPL103") == [8]
