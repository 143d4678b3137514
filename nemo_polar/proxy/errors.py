"""Errors with the HTTP status and the provider-shaped body each API's SDK expects."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

# OpenAI error "type" per status; Anthropic has its own names.
_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    529: "overloaded_error",
}


class ProxyError(Exception):
    """A failure answered to the harness with ``status`` and a provider-shaped body."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param


# Google's canonical status names (google.rpc.Code) per HTTP status.
_GOOGLE_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    415: "INVALID_ARGUMENT",
    422: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def error_body(api: str, err: ProxyError) -> dict[str, Any]:
    if api == "gemini":
        return {
            "error": {"code": err.status, "message": err.message, "status": _GOOGLE_STATUS.get(err.status, "INTERNAL")}
        }
    if api == "anthropic":
        kind = _ANTHROPIC_TYPES.get(err.status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": err.message}}
    kind = _OPENAI_TYPES.get(err.status, "server_error")
    return {"error": {"message": err.message, "type": kind, "param": err.param, "code": err.code}}


def error_response(api: str, err: ProxyError) -> JSONResponse:
    return JSONResponse(error_body(api, err), status_code=err.status)


def template_refused(exc: Exception) -> ProxyError:
    """The model's chat template raised for this conversation (``raise_exception`` or an error while rendering): a
    client error, as vLLM's chat endpoint answers it, naming the template's own message."""
    return ProxyError(400, f"the model's chat template refused this conversation: {exc}", code="chat_template_error")


def tools_unsupported(info: Any) -> ProxyError:
    """The served model's template has no tools: the request's tools would never reach the model."""
    return ProxyError(
        400,
        f"the chat template of {info.model!r} renders no tools, so the model would never see this request's tools; "
        "serve a model whose template has tool support, or send the request without tools",
        code="tools_unsupported",
        param="tools",
    )


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> ProxyError:
    return ProxyError(400, message, param=param, code=code)
