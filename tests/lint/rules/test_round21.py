"""Corpus round 21: false positives found on new framework-heavy real code (Lightning and
torch.compile training scripts, FSDP trainers, Kaggle solutions), each as the look-alike that
must stay clean next to the pitfall that must still be found."""

from __future__ import annotations

from .helpers import lines

# ---- TPL601: `main()` of a script that needs CUDA before it runs (airbench)

AIRBENCH = """\
import torch


def make_net():
    net = Net()
    net = net.half().cuda()
    return net


def main(run):
    model = make_net()
    starter = torch.cuda.Event(enable_timing=True)
    starter.record()
    return model


if __name__ == "__main__":
    main("warmup")
"""


def test_cuda_calls_after_a_helper_that_needs_cuda_are_left_alone() -> None:
    assert lines(AIRBENCH, "TPL601") == []


def test_cuda_calls_after_a_helper_that_may_stay_on_the_cpu_are_reported() -> None:
    source = AIRBENCH.replace("net = net.half().cuda()", "net = net.half()")
    assert lines(source, "TPL601") == [12]


CALLED_ON_CUDA = """\
import torch


def main(run, model):
    starter = torch.cuda.Event(enable_timing=True)

    def stop_timer():
        torch.cuda.synchronize()

    stop_timer()
    return starter


if __name__ == "__main__":
    model = CifarNet().cuda()
    main("warmup", model)
    accs = [main(run, model) for run in range(200)]
"""


def test_a_main_the_script_calls_only_after_a_cuda_move_is_left_alone() -> None:
    assert lines(CALLED_ON_CUDA, "TPL601") == []


def test_a_main_called_before_the_cuda_move_is_reported() -> None:
    source = CALLED_ON_CUDA.replace(
        '    model = CifarNet().cuda()\n    main("warmup", model)\n',
        '    main("warmup", None)\n    model = CifarNet().cuda()\n',
    )
    # the nested helper's synchronize runs only after `starter = torch.cuda.Event(...)`,
    # which raises first where CUDA is missing: that one is reported
    assert lines(source, "TPL601") == [5]


# ---- TPL201: chunks of one tensor, each copied to the host and returned (a Kaggle solution)

CHUNKED = """\
import torch


def get_topk_cossim(test_emb, tr_emb, k=10, device="cuda:0"):
    tr_emb = torch.tensor(tr_emb, device=torch.device(device))
    test_emb = torch.tensor(test_emb, device=torch.device(device))
    vals = []
    for test_batch in tqdm(test_emb.split(64)):
        sim = test_batch @ tr_emb.T
        vals_batch, inds_batch = torch.topk(sim, k=k, dim=1)
        vals += [vals_batch.detach().cpu()]
    vals = torch.cat(vals)
    return vals
"""


def test_copies_of_each_chunk_collected_and_returned_are_left_alone() -> None:
    assert lines(CHUNKED, "TPL201") == []


def test_copies_of_each_row_collected_and_returned_are_reported() -> None:
    source = CHUNKED.replace("tqdm(test_emb.split(64))", "tqdm(test_emb)")
    assert lines(source, "TPL201") == [11]


def test_a_value_read_from_each_chunk_is_reported() -> None:
    source = CHUNKED.replace(
        "vals += [vals_batch.detach().cpu()]", "print(vals_batch.max().item())"
    )
    assert lines(source, "TPL201") == [11]


# ---- TPL201: a logging branch that reads the step counter (Meta's lingua trainers)

LINGUA = """\
import torch


def train(model, data_loader, optimizer, train_state, args, logger):
    while train_state.step < args.steps:
        batch = next(data_loader)
        loss, nb_toks = model(batch.cuda())
        loss.backward()
        optimizer.step()
        train_state.step += 1
        if train_state.step % args.logging.freq == 0:
            for i in range(len(nb_toks)):
                nb_toks[i] = nb_toks[i].item()
            logger.info(f"step: {train_state.step}  loss: {round(loss.item(), 4):>7}")
"""


def test_reads_in_a_logging_branch_that_prints_the_step_counter_are_left_alone() -> None:
    assert lines(LINGUA, "TPL201") == []


def test_reads_in_a_periodic_branch_that_steps_the_optimizer_are_reported() -> None:
    source = LINGUA.replace(
        '            logger.info(f"step:',
        '            optimizer.step()\n            logger.info(f"step:',
    )
    assert lines(source, "TPL201") == [13, 15]


def test_entries_converted_by_key_every_step_are_reported() -> None:
    source = LINGUA.replace("        if train_state.step % args.logging.freq == 0:\n", "").replace(
        "\n            ", "\n        "
    )
    assert lines(source, "TPL201") == [12, 13]


# ---- TPL201: a helper that converts each metric under its own key (lingua's dist_mean_dict)

BY_KEY = """\
import torch
import torch.distributed as dist


def dist_mean(x):
    tensor = torch.tensor(x).cuda()
    dist.all_reduce(tensor)
    return tensor


def dist_mean_dict(x):
    r = dict()
    for k in x:
        r[k] = dist_mean(x[k])
        r[k] = r[k].item() if (r[k].dim() == 0) else r[k].tolist()
    return r
"""


def test_a_pass_that_converts_each_entry_under_its_key_is_left_alone() -> None:
    assert lines(BY_KEY, "TPL201") == []


def test_a_pass_that_reads_each_entry_into_a_list_is_reported() -> None:
    source = BY_KEY.replace("r = dict()", "r = []").replace(
        "        r[k] = dist_mean(x[k])\n        r[k] = r[k].item() if (r[k].dim() == 0) else r[k].tolist()",
        "        m = dist_mean(x[k])\n        r.append(m.item())",
    )
    assert lines(source, "TPL201") == [15]


# ---- TPL501: a cache tested for `None`, then moved before its reads (LLaMA2-Accessory)

KV_CACHE = """\
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.k_cache = None

    def forward(self, xk, start_pos):
        if self.k_cache is None:
            return xk
        self.k_cache = self.k_cache.to(xk)
        self.k_cache[:, start_pos] = xk
        return self.k_cache[:, : start_pos + 1]

    def allocate_kv_cache(self, b, n):
        if self.k_cache is None or self.k_cache.size() != (b, n):
            self.k_cache = torch.empty((b, n))
"""


def test_a_cache_tested_for_none_and_moved_before_its_reads_is_left_alone() -> None:
    assert lines(KV_CACHE, "TPL501") == []


def test_a_cache_tested_for_none_and_read_unmoved_is_reported() -> None:
    source = KV_CACHE.replace("        self.k_cache = self.k_cache.to(xk)\n", "")
    assert lines(source, "TPL501") == [18]


# ---- TPL201: a string's `find` in a loop over streamed responses (LLaMA2-Accessory demos)

STREAM = """\
import torch


def serve(model, prompt, sep, queue):
    model.cuda()
    for response in model.stream_generate(prompt):
        end_pos = response["text"].find(sep)
        if end_pos != -1:
            response["text"] = response["text"][:end_pos]
        queue.put(response)
"""


def test_a_strings_find_tested_per_response_is_left_alone() -> None:
    assert lines(STREAM, "TPL201") == []


def test_a_tensor_tested_per_response_is_reported() -> None:
    source = STREAM.replace('response["text"].find(sep)', 'response["scores"].argmax()')
    assert lines(source, "TPL201") == [8]


# ---- TPL601: a CUDA query in a statement that moves to CUDA itself (mmseg's test scripts)

MMSEG = """\
import torch


def main():
    model = build_model()
    model = MMDistributedDataParallel(
        model.cuda(),
        device_ids=[torch.cuda.current_device()],
        broadcast_buffers=False,
    )
    return model
"""


def test_a_cuda_query_beside_a_cuda_move_in_one_statement_is_left_alone() -> None:
    assert lines(MMSEG, "TPL601") == []


def test_a_cuda_query_beside_a_cpu_model_is_reported() -> None:
    assert lines(MMSEG.replace("model.cuda(),", "model,"), "TPL601") == [8]


# ---- TPL202: a sync on the one step the loop counter reaches the warm-up (Hiera's benchmark)

WARM_UP = """\
import time

import torch


def benchmark(model, x, runs, warm_up):
    for i in tqdm(range(runs)):
        if i == warm_up:
            torch.cuda.synchronize()
            start = time.time()
        model(x)
    torch.cuda.synchronize()
    return time.time() - start
"""


def test_a_sync_when_the_counter_reaches_the_warm_up_is_left_alone() -> None:
    assert lines(WARM_UP, "TPL202") == []


def test_a_sync_on_every_step_after_the_warm_up_is_reported() -> None:
    assert lines(WARM_UP.replace("if i == warm_up:", "if i >= warm_up:"), "TPL202") == [9]


def test_a_sync_when_an_item_equals_a_value_is_reported() -> None:
    source = WARM_UP.replace("for i in tqdm(range(runs)):", "for i in tqdm(runs):")
    assert lines(source, "TPL202") == [9]


# ---- TPL401: a run's pickled arguments (Large-DiT's `model_args.pth`)

RUN_ARGS = """\
import os

import torch


def main(args):
    train_args = torch.load(os.path.join(args.ckpt, "model_args.pth"), weights_only=False)
    model = build(train_args)
    state = torch.load(os.path.join(args.ckpt, "consolidated.pth"), weights_only=True)
    model.load_state_dict(state)
    return model.to(args.device)
"""


def test_a_load_of_the_runs_arguments_is_left_alone() -> None:
    assert lines(RUN_ARGS, "TPL401") == [9]


def test_a_load_of_a_file_named_by_args_is_reported() -> None:
    source = RUN_ARGS.replace('os.path.join(args.ckpt, "model_args.pth")', "args.ckpt")
    assert lines(source, "TPL401") == [7, 9]


# ---- TPL201: reward scores of length-sorted chunks, returned in input order (open-instruct)

SCORES = """\
import numpy as np
import torch


def get_scores(ds, model, collate, batch_size, device):
    order = np.argsort([len(x) for x in ds["input_ids"]])
    scores = []
    i = 0
    while i < len(ds):
        data = ds[order[i : i + batch_size]]
        try:
            input_ids = collate(data)["input_ids"].to(device)
            score = model(input_ids)
            scores.extend(score.cpu().tolist())
            i += batch_size
        except torch.cuda.OutOfMemoryError:
            batch_size //= 2
    scores = np.array(scores)
    scores = scores[np.argsort(order)]
    return torch.tensor(scores)
"""


def test_scores_of_each_chunk_returned_in_input_order_are_left_alone() -> None:
    assert lines(SCORES, "TPL201") == []


def test_a_mean_of_the_scores_of_each_chunk_is_reported() -> None:
    source = SCORES.replace("return torch.tensor(scores)", "return scores.mean()")
    assert lines(source, "TPL201") == [14]


# ---- TPL301: a legacy CPU constructor's blocking copy to the device (open_lm's evaluation)

EVALUATE = """\
import time

import torch


def evaluate(model, dataloader, device, meter):
    end = time.time()
    for i, batch in enumerate(dataloader):
        (texts,) = batch
        texts = torch.LongTensor(texts).to(device)
        meter.update(time.time() - end)
        loss = model(texts)
        print(loss.item())
        end = time.time()
"""


def test_timing_a_blocking_copy_from_a_legacy_constructor_is_left_alone() -> None:
    assert lines(EVALUATE, "TPL301") == []


def test_timing_a_non_blocking_copy_from_a_legacy_constructor_is_reported() -> None:
    source = EVALUATE.replace(".to(device)", ".to(device, non_blocking=True)")
    assert lines(source, "TPL301") == [7]


# ---- TPL301: a step that tests a reduced device flag before the clock's read (open_lm)

HAS_DATA = """\
import itertools
import time

import torch
import torch.distributed as dist


def train(model, data_iterator, device, world_size, meter):
    end = time.time()
    for i in itertools.count():
        batch = next(data_iterator)
        has_data = torch.tensor(1, dtype=torch.long, device=device)
        dist.all_reduce(has_data)
        if has_data < world_size:
            break
        loss = model(batch.to(device))
        loss.backward()
        meter.update(time.time() - end)
        end = time.time()
"""


def test_timing_a_step_that_tests_a_device_flag_is_left_alone() -> None:
    assert lines(HAS_DATA, "TPL301") == []


def test_timing_a_step_that_tests_a_host_counter_is_reported() -> None:
    assert lines(HAS_DATA.replace("if has_data < world_size:", "if i > 1000:"), "TPL301") == [9]


# ---- TPL501: a table whose shape is asserted on, then moved before its reads (open_lm)

ROTARY = """\
import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim, seq_len):
        super().__init__()
        self.freqs_cis = precompute_freqs_cis(head_dim, seq_len * 2)

    def forward(self, q, offset=0):
        assert q.shape[1] + offset <= self.freqs_cis.shape[0]
        self.freqs_cis = self.freqs_cis.to(q.device)
        return q * self.freqs_cis[offset : offset + q.shape[1]]


def precompute_freqs_cis(dim, end):
    return torch.outer(torch.arange(end), torch.arange(dim))
"""


def test_a_table_whose_shape_is_read_before_its_move_is_left_alone() -> None:
    assert lines(ROTARY, "TPL501") == []


def test_a_table_read_before_its_move_is_reported() -> None:
    source = ROTARY.replace("self.freqs_cis.shape[0]", "self.freqs_cis.sum()")
    assert lines(source, "TPL501") == [8]
