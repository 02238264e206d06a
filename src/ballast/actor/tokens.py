"""Run tokens: HS256 JWTs with ``sub`` = run id, ``exp``, ``session_id`` and ``model``.

Expiry is checked against the injected clock's wall time (``clock.time()``), not PyJWT's
own reading of the system clock, so tests can expire a token without sleeping.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jwt

from ballast.resilience.clock import SYSTEM_CLOCK, Clock

ALGORITHM = "HS256"
INVALID_TOKEN = "invalid_token"
TOKEN_EXPIRED = "token_expired"


class TokenError(Exception):
    """A token that must be refused; ``code`` is ``invalid_token`` or ``token_expired``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class Issued:
    token: str
    expires_at: int
    """Unix seconds."""


class TokenIssuer:
    def __init__(self, secret: str, ttl: float, clock: Clock = SYSTEM_CLOCK) -> None:
        if not secret:
            raise ValueError("the token secret must not be empty")
        if not ttl > 0:
            raise ValueError("the token lifetime must be a positive number of seconds")
        self._secret = secret
        self.ttl = float(ttl)
        self.clock = clock

    def __repr__(self) -> str:  # never show the secret
        return f"TokenIssuer(ttl={self.ttl})"

    def issue(self, run_id: str, session_id: str, model: str) -> Issued:
        now = self.clock.time()
        expires_at = int(now + self.ttl)
        claims = {
            "sub": run_id,
            "iat": int(now),
            "exp": expires_at,
            "session_id": session_id,
            "model": model,
        }
        return Issued(jwt.encode(claims, self._secret, algorithm=ALGORITHM), expires_at)

    def verify(self, token: str) -> dict[str, Any]:
        """The token's claims; raises :class:`TokenError` if it is not valid right now."""
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                self._secret,
                algorithms=[ALGORITHM],
                options={
                    "require": ["sub", "exp"],
                    "verify_exp": False,  # checked below on the injected clock
                    "verify_iat": False,
                    "verify_nbf": False,
                },
            )
        except jwt.PyJWTError:
            raise TokenError(INVALID_TOKEN, "invalid run token") from None
        exp = claims.get("exp")
        sub = claims.get("sub")
        if isinstance(exp, bool) or not isinstance(exp, int | float) or not isinstance(sub, str):
            raise TokenError(INVALID_TOKEN, "invalid run token")
        if exp <= self.clock.time():
            raise TokenError(TOKEN_EXPIRED, "run token has expired")
        return claims
