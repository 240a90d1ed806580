"""The repository extension's load and unload against what clients and hostile callers send:
parameters Triton does not take, configs that name another model or fields ModelConfig does not
have, values of the wrong type, a repository name; each refused as Triton refuses it, naming
the value and the fix, and the server serves on."""

from __future__ import annotations

import http.client
import logging
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from torchplace.errors import ConfigError
from torchplace.serve.repository import (
    MODEL_CONFIG_FIELDS,
    NESTED_FIELDS,
    inline_config,
    unload_parameters,
)
from torchplace.serve.running import ServerThread

from .repository_helpers import explicit_repository, infer_body

LOAD = "/v2/repository/models/{}/load"
UNLOAD = "/v2/repository/models/{}/unload"


def _load(config: object, model: str = "a", **extra: object) -> dict[str, Any] | None:
    return inline_config({"parameters": {"config": config, **extra}}, model)


def test_model_config_fields_are_those_of_the_proto() -> None:
    model_config_pb2 = pytest.importorskip("torchplace.serve.proto.model_config_pb2")
    fields = model_config_pb2.ModelConfig.DESCRIPTOR.fields
    assert frozenset(f.name for f in fields) == MODEL_CONFIG_FIELDS


@pytest.mark.parametrize("parameter", ["confg", "unload_dependents", "Config"])
def test_an_unrecognized_load_parameter_is_refused(parameter: str) -> None:
    """Triton: ``unrecognized load parameter``; here it was ignored, so a misspelt config
    loaded the model without it."""
    with pytest.raises(ConfigError) as caught:
        inline_config({"parameters": {parameter: '{"max_batch_size": 4}'}}, "a")
    message = str(caught.value)
    assert message.startswith(f"failed to load 'a': unrecognized load parameter {parameter!r}")
    assert "'config'" in message  # the fix: the parameter a load takes


@pytest.mark.parametrize(
    ("config", "shown"),
    [(5, "5"), ([1], "[1]"), (True, "true"), (b"{}", "bytes")],
)
def test_a_config_that_is_not_a_string_names_what_was_sent(config: object, shown: str) -> None:
    with pytest.raises(ConfigError, match="invalid value type for load parameter 'config'") as c:
        _load(config)
    assert shown in str(c.value)
    assert "JSON string" in str(c.value)


def test_a_config_naming_another_model_is_refused_in_triton_s_words() -> None:
    with pytest.raises(ConfigError) as caught:
        _load('{"name": "b", "max_batch_size": 4}')
    assert str(caught.value).startswith(
        "failed to load 'a': unexpected directory name 'a' for model 'b', directory name must "
        "equal model name"
    )
    assert '"name": "a"' in str(caught.value)  # the fix
    assert _load('{"name": "a", "max_batch_size": 4}') == {"batching": {"max_batch_size": 4}}
    assert _load('{"name": "", "max_batch_size": 4}') == {"batching": {"max_batch_size": 4}}
    with pytest.raises(ConfigError, match="inline config: name must be a string, not 5"):
        _load('{"name": 5}')


@pytest.mark.parametrize("field", ["max_batchsize", "maxBatchsize", "batch_size"])
def test_a_config_field_that_would_be_ignored_is_refused(field: str) -> None:
    """Triton parses the config into ModelConfig and refuses a field it does not have; here
    such a field (a typo) was ignored."""
    with pytest.raises(ConfigError) as caught:
        _load(orjson.dumps({field: 4}).decode())
    assert "is neither a field of Triton's ModelConfig nor a torchplace setting" in str(
        caught.value
    )


def test_protobufs_camel_case_names_are_read_as_the_fields_own() -> None:
    """``MessageToJson`` writes lowerCamelCase names, and Triton's parse takes them; they were
    not read here. The keys of a free map (``parameters``) stay as they are."""
    doc = {
        "maxBatchSize": 4,
        "dynamicBatching": {"maxQueueDelayMicroseconds": "500"},
        "instanceGroup": [{"count": 2, "kind": "KIND_CPU"}],
        "input": [{"name": "input", "dataType": "TYPE_FP32", "dims": ["8"]}],
        "parameters": {"myKey": {"stringValue": "x"}},
    }
    got = _load(orjson.dumps(doc).decode())
    assert got["batching"] == {"max_batch_size": 4, "max_delay_ms": 0.5}
    assert got["replicas"] == 2
    assert got["inputs"][0]["datatype"] == "FP32"


def test_model_config_fields_this_server_does_not_use_are_taken() -> None:
    doc = {
        "platform": "pytorch_libtorch",
        "backend": "pytorch",
        "model_warmup": [],
        "sequence_batching": {},
        "max_batch_size": 2,
        "source": "wide-mlp",
    }
    assert _load(orjson.dumps(doc).decode()) == {
        "source": "wide-mlp",
        "batching": {"max_batch_size": 2},
    }


def test_nested_fields_are_those_of_the_proto() -> None:
    pb = pytest.importorskip("torchplace.serve.proto.model_config_pb2")
    messages = {
        "dynamic_batching": pb.ModelDynamicBatching, "instance_group": pb.ModelInstanceGroup,
        "input": pb.ModelInput, "output": pb.ModelOutput,
        "version_policy": pb.ModelVersionPolicy,
        "version_policy.latest": pb.ModelVersionPolicy.Latest,
        "version_policy.all": pb.ModelVersionPolicy.All,
        "version_policy.specific": pb.ModelVersionPolicy.Specific,
        "queue_policy": pb.ModelQueuePolicy,
    }  # fmt: skip
    assert NESTED_FIELDS.keys() == messages.keys()
    for key, message in messages.items():
        assert frozenset(f.name for f in message.DESCRIPTOR.fields) == NESTED_FIELDS[key], key


@pytest.mark.parametrize(
    ("doc", "where", "field"),
    [
        ({"dynamic_batching": {"max_queue_delay_microsecond": 500}}, "dynamic_batching",
         "max_queue_delay_microsecond"),
        ({"dynamicBatching": {"maxQueueDelayMicrosecond": 500}}, "dynamic_batching",
         "max_queue_delay_microsecond"),
        ({"instance_group": [{"kind": "KIND_CPU", "cout": 2}]}, "instance_group[0]", "cout"),
        ({"version_policy": {"latest": {"num_version": 2}}}, "version_policy.latest",
         "num_version"),
        ({"version_policy": {"lattest": {"num_versions": 2}}}, "version_policy", "lattest"),
        ({"version_policy": {"all": {"versions": [1]}}}, "version_policy.all", "versions"),
        ({"input": [{"name": "input", "data_type": "TYPE_FP32", "dim": [8]}]}, "input[0]",
         "dim"),
        ({"output": [{"name": "output", "data_type": "TYPE_FP32", "dims": [2], "shape": [2]}]},
         "output[0]", "shape"),
    ],
)  # fmt: skip
def test_a_nested_config_field_that_would_be_ignored_is_refused(
    doc: dict[str, Any], where: str, field: str
) -> None:
    """Triton's parse refuses a field a message does not have at any depth; here only the
    top-level fields were checked, so a typo inside ``dynamic_batching``, an instance group,
    a tensor or the version policy loaded the model without it, and a policy kind misspelt
    (``lattest``) served every version."""
    with pytest.raises(ConfigError) as caught:
        _load(orjson.dumps(doc).decode())
    message = str(caught.value)
    assert message.startswith(
        f"failed to load 'a': inline config: field {field!r} of {where} is not a field of "
        "Triton's ModelConfig there; its fields are "
    ), message


def test_a_version_policy_of_two_kinds_is_refused() -> None:
    doc = {"version_policy": {"latest": {"num_versions": 1}, "all": {}}}
    with pytest.raises(ConfigError, match="version_policy must hold one of 'latest', 'all'"):
        _load(orjson.dumps(doc).decode())
    assert _load('{"version_policy": {"all": {}}}') == {"version_policy": {"all": True}}
    assert _load('{"version_policy": {"latest": 2}}') == {"version_policy": {"latest": 2}}


def test_instance_groups_add_up_per_device_and_must_be_even_across_devices() -> None:
    """Only the first group's count was read: groups of 1 and 2 served one replica. On one
    device they add up, as in Triton (3 CPU replicas); 1 on one GPU and 2 on another cannot be
    served (replicas are per device) and are refused, naming them. Groups of one count (what
    ``get_model_config`` answers on several devices) are one count."""
    two = {"instance_group": [{"kind": "KIND_CPU", "count": 1}, {"kind": "KIND_CPU", "count": 2}]}
    assert _load(orjson.dumps(two).decode()) == {"replicas": 3, "devices": ["cpu"]}
    uneven = {"instance_group": [{"kind": "KIND_GPU", "count": 1, "gpus": [0]},
                                 {"kind": "KIND_GPU", "count": 2, "gpus": [1]}]}  # fmt: skip
    with pytest.raises(
        ConfigError, match=r"places different numbers of instances on its devices \(cuda:0: 1"
    ):
        _load(orjson.dumps(uneven).decode())
    same = {"instance_group": [{"kind": "KIND_GPU", "count": 2, "gpus": [0]},
                               {"kind": "KIND_GPU", "count": 2, "gpus": [1]}]}  # fmt: skip
    assert _load(orjson.dumps(same).decode()) == {"replicas": 2, "devices": ["cuda:0", "cuda:1"]}


@pytest.mark.parametrize(
    ("groups", "settings"),
    [
        ([{"kind": "KIND_CPU", "count": 2}], {"replicas": 2, "devices": ["cpu"]}),
        ([{"kind": 2}], {"replicas": 1, "devices": ["cpu"]}),  # protobuf's enum number
        ([{"kind": "KIND_GPU", "gpus": [1, 0]}], {"replicas": 1, "devices": ["cuda:1", "cuda:0"]}),
        ([{"gpus": [1]}], {"replicas": 1, "devices": ["cuda:1"]}),  # KIND_AUTO naming a GPU
        ([{"kind": "KIND_AUTO", "count": 3}], {"replicas": 3}),  # the server's own devices
        ([{"kind": "KIND_MODEL"}], {"replicas": 1}),
        (  # what get_model_config lists with a CPU fallback: the fallback is the server's
            [
                {"kind": "KIND_GPU", "count": 2, "gpus": [0]},
                {"name": "m_fallback", "kind": "KIND_CPU", "count": 1, "passive": True},
            ],
            {"replicas": 2, "devices": ["cuda:0"]},
        ),
    ],
)
def test_instance_groups_say_where_the_replicas_go(
    groups: list[dict[str, Any]], settings: dict[str, Any]
) -> None:
    """A group's kind and gpus were not read: KIND_CPU, or KIND_GPU on GPU 1, loaded on the
    server's own devices without a word."""
    assert _load(orjson.dumps({"instance_group": groups}).decode()) == settings


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ([{"kind": "KIND_CPU", "gpus": [0]}], r"instance_group\[0\] is KIND_CPU with gpus \[0\]"),
        ([{"kind": "KIND_TPU"}], r"instance_group\[0\].kind 'KIND_TPU' is not one of KIND_AUTO"),
        ([{"kind": 7}], r"instance_group\[0\].kind '7' is not one of"),
        (
            [{"kind": "KIND_AUTO"}, {"kind": "KIND_GPU", "gpus": [1]}],
            r"mixes groups on the server's own devices .* \(cuda:1\)",
        ),
    ],
)
def test_instance_groups_that_cannot_be_placed_are_refused(
    groups: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        _load(orjson.dumps({"instance_group": groups}).decode())


def test_a_gpu_group_naming_no_gpu_means_every_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    group = orjson.dumps({"instance_group": [{"kind": "KIND_GPU", "count": 2}]}).decode()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"KIND_GPU, but torch sees no CUDA GPU"):
        _load(group)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert _load(group) == {"replicas": 2, "devices": ["cuda:0", "cuda:1"]}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"parameters": {"unload_dependents": "yes"}}, "Unable to parse 'unload_dependents'"),
        ({"parameters": {"unload_dependents": 1}}, "expected a boolean, got 1"),
        ({"parameters": [True]}, "the unload request's 'parameters' must be an object"),
    ],
)
def test_unload_parameters_of_the_wrong_type_are_refused(
    body: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        unload_parameters(body)


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"parameters": None},
        {"parameters": {"unload_dependents": True}},
        {"parameters": {"unload_dependents": False, "other": 1}},
    ],
)
def test_unload_parameters_as_clients_send_them(body: dict[str, Any]) -> None:
    unload_parameters(body)  # Triton reads unload_dependents only


# -- against a running server --------------------------------------------------------------
def _call(port: int, path: str, body: object) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        conn.request("POST", path, body=raw, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        return response.status, orjson.loads(data) if data else None
    finally:
        conn.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    with ServerThread(explicit_repository(tmp_path_factory.mktemp("repo"))) as thread:
        yield thread


def _still_serving(port: int) -> None:
    status, answer = _call(port, "/v2/models/a/infer", infer_body())
    assert status == 200, answer
    status, index = _call(port, "/v2/repository/index", {"ready": True})
    assert status == 200
    assert {e["name"] for e in index} >= {"a"}


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        (LOAD.format("a"), {"parameters": {"confg": "{}"}}, "unrecognized load parameter 'confg'"),
        (
            LOAD.format("a"),
            {"parameters": {"config": '{"name": "b"}'}},
            "unexpected directory name 'a' for model 'b'",
        ),
        (
            LOAD.format("a"),
            {"parameters": {"config": '{"max_batchsize": 2}'}},
            "is neither a field of Triton's ModelConfig",
        ),
        (LOAD.format("a"), {"parameters": {"config": 5}}, "invalid value type"),
        (
            UNLOAD.format("b"),
            {"parameters": {"unload_dependents": "yes"}},
            "Unable to parse 'unload_dependents'",
        ),
    ],
)
def test_rest_refuses_with_400_and_serves_on(
    server: ServerThread, path: str, body: dict[str, Any], message: str
) -> None:
    status, answer = _call(server.port, path, body)
    assert status == 400, answer
    assert message in answer["error"]
    _still_serving(server.port)
    status, index = _call(server.port, "/v2/repository/index", {"ready": True})
    assert {e["name"] for e in index} == {"a", "b"}  # the refused unload left b serving


@pytest.mark.parametrize(
    "path",
    ["/v2/repository/other/index", "/v2/repository/other/models/a/load",
     "/v2/repository/other/models/b/unload"],
)  # fmt: skip
def test_rest_refuses_a_repository_name_as_triton_does(server: ServerThread, path: str) -> None:
    """Triton routes ``/v2/repository/{repository_name}/...`` and answers 501; here it was a
    404 that read as a missing model or route."""
    status, answer = _call(server.port, path, {})
    assert status == 501, answer
    assert answer["error"].startswith("'repository_name' specification is not supported")
    assert "/v2/repository/index" in answer["error"]  # the fix
    _still_serving(server.port)
    status, index = _call(server.port, "/v2/repository/index", {"ready": True})
    assert {e["name"] for e in index} == {"a", "b"}  # nothing was loaded or unloaded


def test_rest_unload_dependents_as_tritonclient_sends_it(server: ServerThread) -> None:
    httpclient = pytest.importorskip("tritonclient.http")
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    try:
        client.unload_model("b", unload_dependents=True)
        assert not client.is_model_ready("b")
        client.load_model("b", config='{"name": "b", "max_batch_size": 2}')
        assert client.get_model_config("b")["max_batch_size"] == 2
    finally:
        client.close()
    _still_serving(server.port)


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_tritonclient_load_with_a_nested_typo_is_refused(server: ServerThread, kind: str) -> None:
    """``load_model(name, config=...)`` with a typo inside ``dynamic_batching`` or the version
    policy: 400/``INVALID_ARGUMENT`` naming the field, the model serves on as it was; what
    ``get_model_config`` answers still loads back."""
    module: Any = pytest.importorskip(f"tritonclient.{kind}")
    from tritonclient.utils import InferenceServerException

    port = server.port if kind == "http" else server.grpc_port
    client = module.InferenceServerClient(f"127.0.0.1:{port}")
    code = "400" if kind == "http" else "StatusCode.INVALID_ARGUMENT"

    def config() -> dict[str, Any]:
        if kind == "http":
            got: dict[str, Any] = client.get_model_config("a")
            return got
        return dict(client.get_model_config("a", as_json=True)["config"])

    try:
        before = config()
        for doc, field in (
            ({"dynamic_batching": {"max_queue_delay_microsecond": 100}},
             "max_queue_delay_microsecond"),
            ({"version_policy": {"lattest": {"num_versions": 1}}}, "lattest"),
        ):  # fmt: skip
            with pytest.raises(InferenceServerException) as caught:
                client.load_model("a", config=orjson.dumps(doc).decode())
            assert caught.value.status() == code
            assert f"field {field!r} of" in caught.value.message()
        assert config() == before
        client.load_model("a", config=orjson.dumps(before).decode())
        assert client.is_model_ready("a")
    finally:
        client.close()
    _still_serving(server.port)


class _Stub:
    """The repository RPCs on a channel, requests sent as built (no client-side checks)."""

    def __init__(self, channel: Any, pb: Any) -> None:
        for rpc in ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"):
            response = getattr(pb, f"{rpc}Response")
            call = channel.unary_unary(
                f"/inference.GRPCInferenceService/{rpc}",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=response.FromString,
            )
            setattr(self, rpc, call)


def test_grpc_refuses_as_triton_does_and_serves_on(server: ServerThread) -> None:
    grpc = pytest.importorskip("grpc")
    from torchplace.serve.proto import grpc_service_pb2 as pb

    Param = pb.ModelRepositoryParameter
    Load = pb.RepositoryModelLoadRequest
    Unload = pb.RepositoryModelUnloadRequest
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = _Stub(channel, pb)
        cases: list[tuple[Any, Any, Any, str]] = [
            (stub.RepositoryModelLoad, Load(model_name="a",
             parameters={"config": Param(int64_param=5)}), invalid,
             "invalid value type for load parameter 'config'"),
            (stub.RepositoryModelLoad, Load(model_name="a",
             parameters={"confg": Param(string_param="{}")}), invalid,
             "unrecognized load parameter 'confg'"),
            (stub.RepositoryModelLoad, Load(model_name="a", repository_name="other"),
             grpc.StatusCode.UNIMPLEMENTED, "'repository_name' specification is not supported"),
            (stub.RepositoryModelUnload, Unload(model_name="b",
             parameters={"unload_dependents": Param(string_param="yes")}), invalid,
             "invalid value type for 'unload_dependents' parameter, expected bool_param"),
            (stub.RepositoryModelUnload, Unload(model_name="b", repository_name="other"),
             grpc.StatusCode.UNIMPLEMENTED, "'repository_name' specification is not supported"),
            (stub.RepositoryIndex, pb.RepositoryIndexRequest(repository_name="other"),
             grpc.StatusCode.UNIMPLEMENTED, "'repository_name' specification is not supported"),
        ]  # fmt: skip
        for method, request, code, message in cases:
            with pytest.raises(grpc.RpcError) as caught:
                method(request, timeout=60)
            assert caught.value.code() == code, caught.value.details()
            assert message in caught.value.details()
        stub.RepositoryModelUnload(
            Unload(model_name="b", parameters={"unload_dependents": Param(bool_param=True)}),
            timeout=60,
        )
        stub.RepositoryModelLoad(
            Load(model_name="b", parameters={"config": Param(string_param='{"name": "b"}')}),
            timeout=60,
        )
    _still_serving(server.port)
    _, index = _call(server.port, "/v2/repository/index", {"ready": True})
    assert {e["name"] for e in index} == {"a", "b"}


def test_a_load_of_a_name_with_a_line_break_logs_it_escaped(
    server: ServerThread, caplog: pytest.LogCaptureFixture
) -> None:
    """A name that fails its checks is logged as the client sent it, escaped: a line break in
    it cannot forge a log line of its own."""
    caplog.set_level(logging.ERROR, logger="torchplace.serve")
    status, answer = _call(server.port, LOAD.format("evil%0AINFO%20forged"), {})
    assert status == 400, answer
    logged = [r.getMessage() for r in caplog.records if r.name == "torchplace.serve"]
    assert any("'evil\\nINFO forged'" in line for line in logged), logged
    assert not any("\n" in line for line in logged)


QUEUE = {
    "priority_levels": 2,
    "default_priority_level": 2,
    "default_queue_policy": {"max_queue_size": 100, "default_timeout_microseconds": 5000},
    "priority_queue_policy": {"1": {"max_queue_size": 10}},
}


def test_the_queue_of_dynamic_batching_is_the_model_s() -> None:
    """priority_levels, the default level and the queue policies were taken and not read: a
    model loaded with a queue of 100 and two levels got the server's."""
    assert _load(orjson.dumps({"dynamic_batching": QUEUE}).decode()) == {
        "batching": {
            "priority_levels": 2,
            "default_priority": 2,
            "max_queue": 100,
            "default_timeout_ms": 5.0,
            "priority_queue_limits": [10, 100],  # level 1 its own, level 2 the default's
        }
    }
    # Triton's 0 is no limit: the server's own limit stays
    unlimited = {"default_queue_policy": {"max_queue_size": 0, "timeout_action": "REJECT"}}
    assert _load(orjson.dumps({"dynamic_batching": unlimited}).decode()) == {}


@pytest.mark.parametrize(
    ("dynamic", "message"),
    [
        (
            {"default_queue_policy": {"timeout_action": "DELAY"}},
            r"timeout_action 'DELAY' is not served",
        ),
        (
            {"default_queue_policy": {"max_queue_sise": 3}},
            r"'max_queue_sise' of dynamic_batching.default_queue_policy",
        ),
        (
            {"priority_queue_policy": {"1": {"max_queue_size": 3}}},
            r"needs dynamic_batching.priority_levels",
        ),
        (
            {**QUEUE, "priority_queue_policy": {"3": {"max_queue_size": 3}}},
            r"names level 3, not one of 1..2",
        ),
        (
            {**QUEUE, "priority_queue_policy": {"1": {"default_timeout_microseconds": 9}}},
            r"\[1\] has its own default_timeout_microseconds \(9\)",
        ),
        (
            {
                "priority_levels": 2,
                "default_priority_level": 1,
                "priority_queue_policy": {"1": {"max_queue_size": 3}},
            },
            r"level 2 has no max_queue_size",
        ),
        (  # Triton refuses levels without a default level (0 and none are one in proto3)
            {"priority_levels": 2},
            r"default_priority_level 0: default priority level must be in range \[1, 2\]",
        ),
        (
            {"priority_levels": 2, "default_priority_level": 0},
            r"default_priority_level 0: default priority level must be in range \[1, 2\]",
        ),
        (  # refused before any loop over the levels: 2**62 of them held the event loop
            {**QUEUE, "priority_levels": 2**62},
            r"priority_levels 4611686018427387904 is past the 1024 priority levels",
        ),
        ({**QUEUE, "default_priority_level": 5000}, r"default_priority_level 5000 is past"),
    ],
)
def test_a_queue_this_server_cannot_keep_is_refused(dynamic: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _load(orjson.dumps({"dynamic_batching": dynamic}).decode())
