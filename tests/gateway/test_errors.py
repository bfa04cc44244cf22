"""Each error class maps to one OpenAI envelope and status; nothing falls through to a bare 500."""

from __future__ import annotations

import pytest

from decoding.constraints.base import CompileTimeoutError, UnsupportedKeywordError
from decoding.errors import ContextLengthError, ModelLoadError, UnknownToolError
from decoding.structured import OutputValidationError
from gateway.errors import UnknownModelError, to_api_error


@pytest.mark.parametrize(("exc", "status", "code", "param"), [
    (UnknownToolError("no such tool", param="tool_choice"), 400, "tool_not_found", "tool_choice"),
    (ContextLengthError("too long", param="messages"), 400, "context_length_exceeded", "messages"),
    (UnsupportedKeywordError("'minimum' at /a", param="response_format.json_schema.schema"), 400,
     "unsupported_schema_keyword", "response_format.json_schema.schema"),
    (CompileTimeoutError("gave up"), 400, "schema_too_complex", None),
    (OutputValidationError("age < 0"), 422, "output_validation_failed", None),
    (UnknownModelError("gpt-9", ["smollm2-135m"]), 404, "model_not_found", "model"),
    (ModelLoadError("missing file"), 503, "model_load_error", None),
])
def test_error_classes_map_to_envelopes(exc: Exception, status: int, code: str, param: str | None) -> None:
    error = to_api_error(exc)
    assert (error.status, error.code, error.param) == (status, code, param)
    body = error.body()["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["message"] == str(exc)


def test_an_unforeseen_error_is_a_500_without_internals() -> None:
    error = to_api_error(KeyError("secret internal detail"))
    assert error.status == 500 and error.code == "internal_error"
    assert "secret" not in error.message and "KeyError" in error.message
