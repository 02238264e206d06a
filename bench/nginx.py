"""The fixed-answer upstream: nginx answering chat completions from its config alone.

nginx cannot branch on a request body, so the streaming answer lives on its own path:
``/v1/chat/completions`` answers a complete chat completion with ``usage`` and
``/stream/v1/chat/completions`` answers an SSE stream (role chunk, content chunks, a
finish chunk, a usage chunk, ``[DONE]``). The same answer in Anthropic's Messages wire is on
``/anthropic/v1/messages`` and, streamed, ``/anthropic-stream/v1/messages``. Everything
nginx writes stays in a temporary prefix directory; the system nginx and its files are never
touched.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

NON_STREAM_PATH = "/v1/chat/completions"
STREAM_PREFIX = "/stream"
STREAM_PATH = STREAM_PREFIX + NON_STREAM_PATH
ANTHROPIC_PREFIX = "/anthropic"
ANTHROPIC_STREAM_PREFIX = "/anthropic-stream"
MESSAGES_PATH = "/v1/messages"

_CREATED = 1_700_000_000
_WORDS = ["Hello", " from", " the", " fixed", " answer", " upstream", "."]
_USAGE = {"prompt_tokens": 9, "completion_tokens": len(_WORDS), "total_tokens": 9 + len(_WORDS)}


def completion_body() -> str:
    """The fixed non-streaming chat completion."""
    body = {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": _CREATED,
        "model": "bench-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "".join(_WORDS)},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": _USAGE,
    }
    return json.dumps(body, separators=(",", ":"))


def _chunk(delta: dict[str, Any], finish: str | None, usage: bool = False) -> str:
    chunk: dict[str, Any] = {
        "id": "chatcmpl-bench-stream",
        "object": "chat.completion.chunk",
        "created": _CREATED,
        "model": "bench-stream",
        "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage:
        chunk["usage"] = _USAGE
    return "data: " + json.dumps(chunk, separators=(",", ":")) + "\n\n"


def stream_body() -> str:
    """The fixed SSE stream: role, content, finish, usage, ``[DONE]``."""
    events = [_chunk({"role": "assistant", "content": ""}, None)]
    events += [_chunk({"content": word}, None) for word in _WORDS]
    events.append(_chunk({}, "stop"))
    events.append(_chunk({}, None, usage=True))
    events.append("data: [DONE]\n\n")
    return "".join(events)


def messages_body() -> str:
    """The fixed answer as an Anthropic message."""
    body = {
        "id": "msg_bench",
        "type": "message",
        "role": "assistant",
        "model": "bench-model",
        "content": [{"type": "text", "text": "".join(_WORDS)}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 9, "output_tokens": len(_WORDS)},
    }
    return json.dumps(body, separators=(",", ":"))


def _event(kind: str, **data: Any) -> str:
    payload = json.dumps({"type": kind, **data}, separators=(",", ":"))
    return f"event: {kind}\ndata: {payload}\n\n"


def messages_stream_body() -> str:
    """The fixed answer as Anthropic's event stream."""
    start = {"id": "msg_bench_stream", "type": "message", "role": "assistant"}
    start |= {"model": "bench-stream", "content": [], "usage": {"input_tokens": 9}}  # type: ignore[dict-item]
    events = [_event("message_start", message=start)]
    events.append(_event("content_block_start", index=0, content_block={"type": "text"}))
    events.append(_event("ping"))
    for word in _WORDS:
        delta = {"type": "text_delta", "text": word}
        events.append(_event("content_block_delta", index=0, delta=delta))
    events.append(_event("content_block_stop", index=0))
    usage = {"output_tokens": len(_WORDS)}
    events.append(_event("message_delta", delta={"stop_reason": "end_turn"}, usage=usage))
    events.append(_event("message_stop"))
    return "".join(events)


def _quote(text: str) -> str:
    """Quote ``text`` as an nginx string literal (``return`` text is a complex value)."""
    if "$" in text:
        raise ValueError("nginx would interpolate '$' in a return body")
    escaped = text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")
    return f"'{escaped}'"


def render_config(prefix: Path, port: int) -> str:
    """An nginx.conf whose every path is inside ``prefix``."""
    temp = {name: prefix / name for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")}
    for path in temp.values():
        path.mkdir(parents=True, exist_ok=True)
    return f"""
worker_processes 1;
daemon off;
pid {prefix / "nginx.pid"};
error_log {prefix / "error.log"} warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    server_tokens off;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    client_body_temp_path {temp["client_body"]};
    proxy_temp_path {temp["proxy"]};
    fastcgi_temp_path {temp["fastcgi"]};
    uwsgi_temp_path {temp["uwsgi"]};
    scgi_temp_path {temp["scgi"]};
    server {{
        listen 127.0.0.1:{port} reuseport backlog=4096;
        location = /health {{
            default_type text/plain;
            return 200 'ok';
        }}
        location = {NON_STREAM_PATH} {{
            default_type application/json;
            return 200 {_quote(completion_body())};
        }}
        location = {STREAM_PATH} {{
            default_type text/event-stream;
            add_header Cache-Control no-cache;
            return 200 {_quote(stream_body())};
        }}
        location = {ANTHROPIC_PREFIX + MESSAGES_PATH} {{
            default_type application/json;
            return 200 {_quote(messages_body())};
        }}
        location = {ANTHROPIC_STREAM_PREFIX + MESSAGES_PATH} {{
            default_type text/event-stream;
            add_header Cache-Control no-cache;
            return 200 {_quote(messages_stream_body())};
        }}
    }}
}}
"""


def render_proxy_config(prefix: Path, port: int, upstream_port: int) -> str:
    """An nginx.conf that relays every request to the upstream on ``upstream_port``
    unbuffered, one worker process: the floor of any gateway relaying streams on this
    machine, written in C, with the kernel's share of each token the same as every other."""
    temp = {name: prefix / name for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")}
    for path in temp.values():
        path.mkdir(parents=True, exist_ok=True)
    return f"""
worker_processes 1;
worker_rlimit_nofile 65536;
daemon off;
pid {prefix / "nginx.pid"};
error_log {prefix / "error.log"} warn;
events {{ worker_connections 32768; }}
http {{
    access_log off;
    server_tokens off;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    client_body_temp_path {temp["client_body"]};
    proxy_temp_path {temp["proxy"]};
    fastcgi_temp_path {temp["fastcgi"]};
    uwsgi_temp_path {temp["uwsgi"]};
    scgi_temp_path {temp["scgi"]};
    upstream tick {{
        server 127.0.0.1:{upstream_port};
        keepalive 1024;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location = /health {{
            default_type text/plain;
            return 200 'ok';
        }}
        location / {{
            proxy_pass http://tick;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 300s;
        }}
    }}
}}
"""


def nginx_command(prefix: Path, port: int, upstream_port: int | None = None) -> list[str]:
    """Write the config into ``prefix`` and return the command that serves it: the fixed
    answers, or with ``upstream_port`` the unbuffered relay to that upstream."""
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    conf = prefix / "nginx.conf"
    if upstream_port is None:
        conf.write_text(render_config(prefix, port))
    else:
        conf.write_text(render_proxy_config(prefix, port, upstream_port))
    return [binary, "-c", str(conf), "-p", str(prefix), "-e", str(prefix / "error.log")]
