"""Round 44: a time-series model's masks (Informer's ``ProbMask``), a GNN trainer, a
recommender, a segmentation trainer and a GPU benchmark script."""

from __future__ import annotations

from .helpers import lines

# ---- TPL103: a CPU index into a view of a mask the function moved to the device

PROB_MASK = """\
import torch


class ProbMask:
    def __init__(self, B, H, L, index, scores, device="cpu"):
        _mask = torch.ones(L, scores.shape[-1], dtype=torch.bool){move}
        _mask_ex = _mask[None, None, :].expand(B, H, L, scores.shape[-1])
        indicator = _mask_ex[torch.arange(B)[:, None, None], torch.arange(H)[None, :, None], index, :]
        self._mask = indicator.to(device)
"""


def test_index_into_a_view_of_a_mask_moved_then_triangled_is_found() -> None:
    source = PROB_MASK.format(move=".to(device).triu(1)")
    assert lines(source, "TPL103", "masking.py") == [8, 8]


def test_index_into_a_mask_kept_on_the_host_is_clean() -> None:
    source = PROB_MASK.format(move=".triu(1)")
    assert lines(source, "TPL103", "masking.py") == []


def test_index_into_a_mask_read_back_to_the_host_is_clean() -> None:
    source = PROB_MASK.format(move=".to(device).triu(1).cpu()")
    assert lines(source, "TPL103", "masking.py") == []


IDLE_MOVE = """\
import torch


def pick(B, L, index, device):
    mask = torch.ones(L, L, dtype=torch.bool){move}
    return mask[torch.arange(B)[:, None], index].to(device)
"""


def test_index_into_a_moved_mask_before_an_idle_move_is_found() -> None:
    assert lines(IDLE_MOVE.format(move=".to(device)"), "TPL103", "masking.py") == [6]


def test_index_into_a_host_mask_that_the_result_then_moves_is_clean() -> None:
    assert lines(IDLE_MOVE.format(move=""), "TPL103", "masking.py") == []


def test_factory_indexed_and_moved_right_away_is_clean() -> None:
    source = IDLE_MOVE.format(move=".to(device)").replace(
        "mask[torch.arange(B)[:, None], index].to(device)",
        "torch.arange(B)[index].to(device) + mask[0, 0]",
    )
    assert lines(source, "TPL103", "masking.py") == []
