"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`, code = HTTP status
(as vLLM answers)."""
from __future__ import annotations

from aiohttp import web

TYPES = {400: "invalid_request_error", 404: "NotFoundError", 405: "method_not_allowed",
         408: "timeout", 413: "request_too_large", 500: "server_error"}


class ApiError(Exception):
    """A request the server refuses: status, message and (optionally) the field at fault."""

    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


class BadRequest(ApiError):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message, 400, param)


def error_body(status: int, message: str, param: str | None = None, kind: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind or TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": status}}


def error_response(status: int, message: str, param: str | None = None, kind: str | None = None,
                   headers: dict | None = None) -> web.Response:
    return web.json_response(error_body(status, message, param, kind), status=status, headers=headers)


def model_not_found(name: object) -> ApiError:
    return ApiError(f"The model `{name}` does not exist.", 404, "model")
