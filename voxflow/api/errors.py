"""Errors in the OpenAI shape: {"error": {"message", "type", "param", "code"}}.

Route code raises `APIError`; the handlers registered by `install_error_handlers` turn it (and FastAPI's own
validation errors, malformed JSON, unknown routes) into that envelope, so a bad input is never a 500.
"""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
         422: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 503: "server_error"}


class APIError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 retry_after: int | None = None, type_: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.retry_after = retry_after
        self.type = type_ or TYPES.get(status, "invalid_request_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        first = errors[0] if errors else {}
        loc = [str(p) for p in first.get("loc", []) if p not in ("body", "query", "path")]
        param = ".".join(loc) or None
        if first.get("type") == "json_invalid":
            return APIError(400, "request body is not valid JSON", code="invalid_json").response()
        msg = first.get("msg", "invalid request")
        return APIError(400, f"{param}: {msg}" if param else msg, param=param,
                        code=first.get("type", "invalid_value")).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        return APIError(exc.status_code, str(exc.detail)).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        return APIError(500, f"internal error: {type(exc).__name__}").response()
