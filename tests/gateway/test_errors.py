"""Each error class maps to one OpenAI envelope and status; nothing falls through to a bare 500."""

from __future__ import annotations

import logging

import pytest

from decoding.constraints.base import CompileTimeoutError, UnsupportedKeywordError
from decoding.errors import ContextLengthError, ModelLoadError, UnknownToolError
from decoding.structured import OutputValidationError
from gateway.app import failure
from gateway.errors import ApiError, UnknownModelError, to_api_error
from gateway.local import RequestTimeoutError
from gateway.upstream import UpstreamError


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


@pytest.mark.parametrize(("exc", "level", "traceback"), [
    (KeyError("a fault of ours"), logging.ERROR, True),  # the traceback is what finds it
    (UpstreamError(ApiError(502, "upstream for 'x' failed", "server_error", "upstream_error")), logging.WARNING,
     False),
    (RequestTimeoutError(30), logging.WARNING, False),
    (OutputValidationError("age < 0"), None, False),  # the client's outcome, said to the client
])
def test_expected_outcomes_are_logged_in_a_line_faults_with_their_traceback(
        exc: Exception, level: int | None, traceback: bool, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="gateway.app"):
        failure(exc)
    records = [r for r in caplog.records if r.name == "gateway.app"]
    assert [r.levelno for r in records] == ([level] if level is not None else [])
    assert all((r.exc_info is not None) == traceback for r in records)
