"""Typed errors of the decoding engine; the gateway maps each to an OpenAI error code."""

from __future__ import annotations


class DecodingError(Exception):
    """Base of every error the engine raises on purpose; `param` names the request field at fault."""

    code = "decoding_error"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ModelLoadError(DecodingError):
    """A model or tokenizer path that is missing, unreadable or of an unsupported architecture."""

    code = "model_load_error"


class TokenizerMismatchError(ModelLoadError):
    """A draft model whose tokenizer differs from the target's."""

    code = "draft_tokenizer_mismatch"


class InvalidRequestError(DecodingError):
    """Generation parameters out of range (negative max tokens, temperature < 0, ...)."""

    code = "invalid_value"


class UnknownDrafterError(InvalidRequestError, ModelLoadError):
    """A drafter name draftgate does not have: a bad value (400, `invalid_value`) that also means the engine
    cannot be built as asked."""


class ParameterCombinationError(InvalidRequestError):
    """Two request fields that cannot go together (each fine alone)."""

    code = "invalid_parameter_combination"


STOP_WITH_STRUCTURE = ("'stop' cannot be combined with tools or a JSON response_format: a stop sequence would cut "
                       "the structured output")


class ContextLengthError(InvalidRequestError):
    """Prompt plus max tokens exceeds the model's context."""

    code = "context_length_exceeded"


class ToolError(InvalidRequestError):
    """Malformed `tools`, a `tool_choice` naming an absent tool, or a tool message without its call."""

    code = "invalid_tools"


class UnknownToolError(ToolError):
    """`tool_choice` names a function that `tools` does not define."""

    code = "tool_not_found"


class MessageError(InvalidRequestError):
    """A chat message the renderer cannot turn into a prompt (bad role, content part, tool result)."""

    code = "invalid_messages"


class EmptyArrayError(MessageError):
    """An array inside a message given empty (content parts, tool calls): OpenAI refuses it by this code."""

    code = "empty_array"
