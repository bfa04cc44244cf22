"""Typed errors of the decoding engine; the gateway maps each to an OpenAI error code."""

from __future__ import annotations


class DecodingError(Exception):
    """Base of every error the engine raises on purpose."""

    code = "decoding_error"


class ModelLoadError(DecodingError):
    """A model or tokenizer path that is missing, unreadable or of an unsupported architecture."""

    code = "model_load_error"


class TokenizerMismatchError(ModelLoadError):
    """A draft model whose tokenizer differs from the target's."""

    code = "draft_tokenizer_mismatch"


class InvalidRequestError(DecodingError):
    """Generation parameters out of range (negative max tokens, temperature < 0, ...)."""

    code = "invalid_generation_parameters"


class ContextLengthError(InvalidRequestError):
    """Prompt plus max tokens exceeds the model's context."""

    code = "context_length_exceeded"
