"""Corpus round 34: false positives found on teaching code (course notebooks, book companions,
"from scratch" series), each as the look-alike that must stay clean next to the pitfall that
must still be found."""

from __future__ import annotations

from .helpers import lines, notebook, notebook_cells


def _lines(source: str, code: str, path: str = "lesson.py") -> list[int]:
    return lines(source, code, path)


# ---- TPL301: a notebook that times two runs, its stop read only as `end - start`

TWO_RUNS = """\
from timeit import default_timer as timer

import torch

device = "cuda" if torch.cuda.is_available() else "cpu"


def fit(model, loader, optimizer):
    total = 0.0
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item()
    return total


model_0 = Net().to(device)
start_time = timer()
fit(model_0, loader, torch.optim.Adam(model_0.parameters()))
end_time = timer()
print(f"took {end_time - start_time:.3f}s")
model_1 = Net().to(device)
model_1(torch.randn(8, 4, device=device))
start_time = timer()
fit(model_1, loader, torch.optim.Adam(model_1.parameters()))
end_time = timer()
print(f"took {end_time - start_time:.3f}s")
"""


def test_a_stop_that_is_only_subtracted_from_is_not_a_start() -> None:
    assert _lines(TWO_RUNS, "TPL301") == []


def test_a_clock_read_that_starts_a_measurement_is_still_checked() -> None:
    source = TWO_RUNS.replace(
        "model_1(torch.randn(8, 4, device=device))\n",
        'model_1(torch.randn(8, 4, device=device))\nprint(f"setup {timer() - end_time:.3f}s")\n',
    )
    assert _lines(source, "TPL301") == [22]


# ---- TPL301: timing `torch.compile(model)`, which wraps the model and returns at once

COMPILE = """\
import time

import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
model = Net().to(device)
compile_start = time.time()
compiled = torch.compile(model)
compile_end = time.time()
print(f"compile took {compile_end - compile_start:.2f}s")
"""


def test_timing_torch_compile_is_left_alone() -> None:
    assert _lines(COMPILE, "TPL301") == []


def test_timing_a_call_of_the_model_beside_it_is_reported() -> None:
    source = COMPILE.replace(
        "compiled = torch.compile(model)\n",
        "compiled = torch.compile(model)\nout = model(torch.randn(8, 4, device=device))\n",
    )
    assert _lines(source, "TPL301") == [7]


# ---- TPL401: a notebook's round trips through a path name it reuses, in other quotes

ROUND_TRIPS = """\
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
model = Net().to(device)
path = "classifier.pt"
torch.save(model, path)
restored = torch.load(path, weights_only=False)
path = "classifier_state.pt"
torch.save(model.state_dict(), path)
fresh = Net()
fresh.load_state_dict(torch.load(path, weights_only=True))
torch.save(model.state_dict(), 'mlp.params')
clone = Net()
clone.load_state_dict(torch.load("mlp.params", weights_only=True))
"""


def test_round_trips_after_the_path_name_is_rebound_or_requoted_are_left_alone() -> None:
    assert _lines(ROUND_TRIPS, "TPL401") == []


def test_a_load_of_a_rebound_path_saved_only_before_the_rebinding_is_reported() -> None:
    source = ROUND_TRIPS.replace(
        'path = "classifier_state.pt"\ntorch.save(model.state_dict(), path)\n',
        'torch.save(model.state_dict(), path)\npath = "classifier_state.pt"\n',
    ).replace('torch.load("mlp.params"', 'torch.load("other.params"')
    assert _lines(source, "TPL401") == [11, 14]


# ---- TPL201: predictions collected with `results += batch_results`, then written out

PREDICT = """\
import torch


def predict(model, loader, device, out_file):
    results = []
    for data, paths in loader:
        score = model(data.to(device))
        probability = torch.softmax(score, dim=1)[:, 1].tolist()
        batch_results = [(p, prob) for p, prob in zip(paths, probability)]
        results += batch_results
    write_csv(results, out_file)
"""


def test_predictions_collected_by_list_extension_and_written_out_are_left_alone() -> None:
    assert _lines(PREDICT, "TPL201") == []


def test_a_sum_of_the_predictions_written_out_is_reported() -> None:
    source = PREDICT.replace("results = []", "results = 0.0").replace(
        "results += batch_results", "results += sum(probability)"
    )
    assert _lines(source, "TPL201") == [8]


# ---- TPL201: a streaming generator's stop test on the token it then yields

STREAM = """\
import torch


def stream(model, ids, max_new_tokens, stop_ids, device):
    ids = ids.to(device)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            out = model(ids)[:, -1]
            next_token = torch.argmax(out, dim=-1, keepdim=True)
            if next_token.item() in stop_ids:
                break
            yield next_token
            ids = torch.cat([ids, next_token], dim=1)
"""


def test_a_stop_test_of_the_yielded_token_is_left_alone() -> None:
    assert _lines(STREAM, "TPL201") == []


def test_a_stop_test_of_another_value_is_reported() -> None:
    source = STREAM.replace("if next_token.item() in stop_ids:", "if out.max().item() < 0.1:")
    assert _lines(source, "TPL201") == [10]


def test_the_two_timed_runs_in_notebook_cells_are_left_alone() -> None:
    head, first, second = TWO_RUNS.split("model_0 = ")[0], "", ""
    body = "model_0 = " + TWO_RUNS.split("model_0 = ")[1]
    first, second = body.split("model_1 = ")
    raw = notebook(head, first, "model_1 = " + second)
    assert notebook_cells(raw, "TPL301", "lesson.ipynb") == []


# ---- TPL201: a helper that decodes each generated answer to text, called per test item

RESPOND = """\
import json

import torch


def token_ids_to_text(token_ids, tokenizer):
    flat = token_ids.squeeze(0)
    return tokenizer.decode(flat.tolist())


def respond(model, tokenizer, entries, device):
    for i, entry in enumerate(entries):
        idx = torch.tensor(tokenizer.encode(entry["prompt"])).unsqueeze(0).to(device)
        token_ids = generate(model=model, idx=idx, max_new_tokens=256)
        text = token_ids_to_text(token_ids, tokenizer)
        entries[i]["response"] = text[len(entry["prompt"]) :].strip()
    with open("responses.json", "w") as f:
        json.dump(entries, f)
"""


def test_a_helper_returning_the_decoded_answer_is_left_alone() -> None:
    assert _lines(RESPOND, "TPL201") == []


def test_a_helper_returning_a_number_computed_from_the_text_is_reported() -> None:
    source = RESPOND.replace(
        "return tokenizer.decode(flat.tolist())", "return len(tokenizer.decode(flat.tolist()))"
    )
    assert _lines(source, "TPL201") == [8]
