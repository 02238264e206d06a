"""The MCP tool server of `bench/mcp_calls.py`: the official SDK's server with one trivial
tool, `echo`, on Streamable HTTP at `/mcp` (uvicorn, httptools, uvloop), in a process of its
own so it shares no interpreter lock with the load generator or the gateway. Sessions as the
SDK keeps them (the handshake revision); `GET /health` answers `ok`.

``python bench/mcp_tool_server.py PORT [--sse]``
"""

from __future__ import annotations

import argparse

import uvicorn
from mcp.server.mcpserver import MCPServer
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response


def echo(text: str) -> str:
    """Say the text back."""
    return text


async def health(request: Request) -> Response:
    return PlainTextResponse("ok")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("port", type=int)
    parser.add_argument(
        "--sse", action="store_true", help="answer each request as an SSE stream, not JSON"
    )
    args = parser.parse_args()
    server = MCPServer("bench")
    server.tool()(echo)
    server.custom_route("/health", methods=["GET"])(health)
    app = server.streamable_http_app(json_response=not args.sse)
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        http="httptools",
        loop="uvloop",
        access_log=False,
        log_level="warning",
        # The bench's clients keep their connections between rounds (the other side's
        # cells run meanwhile): uvicorn's 5 s default would close them under a request.
        timeout_keep_alive=120,
    )


if __name__ == "__main__":
    main()
