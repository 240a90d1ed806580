"""Round 56: a rank's share of the chunks of a device tensor (StyleGAN3's
``compute_distances``: ``for col_batch in col_batches[rank :: num_gpus]:`` over
``col_batches = pad(...).chunk(n)``, each block's distances broadcast from every rank in ``for
src in range(num_gpus):`` and collected with ``dist_batches.append(d.cpu() if rank == 0 else
None)``, then ``return torch.cat(dist_batches, dim=1)[:, :num_cols] if rank == 0 else None``)
is a chunked computation whose copies are its output, not a per-row read (TPL201): a slice of
a list of tensors is still a list, and a loop over ``range(num_gpus)`` walks ranks, not the
step's rows. And StyleGAN's tick guard, ``if (not done) and (cur_tick != 0) and (cur_nimg <
tick_start_nimg + kimg_per_tick * 1000): continue``, lets what follows run once per tick (it
restarts the mark, ``tick_start_nimg = cur_nimg``), on the first tick and at the end only: a
read there is not per batch (TPL201)."""

from __future__ import annotations

from .helpers import lines

DISTANCES = """\
import torch


def compute_distances(row_features, col_features, num_gpus, rank, col_batch_size):
    num_cols = col_features.shape[0]
    col_batches = torch.nn.functional.pad(col_features, [0, 0, 0, 1]).chunk(4)
    dist_batches = []
    for col_batch in col_batches[rank :: num_gpus]:
        dist_batch = torch.cdist(row_features.unsqueeze(0), col_batch.unsqueeze(0))[0]
        for src in range(num_gpus):
            dist_broadcast = dist_batch.clone()
            if num_gpus > 1:
                torch.distributed.broadcast(dist_broadcast, src=src)
            dist_batches.append(dist_broadcast.cpu() if rank == 0 else None)
    return torch.cat(dist_batches, dim=1)[:, :num_cols] if rank == 0 else None


def main(model, device):
    feats = model(torch.randn(8, 4, device=device))
    return compute_distances(feats, feats, 2, 0, 4)
"""


def test_a_rank_s_share_of_chunks_collected_and_returned() -> None:
    assert lines(DISTANCES, "TPL201", "metrics.py") == []


def test_a_statistic_of_the_copies_is_still_reported() -> None:
    # the copies only feed a number the function returns: one read per chunk and rank
    scored = DISTANCES.replace(
        "    return torch.cat(dist_batches, dim=1)[:, :num_cols] if rank == 0 else None\n",
        "    return float(sum(d.sum() for d in dist_batches if d is not None))\n",
    )
    assert lines(scored, "TPL201", "metrics.py") == [14]


def test_rows_of_each_chunk_are_still_per_row() -> None:
    # a loop over the rows of a chunk, not the ranks: one copy per row
    per_row = DISTANCES.replace("for src in range(num_gpus):", "for src in range(len(dist_batch)):")
    assert lines(per_row, "TPL201", "metrics.py") == [14]


TICKS = """\
import torch


def training_loop(G, loader, opt, device, stop, total_kimg=100, kimg_per_tick=4, batch_size=8):
    G = G.to(device)
    cur_nimg = 0
    cur_tick = 0
    tick_start_nimg = cur_nimg
    p = torch.zeros([], device=device)
    while True:
        x = next(loader).to(device)
        loss = G(x).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        cur_nimg += batch_size
        done = (cur_nimg >= total_kimg * 1000)
        if (not done) and (cur_tick != 0) and (cur_nimg < tick_start_nimg + kimg_per_tick * 1000):
            continue
        print(f"augment {float(p.cpu()):.3f}")
        cur_tick += 1
        tick_start_nimg = cur_nimg
        if (not done) and stop():
            done = True
        if done:
            break
"""


def test_a_read_after_a_tick_guard_runs_once_per_tick() -> None:
    assert lines(TICKS, "TPL201") == []


def test_a_guard_whose_mark_is_never_restarted_is_not_a_tick() -> None:
    # without `tick_start_nimg = cur_nimg` the count stays past the mark: every step reads
    fixed = TICKS.replace("        tick_start_nimg = cur_nimg\n", "")
    assert lines(fixed, "TPL201") == [20]


def test_a_guard_with_a_test_of_data_is_not_a_tick() -> None:
    # `loss > 0` may be false on any step, and is itself a read
    data = TICKS.replace("(cur_tick != 0)", "(loss > 0)")
    assert lines(data, "TPL201") == [18, 20]
