"""Real ``config.pbtxt`` files, from Triton's own repositories, read as Triton reads them.

Each config below is (a short cut of) a file of triton-inference-server/server (``server:``),
pytorch_backend or the tutorials, named by its path. Run through
:func:`~torchplace.serve.triton_config.pbtxt_settings` and :func:`read_model`, they showed
what the reader got wrong: a valid config refused, or one taken whose meaning was lost (the
model's forward then called without the tensors Triton gives it). Where torchplace refuses on
purpose, the message names the field and the fix.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from torchplace.errors import ConfigError
from torchplace.serve.repository import read_model
from torchplace.serve.triton_config import pbtxt_settings

pytest.importorskip("google.protobuf")


def _settings(tmp_path: Path, text: str, name: str = "m") -> dict[str, Any]:
    directory = tmp_path / name
    (directory / "1").mkdir(parents=True, exist_ok=True)
    (directory / "config.pbtxt").write_text(text)
    return pbtxt_settings(directory / "config.pbtxt", name)


# server: qa/L0_model_config/noautofill_platform/preserve_ordering0/config.pbtxt, without its
# preserve_ordering (Triton refuses that with several levels): level 1's policy is empty
PRIORITY_LEVELS = """
platform: "pytorch_libtorch"
max_batch_size: 8
dynamic_batching {
  priority_levels: 3
  default_priority_level: 2
  priority_queue_policy {
    key: 1
    value: {
    }
  }
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def test_a_level_policy_without_a_queue_size_is_no_limit(tmp_path: Path) -> None:
    """Triton's 0 max_queue_size is no limit; a level policy without one was refused ("level
    1 has no max_queue_size"), though the docs say it keeps the server's queue limit."""
    batching = _settings(tmp_path, PRIORITY_LEVELS)["batching"]
    assert batching == {
        "max_batch_size": 8,
        "priority_levels": 3,
        "default_priority": 2,
        "max_delay_ms": 0.0,
    }
    model = read_model(tmp_path, "m")
    assert "priority_queue_limits" not in model.settings  # each level: the server's --max-queue


def test_a_level_without_a_limit_beside_one_with_one_is_refused_naming_the_fix(
    tmp_path: Path,
) -> None:
    text = PRIORITY_LEVELS.replace("value: {\n    }", "value: { max_queue_size: 4 }")
    with pytest.raises(ConfigError, match=r"level 2 has no max_queue_size .* give it in one"):
        _settings(tmp_path, text)


# server: qa/L0_request_cancellation/implicit_state_model/config.pbtxt (a PyTorch model whose
# forward takes DELAY_ITRS__0, SEQ_START__1, SEQ_ID__2 and its state SEQ_STATE_IN__3)
SEQUENCE = """
backend: "pytorch"
max_batch_size: 1
input { name: "DELAY_ITRS__0" data_type: TYPE_INT64 dims: [ 1 ] }
output { name: "DUMMY_OUT__0" data_type: TYPE_INT64 dims: [ 1 ] }
sequence_batching {
  max_sequence_idle_microseconds: 6000000
  oldest { max_candidate_sequences: 1 }
  control_input [
    {
      name: "SEQ_START__1"
      control { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] }
    },
    {
      name: "SEQ_ID__2"
      control { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_INT64 }
    }
  ]
  state {
    input_name: "SEQ_STATE_IN__3"
    output_name: "SEQ_STATE_OUT__1"
    data_type: TYPE_INT64
    dims: 1
    initial_state { name: "initial_state" data_type: TYPE_INT64 dims: 1 zero_data: true }
  }
}
instance_group { kind: KIND_CPU count: 1 }
"""


def test_sequence_control_inputs_are_refused_not_dropped(tmp_path: Path) -> None:
    """Taken and not read, the model loaded and its forward lacked the control tensors."""
    with pytest.raises(ConfigError, match=r"sequence_batching.control_input is not served"):
        _settings(tmp_path, SEQUENCE)
    stateful = re.sub(r"  control_input \[.*?\n  \]\n", "", SEQUENCE, flags=re.S)
    assert "control_input" not in stateful
    with pytest.raises(ConfigError, match=r"sequence_batching.state is not served"):
        _settings(tmp_path, stateful)


def test_a_sequence_batcher_without_control_tensors_is_still_taken(tmp_path: Path) -> None:
    text = SEQUENCE.split("sequence_batching")[0] + "sequence_batching { }\n"
    assert _settings(tmp_path, text)["inputs"][0]["name"] == "DELAY_ITRS__0"


# server: docs/user_guide/ragged_batching.md, the example's config (with a platform)
RAGGED = """
platform: "pytorch_libtorch"
max_batch_size: 16
input [
  {
    name: "INPUT"
    data_type: TYPE_FP32
    dims: [ -1 ]
    allow_ragged_batch: true
  }
]
batch_input [
  {
    kind: BATCH_ACCUMULATED_ELEMENT_COUNT
    target_name: "INDEX"
    data_type: TYPE_FP32
    source_input: "INPUT"
  }
]
"""


def test_ragged_batching_is_refused_not_dropped(tmp_path: Path) -> None:
    """The model takes INPUT as one [total] row and INDEX besides: it got neither."""
    with pytest.raises(ConfigError, match=r"batch_input is not served: .* remove batch_input"):
        _settings(tmp_path, RAGGED)
    alone = RAGGED.split("batch_input")[0]
    with pytest.raises(ConfigError, match=r"input\[0\]\.allow_ragged_batch is not served"):
        _settings(tmp_path, alone)


# server: qa/L0_model_config/autofill_noplatform_success/tensorrt/multi_prof_max_bs/
# config.pbtxt: three groups on the server's own devices (one per TensorRT profile)
THREE_GROUPS = """
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { profile: "0" }, { profile: "1" }, { profile: "2" } ]
"""


def test_groups_on_the_same_devices_add_up(tmp_path: Path) -> None:
    """Triton makes each group's count on each of its devices: three groups of one are three
    instances, where the reader took one."""
    assert _settings(tmp_path, THREE_GROUPS)["replicas"] == 3
    gpus = THREE_GROUPS.replace(
        '{ profile: "0" }, { profile: "1" }, { profile: "2" }',
        "{ kind: KIND_GPU gpus: [ 0 ] }, { kind: KIND_GPU gpus: [ 0 ] }",
    )
    settings = _settings(tmp_path, gpus)
    assert (settings["replicas"], settings["devices"]) == (2, ["cuda:0"])
    uneven = gpus.replace("gpus: [ 0 ] }, {", "gpus: [ 0, 1 ] }, {")
    with pytest.raises(ConfigError, match=r"different numbers of instances .*cuda:0: 2, cuda:1: 1"):
        _settings(tmp_path, uneven)


# server: qa/L0_model_config/noautofill_platform/negative_gpu/config.pbtxt (Triton refuses it:
# "specifies invalid or unsupported gpu id -1"); it was read as device cuda:-1
NEGATIVE_GPU = """
platform: "pytorch_libtorch"
max_batch_size: 1
input [ { name: "data" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 1, 28, 28 ] } ]
instance_group [ { kind: KIND_GPU gpus: [ -1 ] } ]
"""


def test_a_negative_gpu_is_refused_in_tritons_words(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"instance_group\[0\]\.gpus \[-1\] specifies invalid or unsupported"
    ):
        _settings(tmp_path, NEGATIVE_GPU)


# server: docs/examples/model_repository/simple_string/config.pbtxt (a TYPE_STRING input)
STRINGS = """
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ 16 ] } ]
"""


def test_a_string_tensor_is_refused_naming_the_field(tmp_path: Path) -> None:
    """It failed later as "inputs 'INPUT0': datatype 'STRING' is not servable", a datatype
    that is neither Triton's (TYPE_STRING) nor the protocol's (BYTES), without the field."""
    with pytest.raises(ConfigError) as caught:
        _settings(tmp_path, STRINGS)
    message = str(caught.value)
    assert "input[0].data_type TYPE_STRING (the protocol's BYTES" in message
    assert "token ids as TYPE_INT64" in message


# server: qa/L0_model_config/noautofill_platform/default_priority_level1 (a default level of 5)
# and default_priority_level0 (none: 0 in proto3)
DEFAULT_LEVEL = """
platform: "pytorch_libtorch"
max_batch_size: 8
dynamic_batching {{ priority_levels: 3 {default} }}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""


@pytest.mark.parametrize(
    ("default", "shown_as"),
    [("default_priority_level: 5", 5), ("default_priority_level: 0", 0), ("", 0)],
)
def test_a_default_level_outside_the_levels_is_refused_naming_the_field(
    tmp_path: Path, default: str, shown_as: int
) -> None:
    """A level past the levels failed as "serve config: default_priority=5 is invalid",
    naming neither the file nor Triton's field; none (or 0) was served, the requests that name
    no priority put at the lowest level, where Triton refuses it (its qa expects "default
    priority level must be in range [1, 3]")."""
    with pytest.raises(
        ConfigError,
        match=rf"config.pbtxt: dynamic_batching.default_priority_level {shown_as}: default "
        r"priority level must be in range \[1, 3\]",
    ):
        _settings(tmp_path, DEFAULT_LEVEL.format(default=default))


TENSORS = """
input [ { name: "input" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "output" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (  # server: qa/L0_model_config/noautofill_platform/negative_max_batch_size
            "max_batch_size: -2" + TENSORS,
            r"'max_batch_size' must be non-negative value \(max_batch_size -2\)",
        ),
        (  # .../zerodims_input0
            'max_batch_size: 8 input [ { name: "input" data_type: TYPE_FP32 dims: [ 1, 0, 28 ] } ]',
            r"input\[0\]: model input 'input' dimension must be integer >= 1, or -1 to "
            r"indicate a variable-size dimension \(dims \[1, 0, 28\]\)",
        ),
        (  # .../zerodims_output1
            'max_batch_size: 8 output [ { name: "output" data_type: TYPE_FP32 dims: [ 0 ] } ]',
            r"output\[0\]: model output 'output' dimension must be integer >= 1",
        ),
        (  # .../reshape_nobatch_empty0
            'max_batch_size: 0 input [ { name: "input" data_type: TYPE_FP32 dims: [ 1 ] '
            "reshape { shape: [ ] } } ]",
            r"input\[0\]: model input 'input' cannot have empty reshape for non-batching model "
            r"as scalar tensors are not supported",
        ),
        (  # .../ensemble_scheduling_set
            'name: "m" max_batch_size: 8 ensemble_scheduling { step [ { model_name: "model_a" '
            'model_version: -1 input_map { key: "a" value: "input" } } ] }' + TENSORS,
            r"ensemble scheduling cannot be set for model 'm' whose platform is not ensemble",
        ),
    ],
    ids=["negative-max-batch", "zero-input-dim", "zero-output-dim", "empty-unbatched-reshape",
         "ensemble-scheduling"],
)  # fmt: skip
def test_configs_triton_refuses_are_refused_in_its_words(
    tmp_path: Path, text: str, message: str
) -> None:
    """Each was served (a batch size of -2 failed later, with our words; a dimension of 0
    made a tensor of no values; the ensemble's steps were not read)."""
    with pytest.raises(ConfigError, match=message):
        _settings(tmp_path, 'platform: "pytorch_libtorch"\n' + text)


def test_an_empty_reshape_of_a_batching_model_stays_one_element(tmp_path: Path) -> None:
    """With a batch dimension an empty reshape is a row of one value, which Triton serves."""
    text = 'max_batch_size: 4 input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] reshape { } } ]'
    settings = _settings(tmp_path, 'platform: "pytorch_libtorch"\n' + text)
    assert settings["inputs"][0]["reshape"] == []


# pytorch_backend: README.md, "AOT Inductor Support" (platform: "torch_aoti", model.pt2)
AOTI = """
backend: "pytorch"
platform: "torch_aoti"
max_batch_size: 1
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def test_an_aoti_package_is_refused_as_what_it_is(tmp_path: Path) -> None:
    """It was "a Triton torch model (platform: 'torch_aoti')", told to use the PyTorch backend
    it already names."""
    with pytest.raises(ConfigError) as caught:
        _settings(tmp_path, AOTI)
    message = str(caught.value)
    assert "is an AOTInductor package (platform: 'torch_aoti'" in message
    assert 'exported = "model.pt2"' in message


# server: qa/L0_model_config/noautofill_platform/missing_datatype/config.pbtxt
MISSING_TYPE = """
platform: "pytorch_libtorch"
max_batch_size: 1
input [ { name: "data" format: FORMAT_NCHW dims: [ 1, 28, 28 ] } ]
"""


def test_a_missing_data_type_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"input\[0\] needs .* \(it has no data_type string\)"):
        _settings(tmp_path, MISSING_TYPE)


# The syntax real files use, each read as protobuf reads it: comments, `key value` without a
# colon, repeated blocks and lists, `dims: 16` (one repeated value), negative numbers, enum
# names, string escapes, maps, and fields taken and not read (server: qa/L0_model_config/
# autofill_noplatform_success/pytorch/cpu_instance/config.pbtxt and no_name_platform, tutorials:
# Quick_Deploy/PyTorch/config.pbtxt's `max_batch_size : 0` spacing).
SYNTAX = r"""
# a comment
name: "m"   # trailing comment
platform: "pytorch_libtorch"
max_batch_size : 8
version_policy { latest { num_versions: 2 } }
input { name: "INPUT__0" data_type: TYPE_INT32 dims: 16 }
input: [ { name: "IN\"1" data_type: TYPE_FP32, dims: [ -1, 4 ] } ]
output [ { name: "OUTPUT__0", data_type: TYPE_INT32, dims: [ 16 ] } ]
instance_group { name: "m" kind: KIND_CPU count: 2 }
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 1500
  default_queue_policy { max_queue_size: 10 default_timeout_microseconds: 2e3 }
}
default_model_filename: "model.pt"
cc_model_filenames { key: "7.5" value: "model_t4.pt" }
metric_tags { key: "team" value: "search" }
parameters { key: "INFERENCE_MODE" value: { string_value: "true" } }
parameters: { key: "ENABLE_NVFUSER" value { string_value: "false" } }
optimization { input_pinned_memory { enable: true } priority: PRIORITY_MAX }
model_warmup [ { name: "w" batch_size: 1 inputs { key: "INPUT__0" value {
  data_type: TYPE_INT32 dims: 16 zero_data: true } } } ]
response_cache { enable: false }
model_transaction_policy { decoupled: false }
backend: "pytorch"
"""


def test_the_syntax_of_real_files_reads(tmp_path: Path) -> None:
    settings = _settings(tmp_path, SYNTAX.replace("2e3", "2000"))
    assert settings["version_policy"] == {"latest": 2}
    assert settings["replicas"] == 2
    assert settings["devices"] == ["cpu"]
    assert [(t["name"], t["shape"]) for t in settings["inputs"]] == [
        ("INPUT__0", [-1, 16]),
        ('IN"1', [-1, -1, 4]),
    ]
    assert settings["batching"] == {
        "max_batch_size": 8,
        "max_delay_ms": 1.5,
        "max_queue": 10,
        "default_timeout_ms": 2.0,
    }
    with pytest.raises(ConfigError, match=r"line 14, column \d+: .*default_timeout_microseconds"):
        _settings(tmp_path / "float", SYNTAX)  # an integer field: protobuf refuses 2e3, as Triton


def test_preserve_ordering_with_priority_levels_is_refused_as_triton_does(tmp_path: Path) -> None:
    """server: qa/L0_model_config/noautofill_platform/preserve_ordering0/config.pbtxt as it is
    (Triton: "Only one priority level is allowed when 'preserve_ordering' is true"): once its
    empty level policy read, it loaded."""
    text = PRIORITY_LEVELS.replace(
        "dynamic_batching {", "dynamic_batching {\n  preserve_ordering: true"
    )
    with pytest.raises(ConfigError, match=r"Only one priority level is allowed when 'preserve_ord"):
        _settings(tmp_path, text)


def test_a_decoupled_model_is_refused_naming_the_field(tmp_path: Path) -> None:
    """``model_transaction_policy { decoupled: true }`` (one request, many responses) was
    taken and ignored: each request got one answer, without a word."""
    text = PRIORITY_LEVELS + "model_transaction_policy { decoupled: true }\n"
    with pytest.raises(ConfigError, match=r"model_transaction_policy\.decoupled is not served"):
        _settings(tmp_path, text)
    assert _settings(tmp_path, PRIORITY_LEVELS + "model_transaction_policy { }\n")
