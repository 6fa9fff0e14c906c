"""corral's ``triton_python_backend_utils``: the names Triton's model files use, as used."""

from __future__ import annotations

import json
import logging
import sys
import types

import numpy as np
import pytest

from corral._compute.python import backend_utils as pb_utils


def test_a_tensor_holds_its_name_and_array():
    array = np.arange(4, dtype=np.float32)
    tensor = pb_utils.Tensor("INPUT0", array)
    assert tensor.name() == "INPUT0"
    assert tensor.as_numpy() is array
    assert tensor.shape() == (4,)
    assert tensor.is_cpu()
    np.testing.assert_array_equal(pb_utils.Tensor.from_dlpack("T", array).as_numpy(), array)


@pytest.mark.parametrize(("name", "data"), [(1, np.zeros(1)), ("T", [1, 2])])
def test_a_tensor_of_a_wrong_kind_is_refused(name, data):
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.Tensor(name, data)


def test_tensors_are_found_by_name_in_requests_and_responses():
    x = pb_utils.Tensor("X", np.zeros(2))
    request = pb_utils.InferenceRequest("m", ["Y"], [x])
    assert pb_utils.get_input_tensor_by_name(request, "X") is x
    assert pb_utils.get_input_tensor_by_name(request, "Z") is None
    assert request.requested_output_names() == ["Y"]
    assert json.loads(request.parameters()) == {}
    response = pb_utils.InferenceResponse([x])
    assert pb_utils.get_output_tensor_by_name(response, "X") is x
    assert not response.has_error()


def test_a_response_takes_only_a_triton_error():
    error = pb_utils.TritonError("bad", pb_utils.TritonError.INVALID_ARG)
    response = pb_utils.InferenceResponse([], error=error)
    assert response.has_error()
    assert (response.error().message(), response.error().code()) == ("bad", 3)
    assert pb_utils.TritonError("x").code() == pb_utils.TritonError.INTERNAL
    with pytest.raises(pb_utils.TritonModelException, match="must be a TritonError"):
        pb_utils.InferenceResponse([], error="bad")


def test_configs_are_read_by_name_and_types_converted():
    config = {"input": [{"name": "A", "data_type": "TYPE_FP32"}], "output": []}
    assert pb_utils.get_input_config_by_name(config, "A") == config["input"][0]
    assert pb_utils.get_output_config_by_name(config, "A") is None
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.triton_to_numpy_type(11) is np.float32
    assert pb_utils.numpy_to_triton_type(np.int64) == 9
    with pytest.raises(pb_utils.TritonModelException, match="TYPE_NOPE"):
        pb_utils.triton_string_to_numpy("TYPE_NOPE")


def test_decoupled_and_unknown_request_arguments_are_refused_by_name():
    with pytest.raises(pb_utils.TritonModelException, match="preferred_memory"):
        pb_utils.InferenceRequest("m", [], [], preferred_memory=None)
    with pytest.raises(pb_utils.TritonModelException, match="decoupled"):
        pb_utils.InferenceRequest("m").get_response_sender()


def test_the_auto_complete_config_adds_and_refuses_as_tritons_does():
    config = pb_utils.ModelConfig(json.dumps({"name": "m", "max_batch_size": 8}))
    config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [4]})
    config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [4]})  # the same: kept
    config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [1]})
    config.set_dynamic_batching()
    assert config.as_dict()["input"] == [{"name": "X", "data_type": "TYPE_FP32", "dims": [4]}]
    assert "dynamic_batching" in config.as_dict()
    with pytest.raises(ValueError, match="another data_type or dims"):
        config.add_input({"name": "X", "data_type": "TYPE_FP16", "dims": [4]})
    with pytest.raises(ValueError, match="missing 'dims'"):
        config.add_output({"name": "Z", "data_type": "TYPE_FP32"})
    with pytest.raises(ValueError, match="max_batch_size 8"):
        config.set_max_batch_size(4)


def test_the_logger_writes_to_corrals_log(caplog: pytest.LogCaptureFixture):
    with caplog.at_level(logging.INFO, logger="corral.python_model"):
        pb_utils.Logger.log_info("hello")
        pb_utils.Logger.log("careful", pb_utils.Logger.WARNING)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "hello"),
        (logging.WARNING, "careful"),
    ]


def test_another_module_under_tritons_name_is_not_replaced(monkeypatch: pytest.MonkeyPatch):
    other = types.ModuleType(pb_utils.MODULE_NAME)
    monkeypatch.setitem(sys.modules, pb_utils.MODULE_NAME, other)
    with pytest.raises(ImportError, match="already imported"):
        pb_utils.install()
    assert sys.modules[pb_utils.MODULE_NAME] is other


def test_strings_and_unknown_numpy_types_map_to_tritons_numbers():
    assert pb_utils.numpy_to_triton_type(np.str_) == 13
    assert pb_utils.numpy_to_triton_type(np.bytes_) == 13
    assert pb_utils.numpy_to_triton_type(np.complex64) is None


def test_errors_and_exceptions_read_as_tritons_do():
    error = pb_utils.TritonError("bad", pb_utils.TritonError.NOT_FOUND)
    assert repr(error) == "TritonError('bad', code=2)"
    assert pb_utils.TritonModelException("it broke").message() == "it broke"


def test_a_tensor_goes_to_and_from_dlpack_and_shows_itself():
    array = np.arange(3, dtype=np.int32)
    tensor = pb_utils.Tensor("T", array)
    back = np.from_dlpack(types.SimpleNamespace(__dlpack__=lambda **_: tensor.to_dlpack()))
    np.testing.assert_array_equal(back, array)
    assert repr(tensor) == "Tensor('T', int32[3])"
    with pytest.raises(pb_utils.TritonModelException, match="takes an object with __dlpack__"):
        pb_utils.Tensor.from_dlpack("T", [1, 2])


def test_a_request_answers_what_it_was_built_with():
    x = pb_utils.Tensor("X", np.zeros(1, np.float32))
    request = pb_utils.InferenceRequest(
        b"other",
        ["Y"],
        [x],
        request_id="r1",
        correlation_id=5,
        flags=2,
        timeout=1000,
        parameters={"k": 1},
    )
    assert request.model_name() == "other"
    assert request.request_id() == "r1"
    assert request.correlation_id() == 5
    assert request.flags() == 2
    assert request.timeout() == 1000
    assert json.loads(request.parameters()) == {"k": 1}
    assert pb_utils.InferenceRequest("m", parameters='{"a": 2}').parameters() == '{"a": 2}'
    assert not request.is_cancelled()
    assert repr(request) == "InferenceRequest(model_name='other', inputs=[Tensor('X', float32[1])])"
    with pytest.raises(pb_utils.TritonModelException, match="decoupled BLS"):
        request.exec(decoupled=True)


def test_a_response_finds_a_later_output_and_shows_itself():
    a = pb_utils.Tensor("A", np.zeros(1, np.int8))
    b = pb_utils.Tensor("B", np.ones(2, np.int8))
    response = pb_utils.InferenceResponse([a, b])
    assert pb_utils.get_output_tensor_by_name(response, "B") is b
    assert pb_utils.get_output_tensor_by_name(response, "C") is None
    assert repr(response) == (
        "InferenceResponse([Tensor('A', int8[1]), Tensor('B', int8[2])], error=None)"
    )


def test_the_loggers_levels_reach_corrals_log(caplog: pytest.LogCaptureFixture):
    with caplog.at_level(logging.DEBUG, logger="corral.python_model"):
        pb_utils.Logger.log_warn("w")
        pb_utils.Logger.log_error("e")
        pb_utils.Logger.log_verbose("v")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "w"),
        (logging.ERROR, "e"),
        (logging.DEBUG, "v"),
    ]


def test_the_auto_complete_config_refuses_another_scheduler_and_unknown_properties():
    config = pb_utils.ModelConfig({"name": "m", "sequence_batching": {}})
    with pytest.raises(ValueError, match="sets sequence_batching"):
        config.set_dynamic_batching()
    with pytest.raises(ValueError, match="properties other than"):
        config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [1], "optional": True})
    assert "dynamic_batching" not in config.as_dict()
    assert "output" not in config.as_dict()
