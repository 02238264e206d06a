"""Client-facing errors in OpenAI's shape. Messages are written here, never taken from an
exception's text, so no stack trace or secret can reach a client."""

from __future__ import annotations

from ballast.resilience.failures import Failure, openai_error_body


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        error_type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.code = code
        self.param = param
        self.headers = headers

    def body(self) -> bytes:
        return openai_error_body(self.message, self.error_type, self.code, self.param)

    def event(self) -> bytes:
        """The same error as the SSE event that ends a started stream."""
        return b"data: " + self.body() + b"\n\n"


def from_failure(failure: Failure) -> ApiError:
    """The client's view of the last failed attempt when no deployment could answer."""
    kind = failure.kind
    headers: tuple[tuple[bytes, bytes], ...] = ()
    if failure.retry_after is not None:
        headers = ((b"retry-after", str(max(1, round(failure.retry_after))).encode()),)
    return ApiError(
        kind.status,
        f"No deployment could answer: {failure.kind.label} ({failure.message})",
        kind.error_type,
        kind.code,
        headers=headers,
    )


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", "invalid_request", param)


def model_not_found(model: str) -> ApiError:
    shown = model if len(model) <= 200 else model[:200] + "..."
    return ApiError(
        404,
        f"The model '{shown}' does not exist.",
        "invalid_request_error",
        "model_not_found",
        "model",
    )
