"""A remote MCP server for the tests, built on the official Python SDK
(PyPI `mcp`): streamable HTTP or the older HTTP+SSE transport on
127.0.0.1:PORT, every request refused with 401 unless it carries
`Authorization: Bearer <REMOTE_TEST_TOKEN>`. Its one tool, `seen`, returns
the X-Org header its request carried and how many requests it refused.

usage: remote_server.py streamable|sse PORT   (token in REMOTE_TEST_TOKEN)"""

import os
import sys

import uvicorn
from mcp.server.mcpserver import MCPServer

TOKEN = os.environ["REMOTE_TEST_TOKEN"]
state = {"refused": 0, "org": None}

server = MCPServer("remote-test")


@server.tool()
def seen() -> str:
    """Says which X-Org header reached the server and how many requests it refused."""
    return f"org={state['org']} refused={state['refused']}"


def guarded(app):
    async def wrapper(scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            if headers.get(b"authorization") != f"Bearer {TOKEN}".encode():
                state["refused"] += 1
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"text/plain")]})
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
            state["org"] = headers.get(b"x-org", b"").decode() or None
        await app(scope, receive, send)
    return wrapper


if __name__ == "__main__":
    transport, port = sys.argv[1], int(sys.argv[2])
    app = server.streamable_http_app() if transport == "streamable" else server.sse_app()
    uvicorn.run(guarded(app), host="127.0.0.1", port=port, log_level="warning")
