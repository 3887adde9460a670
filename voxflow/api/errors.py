"""Errors in the OpenAI shape: {"error": {"message", "type", "param", "code"}}.

Route code raises `APIError`; the handlers registered by `install_error_handlers` turn it (and FastAPI's own
validation errors, malformed JSON, unknown routes) into that envelope, so a bad input is never a 500. A
validation error names the field as the client spells it (`validation_error`); a body that is not JSON says so.
"""
from __future__ import annotations

import re

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


def as_api_error(exc: BaseException) -> APIError:
    """What a request that raised `exc` is answered with: an APIError as it is, anything else a 500 that names
    only the exception's type (its text may hold internals)."""
    if isinstance(exc, APIError):
        return exc
    return APIError(500, f"internal error: {type(exc).__name__}")


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


# pydantic names the member of a union it tried at the union's place in `loc` (e.g. ("voice", "str")): a type,
# not a field. Field names here are lowercase identifiers; these are builtin types, model classes, generics.
_UNION_TAG = re.compile(r"(?:str|int|float|bool|bytes|dict|list|tuple|set|none|[A-Z]\w*|[\w-]+\[.*\])")
_SHOULD = "Input should be "


def validation_error(errors: list[dict], strip: tuple[str, ...] = ()) -> APIError:
    """pydantic errors as one 400 naming the field of the first one, as a client spells it: union members'
    tags are dropped from `param` ("voice", not "voice.str") and their messages merged; a ValueError raised by
    a validator is given as its own text (without pydantic's "Value error, " prefix)."""
    first = errors[0] if errors else {}
    loc = list(first.get("loc", ()))
    while loc and loc[0] in strip:                        # where FastAPI found it (body, query, path)
        loc = loc[1:]
    group = [first]
    for i, part in enumerate(loc):
        if isinstance(part, str) and i > 0 and _UNION_TAG.fullmatch(part):
            loc = loc[:i]
            group = [e for e in errors if _under(e.get("loc", ()), loc, strip)]
            break
    param = ".".join(str(p) for p in loc) or None
    msgs = list(dict.fromkeys(_message(e) for e in group))
    if len(msgs) > 1 and all(m.startswith(_SHOULD) for m in msgs):
        msg = _SHOULD + " or ".join(m[len(_SHOULD):].split(", ")[0] for m in msgs)    # the kinds, no details
    else:
        msg = "; or ".join(msgs)
    named = param is None or msg.startswith(param + " ")        # a validator's own text may name it already
    return APIError(400, msg if named else f"{param}: {msg}", param=param, code=first.get("type", "invalid_value"))


def _under(loc, prefix: list, strip: tuple[str, ...]) -> bool:
    loc = list(loc)
    while loc and loc[0] in strip:
        loc = loc[1:]
    return loc[:len(prefix)] == prefix


def _message(error: dict) -> str:
    ctx = error.get("ctx") or {}
    if error.get("type") == "value_error" and ctx.get("error") is not None:
        return str(ctx["error"])
    return error.get("msg", "invalid value")


def _body_error(error: dict, content_type: str | None) -> APIError:
    """The body as a whole is missing or not an object. FastAPI reads a body as JSON only when it is declared
    so: a request without `Content-Type: application/json` (curl -d sends a form type) gets here, not to JSON."""
    media = (content_type or "").split(";")[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        got = f"Content-Type {content_type!r}" if content_type else "no Content-Type header"
        return APIError(400, f"the request body must be JSON, sent with the header 'Content-Type: "
                             f"application/json' (got {got})", code="invalid_content_type")
    if error.get("type") == "missing":
        return APIError(400, "the request body is empty; send a JSON object", code="missing_body")
    return APIError(400, "the request body must be a JSON object ({...})", code="invalid_body")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid":
            return APIError(400, "request body is not valid JSON", code="invalid_json").response()
        if tuple(first.get("loc", ())) == ("body",):        # no body, or not one FastAPI could read as an object
            return _body_error(first, request.headers.get("content-type")).response()
        return validation_error(errors, strip=("body", "query", "path")).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        return APIError(exc.status_code, str(exc.detail)).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        return as_api_error(exc).response()
