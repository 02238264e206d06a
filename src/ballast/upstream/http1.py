"""A lean HTTP/1.1 client for the request path: pooled keep-alive connections to upstreams.

Why: aiohttp's ClientSession spends about 75 us of CPU on one request on a small machine (a
request object, timer contexts, header multidicts, cookie filtering, a stream reader and its
callbacks), which was a third of a proxied request's whole cost. This client writes a request
in one go, parses the answer with httptools (the C parser uvicorn uses) straight into a small
response object, and hands the connection back to its pool once the answer was read to the
end: about 10 us a request.

Connections may go through an outbound proxy (`proxy.py` decides which, once per origin): a
CONNECT tunnel for https, the proxy itself for plain http.

It is a transport and nothing more: deadlines, stream clocks, retries and the error taxonomy
stay with the exchange, which owns every wait and cancels it. It speaks HTTP/1.1 over TCP or
TLS. Answers may be framed by length, by chunks or by the end of the connection; a body sent
gzip- or deflate-encoded although we ask for identity is decoded. A body nobody reads stops
the socket being read once a bounded buffer is full.

The client is four modules, kept apart the way httpcore keeps its own: `http_common.py`
(errors, origins, header lines), `response.py` (an answer and its body), `connection.py`
(the protocol on one socket) and `pool.py` (the bounded pool and dialling). This module is
their public face: the rest of Ballast imports the client from here.
"""

from __future__ import annotations

from ballast.upstream.http_common import (
    MAX_HEAD,
    BadResponse,
    ConnectFailed,
    ConnectTimeout,
    Disconnected,
    Headers,
    HttpError,
    Origin,
    PoolTimeout,
    TooLarge,
    header_line,
    header_lines,
    split_url,
)
from ballast.upstream.pool import (
    DRAIN_TIMEOUT,
    HIGH_WATER,
    Pool,
    ProxyChoice,
    ProxyHop,
    default_tls_context,
)
from ballast.upstream.response import Response

__all__ = [
    "DRAIN_TIMEOUT",
    "HIGH_WATER",
    "MAX_HEAD",
    "BadResponse",
    "ConnectFailed",
    "ConnectTimeout",
    "Disconnected",
    "Headers",
    "HttpError",
    "Origin",
    "Pool",
    "PoolTimeout",
    "ProxyChoice",
    "ProxyHop",
    "Response",
    "TooLarge",
    "default_tls_context",
    "header_line",
    "header_lines",
    "split_url",
]
