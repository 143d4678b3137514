"""The model API: the provider routes a harness calls with its session key (OpenAI chat and responses, Anthropic
messages, Gemini), ``/v1/models`` and a bare ``/health``. The only listener a sandbox's relay forwards to."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from nemo_polar.proxy.errors import ProxyError, error_response
from nemo_polar.proxy.http.proxy import Proxy, handle_proxy_errors

GEMINI_VERSIONS = {"v1beta", "v1", "v1alpha"}
GEMINI_METHODS = {"generateContent", "streamGenerateContent", "countTokens"}


def _gemini_model(name: str, max_len: int | None) -> dict[str, Any]:
    """A Gemini API ``Model`` resource for a served name."""
    return {
        "name": f"models/{name}",  # as the Gemini adapter's model_field names it in records
        "baseModelId": name,
        "version": "1",
        "displayName": name,
        "inputTokenLimit": max_len or 0,
        "outputTokenLimit": max_len or 0,
        "supportedGenerationMethods": sorted(GEMINI_METHODS),
    }


def model_app(proxy: Proxy) -> FastAPI:
    config = proxy.config
    app = FastAPI(title="nemo_polar proxy: model API", openapi_url=None, docs_url=None, redoc_url=None)
    app.state.proxy = proxy
    handle_proxy_errors(app)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok"}  # the sandbox's liveness probe; the state lives on the admin listener

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        info = await proxy.engine.info()
        names = [info.model, *config.model_aliases]
        if request.headers.get("anthropic-version"):
            data = [{"type": "model", "id": n, "display_name": n, "created_at": "1970-01-01T00:00:00Z"} for n in names]
            return {"data": data, "has_more": False, "first_id": names[0], "last_id": names[-1]}
        return {
            "object": "list",
            "data": [{"id": n, "object": "model", "created": 0, "owned_by": "nemo_polar"} for n in names],
        }

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await proxy.call("chat", request)

    @app.post("/v1/responses")
    async def create_response(request: Request) -> Response:
        return await proxy.call("responses", request)

    @app.get("/v1/responses")
    async def responses_websocket() -> Response:
        # Codex probes a WebSocket transport on GET; a 404 makes it fall back to HTTP POST.
        return error_response("openai", ProxyError(404, "WebSocket transport is not supported; use POST /v1/responses"))

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        return await proxy.call("anthropic", request)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Response:
        return await proxy.count_tokens("anthropic", request)

    # Google's Gemini API: /{version}/models/{model}:{method}, the version as the SDK is configured (v1beta).
    @app.post("/{version}/models/{target}")
    async def gemini(version: str, target: str, request: Request) -> Response:
        model, _, method = target.partition(":")
        if version not in GEMINI_VERSIONS or method not in GEMINI_METHODS or not model:
            err = ProxyError(404, f"unknown method {target!r}; expected one of {sorted(GEMINI_METHODS)}")
            return error_response("gemini", err)
        if method == "countTokens":
            return await proxy.count_tokens("gemini", request, path_model=model)
        return await proxy.call("gemini", request, path_model=model, stream=method == "streamGenerateContent")

    @app.get("/{version}/models")
    async def gemini_models(version: str) -> Response:
        if version not in GEMINI_VERSIONS:
            return error_response("gemini", ProxyError(404, f"unknown API version {version!r}"))
        info = await proxy.engine.info()
        names = [info.model, *config.model_aliases]
        return JSONResponse({"models": [_gemini_model(n, info.max_model_len) for n in names]})

    @app.get("/{version}/models/{model}")
    async def gemini_model(version: str, model: str) -> Response:
        if version not in GEMINI_VERSIONS:
            return error_response("gemini", ProxyError(404, f"unknown API version {version!r}"))
        return JSONResponse(_gemini_model(model, (await proxy.engine.info()).max_model_len))

    return app
