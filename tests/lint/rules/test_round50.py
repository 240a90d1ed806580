"""Round 50: a cache the code fills itself (``if os.path.exists(cache): x = torch.load(cache)``,
``else: x = build(...); torch.save(x, cache)``) reads back what the other branch saved; when
that is host data, not a device value nor a model's state, it holds no device tensors to
restore (TPL401). A resume whose other branch saves a checkpoint is still reported."""

from __future__ import annotations

from .helpers import lines

FEATURES = """\
import os
import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_and_cache_examples(args, tokenizer, evaluate=False):
    cached_features_file = os.path.join(args.data_dir, "cached_{}".format(args.max_len))
    if os.path.exists(cached_features_file) and not args.overwrite_cache:
        features = torch.load(cached_features_file)
    else:
        examples = read_examples(args.data_dir)
        features = convert_examples_to_features(examples, tokenizer)
        torch.save(features, cached_features_file)
    return torch.tensor([f.input_ids for f in features], dtype=torch.long)
"""

VECTORS = """\
import os
import torch

if torch.cuda.is_available():
    device = torch.device("cuda:0")
else:
    device = torch.device("cpu")

if args.word_vectors:
    if os.path.isfile(args.vector_cache):
        inputs.vocab.vectors = torch.load(args.vector_cache)
    else:
        inputs.vocab.load_vectors(args.word_vectors)
        torch.save(inputs.vocab.vectors, args.vector_cache)
"""

NEGATED = """\
import torch
from pathlib import Path

device = "cuda" if torch.cuda.is_available() else "cpu"


def embeddings(path, texts):
    if not Path(path).exists():
        table = compute_table(texts)
        torch.save(table, path)
    else:
        table = torch.load(path)
    return table
"""

RESUME = """\
import os
import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def main(args):
    model = Net().to(device)
    if os.path.exists(args.ckpt):
        model.load_state_dict(torch.load(args.ckpt))
    else:
        train(model)
        torch.save(model.state_dict(), args.ckpt)
"""

DEVICE_VALUES = """\
import os
import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def features(model, images, path):
    if os.path.exists(path):
        feats = torch.load(path)
    else:
        feats = model.to(device)(images.to(device))
        torch.save(feats, path)
    return feats
"""


def test_feature_cache_filled_from_host_data_is_clean() -> None:
    assert lines(FEATURES, "TPL401") == []


def test_script_vector_cache_is_clean() -> None:
    assert lines(VECTORS, "TPL401") == []


def test_negated_existence_test_is_clean() -> None:
    assert lines(NEGATED, "TPL401") == []


def test_weights_only_still_reported_for_a_cache() -> None:
    assert lines(FEATURES, "TPL402") == [10]


def test_checkpoint_resume_still_reported() -> None:
    assert lines(RESUME, "TPL401") == [10]


def test_cache_of_device_values_still_reported() -> None:
    assert lines(DEVICE_VALUES, "TPL401") == [9]


def test_load_of_another_path_still_reported() -> None:
    other = FEATURES.replace(
        "torch.load(cached_features_file)", "torch.load(args.pretrained_features)"
    )
    assert lines(other, "TPL401") == [10]


def test_cache_not_saved_in_the_other_branch_still_reported() -> None:
    unsaved = FEATURES.replace("        torch.save(features, cached_features_file)\n", "")
    assert lines(unsaved, "TPL401") == [10]


def test_cache_loaded_into_a_name_for_weights_still_reported() -> None:
    named = FEATURES.replace("features = torch.load(", "weights = torch.load(")
    assert lines(named, "TPL401") == [10]


SQUAD = """\
import os
import torch


def load_and_cache_examples(args, tokenizer, evaluate=False):
    if args.local_rank not in [-1, 0] and not evaluate:
        torch.distributed.barrier()
    cached_features_file = os.path.join(args.data_dir, "cached_{}".format(args.max_len))
    if os.path.exists(cached_features_file) and not args.overwrite_cache:
        cached = torch.load(cached_features_file)
        features, dataset = cached["features"], cached["dataset"]
    else:
        examples = processor.get_train_examples(args.data_dir)
        features, dataset = squad_convert_examples_to_features(examples, tokenizer)
        if args.local_rank in [-1, 0]:
            torch.save({"features": features, "dataset": dataset}, cached_features_file)
    return dataset
"""


def test_cache_saved_by_the_first_rank_in_a_dict_is_clean() -> None:
    assert lines(SQUAD, "TPL401") == []
