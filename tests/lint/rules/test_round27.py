"""Corpus round 27: false positives found on speech recognition, reinforcement learning, LLM
serving, diffusion fine-tuning, tabular and kernel code, each as the look-alike that must stay
clean next to the pitfall that must still be found."""

from __future__ import annotations

from torchplace.lint import lint_source


def _lines(source: str, code: str, path: str = "layers.py") -> list[int]:
    return [f.line for f in lint_source(source, path, select={code})]


# ---- TPL201: a Triton kernel's body runs on the device

KERNEL = """\
import torch
import triton
import triton.language as tl


@triton.jit
def _grouped_kernel(x_ptr, m_sizes_ptr, NUM_EXPERTS: tl.constexpr):
    m_end = 0
    for expert_idx in range(NUM_EXPERTS):
        m_size = tl.load(m_sizes_ptr + expert_idx).to(tl.int32)
        m_end = m_end + m_size
        if m_size > 0:
            tl.store(x_ptr + expert_idx, m_end)


def launch(sizes, device):
    for chunk in sizes:
        m = chunk.to(device)
        if m.sum() > 0:
            _grouped_kernel[(1,)](m, m, 4)
"""


def test_a_comparison_in_a_triton_kernel_is_left_alone() -> None:
    assert _lines(KERNEL, "TPL201") == [19]


def test_the_same_loop_on_the_host_is_reported() -> None:
    source = KERNEL.replace("@triton.jit\n", "")
    assert _lines(source, "TPL201") == [11, 18]


# ---- TPL201: the statements after a guard that leaves when the value is finite

FINITE = """\
import torch


def _assert_finite(tensor, name):
    if torch.isfinite(tensor).all():
        return
    n_bad = (~torch.isfinite(tensor)).sum().item()
    raise RuntimeError(f"{name}: {n_bad} non-finite values")


def train(model, loader, opt, device):
    for batch in loader:
        x = batch.to(device)
        loss = model(x)
        _assert_finite(loss, "loss")
        loss.backward()
        opt.step()
"""


def test_the_failure_path_after_a_finite_guard_is_left_alone() -> None:
    assert _lines(FINITE, "TPL201") == [5]


def test_a_read_after_a_guard_that_leaves_on_failure_is_reported() -> None:
    source = FINITE.replace("torch.isfinite(tensor).all():", "torch.isnan(tensor).any():")
    assert _lines(source, "TPL201") == [5, 7]


# ---- TPL201: a value read once, into the name the branch finds unset

ONCE = """\
import torch


def train(model, loader, opt, device):
    init_loss = None
    for batch in loader:
        loss = model(batch.to(device))
        loss.backward()
        opt.step()
        if init_loss is None:
            init_loss = loss.detach().item()
        print(init_loss)
"""


def test_a_read_on_the_first_step_only_is_left_alone() -> None:
    assert _lines(ONCE, "TPL201") == []


def test_a_read_into_a_name_each_step_unsets_is_reported() -> None:
    source = ONCE.replace(
        "        loss.backward()\n", "        loss.backward()\n        init_loss = None\n"
    )
    assert _lines(source, "TPL201") == [12]


# ---- TPL201: an environment's step in an evaluation branch trains nothing

ENV_STEP = """\
import torch


def train(env, policy, loss_fn, opt, n_steps):
    for i in range(n_steps):
        data = env.step(policy(env.reset()))
        loss = loss_fn(data)
        loss.backward()
        opt.step()
        if i % 10 == 0:
            test_data = env.step(policy(env.reset()))
            print(loss.item(), test_data)
"""


def test_a_read_in_an_evaluation_branch_that_steps_an_environment_is_left_alone() -> None:
    assert _lines(ENV_STEP, "TPL201") == []


def test_a_read_in_a_branch_that_steps_an_optimizer_is_reported() -> None:
    source = ENV_STEP.replace(
        "env.step(policy(env.reset()))\n            print", "opt.step()\n            print"
    )
    assert _lines(source, "TPL201") == [12]


# ---- TPL201: each item handed by keyword to a call that places it, outputs returned

ENCODE = """\
import torch


def encode_prompts(pipe, captions, device):
    out = []
    with torch.no_grad():
        for cap in captions:
            pe, pooled = pipe.encode_prompt(prompt=cap, device=device)
            out.append((pe.cpu(), pooled.cpu()))
    return out
"""


def test_outputs_of_items_placed_by_keyword_and_returned_are_left_alone() -> None:
    assert _lines(ENCODE, "TPL201") == []


def test_outputs_of_items_placed_by_keyword_and_dropped_are_reported() -> None:
    source = ENCODE.replace("    return out\n", "    return len(out)\n")
    assert _lines(source, "TPL201") == [9, 9]


# ---- TPL201: a test module whose test functions a runner collects, also called by __main__

TESTS = """\
import torch


def assert_allclose(a, b):
    assert torch.allclose(a, b)


def test_cell(device="cpu"):
    model = torch.nn.Linear(2, 2).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.ones(2, 2, device=device)).sum()
    loss.backward()
    opt.step()
    assert_allclose(loss, loss)


if __name__ == "__main__":
    test_cell(torch.device("cuda", 0))
"""


def test_collected_test_functions_make_the_file_a_test() -> None:
    assert _lines(TESTS, "TPL201", "test_cells.py") == []


def test_a_test_function_that_needs_arguments_is_a_helper_of_the_script() -> None:
    source = TESTS.replace('def test_cell(device="cpu"):', "def test_cell(device):")
    assert _lines(source, "TPL201", "test_cells.py") == [5]


# ---- TPL201: a branch a helper named for the finite test takes on failure

HELPER = """\
import torch


def _is_finite(x):
    return bool(torch.isfinite(x).all())


def train(model, loader, opt, device):
    for step, batch in enumerate(loader):
        loss = model(batch.to(device))
        if not _is_finite(loss):
            print(f"skipping step {step}: loss is {loss.detach()}")
            continue
        loss.backward()
        opt.step()
"""


def test_a_message_on_the_failure_branch_of_a_finite_helper_is_left_alone() -> None:
    assert _lines(HELPER, "TPL201") == [5]  # the test itself runs every step


def test_a_message_on_the_branch_of_another_helper_is_reported() -> None:
    source = HELPER.replace("if not _is_finite(loss):", "if not _is_small(loss):")
    source = source.replace("def _is_finite(x):", "def _is_small(x):")
    assert _lines(source, "TPL201") == [5, 12]


# ---- TPL201: `torch.Size(...)` is a shape, held by the host

SHAPES = """\
import torch


class Env:
    def _process(self, out, spec):
        for key in self.keys:
            expected = torch.Size([*out.batch_size, *spec[key].shape])
            reward = out.get(key)
            if reward.shape != expected:
                out.set(key, reward.view(expected))
            if reward.sum() != 0:
                out.set(key, reward)
        return out

    def rollout(self, policy, data, device, n):
        for _ in range(n):
            data = policy(data.to(device))
            data = self._process(data, self.spec)
        return data
"""


def test_a_comparison_with_a_torch_size_is_left_alone() -> None:
    assert _lines(SHAPES, "TPL201") == [11]


# ---- TPL103: a factory joined into host data that a transfer helper places later

PROCESS = """\
import torch
from torch import nn


class InputTransform(nn.Module):
    def _to_device(self, x):
        return x.to(self.device)

    def _prepare(self, images, prompts):
        ids_list = []
        for prompt, image in zip(prompts, images):
            ids = self.processor(prompt, image)["input_ids"]
            ids = torch.cat((ids, torch.tensor([[7]], dtype=torch.long)), dim=1)
            ids_list.append(ids.squeeze(0))
        ids = torch.stack(ids_list)
        return self._to_device(ids)

    def forward(self, images, prompts):
        return self._prepare(images, prompts)
"""


def test_a_factory_a_transfer_helper_places_later_is_left_alone() -> None:
    assert _lines(PROCESS, "TPL103") == []


def test_a_factory_returned_unplaced_is_reported() -> None:
    source = PROCESS.replace("return self._to_device(ids)", "return self._log_ids(ids)")
    assert _lines(source, "TPL103") == [13]


# ---- TPL201: per-batch predictions joined and returned in a pandas container

SERIES = """\
import numpy as np
import pandas as pd
import torch


class Forecaster:
    def predict(self, x_values, index):
        self.model.eval()
        preds = []
        for begin in range(0, len(x_values), self.batch_size):
            x_batch = torch.from_numpy(x_values[begin : begin + self.batch_size]).to(self.device)
            with torch.no_grad():
                pred = self.model(x_batch).detach().cpu().numpy()
            preds.append(pred)
        return pd.Series(np.concatenate(preds), index=index)
"""


def test_predictions_returned_in_a_series_are_left_alone() -> None:
    assert _lines(SERIES, "TPL201") == []


def test_a_statistic_of_the_predictions_is_reported() -> None:
    source = SERIES.replace("index=index)\n", "index=index).mean()\n")
    assert _lines(source, "TPL201") == [13]


# ---- TPL103: a factory a later loop turns into host index data, placed after the loop

BUCKETS = """\
import torch
from torch import nn


class Embeddings(nn.Module):
    def forward(self, pixels, masks):
        embeddings = self.patch(pixels)
        boundaries = torch.arange(1 / self.side, 1.0, 1 / self.side)
        position_ids = torch.full(size=(len(masks), self.side * self.side), fill_value=0)
        for i, mask in enumerate(masks):
            coords = torch.arange(0, 1 - 1e-6, 1 / mask[:, 0].sum())
            buckets = torch.bucketize(coords, boundaries, right=True)
            position_ids[i][mask.view(-1).cpu()] = buckets
        position_ids = position_ids.to(embeddings.device)
        return embeddings + self.position(position_ids)
"""


def test_a_factory_placed_after_the_loop_that_uses_it_is_left_alone() -> None:
    assert _lines(BUCKETS, "TPL103") == []


def test_a_factory_whose_loop_result_is_never_placed_is_reported() -> None:
    source = BUCKETS.replace("        position_ids = position_ids.to(embeddings.device)\n", "")
    assert _lines(source, "TPL103") == [8, 9, 11]


# ---- TPL201: a truth test of what a method annotated to return a container hands back

CONTAINER = """\
from typing import Optional

import torch


class Runner:
    def _extras(self, output) -> Optional[dict[str, torch.Tensor]]:
        if isinstance(output, torch.Tensor):
            return None
        return {"aux": output[1]}

    def _main(self, output) -> torch.Tensor:
        return output[0]

    def forward(self, block, inputs, device):
        outputs = []
        for x in inputs:
            raw = block(x.to(device))
            extras = self._extras(raw)
            if extras:
                outputs.append(extras)
            main = self._main(raw)
            if main:
                outputs.append(main)
        return outputs
"""


def test_a_truth_test_of_a_returned_container_is_left_alone() -> None:
    assert _lines(CONTAINER, "TPL201") == [23]


def test_a_truth_test_of_an_unannotated_method_result_is_reported() -> None:
    source = CONTAINER.replace(" -> Optional[dict[str, torch.Tensor]]", "")
    assert _lines(source, "TPL201") == [20, 23]


# ---- TPL201: per-batch probabilities formatted into a table that is written out

TABLE = """\
import numpy as np
import pandas as pd
import torch


def inference(model, dataloader, output_filename):
    probability_list = []
    key_list = []
    with torch.no_grad():
        for data in dataloader:
            images = data["image"].cuda()
            probabilities = torch.sigmoid(model(images))
            probability_list.append(probabilities.cpu().numpy())
            key_list.extend(data["key"])
        probabilities = np.concatenate(probability_list, axis=0)
        records = []
        for key, probability in zip(key_list, probabilities):
            records.append(tuple([key] + ["{:.04f}".format(p) for p in probability]))
        df = pd.DataFrame.from_records(records)
        df.to_csv(output_filename, index=False)
"""


def test_probabilities_written_out_as_a_table_are_left_alone() -> None:
    assert _lines(TABLE, "TPL201") == []


def test_probabilities_only_summarised_are_reported() -> None:
    source = TABLE.replace("df.to_csv(output_filename, index=False)", "print(df.describe())")
    assert _lines(source, "TPL201") == [13]


# ---- TPL201: the measurement of a `torch.utils.benchmark.Timer` is host data

TIMER = """\
import torch
import torch.utils.benchmark as benchmark


def bench(model, device, h, w):
    x = torch.rand(1, 3, h, w, device=device)
    model = model.eval().to(device)
    for i in range(1, 26, 4):
        timer = benchmark.Timer(stmt="model(x, n)", globals={"model": model, "x": x, "n": i})
        print(timer.blocked_autorange(min_run_time=1))
        print(model(x, i))
"""


def test_a_printed_benchmark_measurement_is_left_alone() -> None:
    assert _lines(TIMER, "TPL201") == [11]


# ---- TPL201: host copies cached by the key of the loop that computes them

CACHE = """\
import torch


def encode_prompts(prompts, tokenizer, encoder, device):
    tokens = tokenizer(prompts, return_tensors="pt").input_ids.to(device)
    with torch.no_grad():
        out = encoder(tokens)
    return out[1], out[0]


def train(tokenizer, encoder, unet, opt, pairs, device):
    embeds = {}
    for cap in sorted({c for _, c in pairs}):
        pe, pooled = encode_prompts([cap], tokenizer, encoder, device)
        embeds[cap] = (pe.cpu(), pooled.cpu())
    for image, cap in pairs:
        loss = unet(image.to(device), embeds[cap][0].to(device)).mean()
        loss.backward()
        opt.step()
"""


def test_host_copies_cached_by_the_loop_key_are_left_alone() -> None:
    assert _lines(CACHE, "TPL201") == []


def test_copies_stored_by_key_in_a_training_loop_are_reported() -> None:
    source = CACHE.replace(
        "        embeds[cap] = (pe.cpu(), pooled.cpu())\n",
        "        embeds[cap] = (pe.cpu(), pooled.cpu())\n        pe.sum().backward()\n",
    )
    assert _lines(source, "TPL201") == [15, 15]
