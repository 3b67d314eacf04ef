"""An MCP server for the notification tests (crates/cli/tests/broker/
notify.rs), on the official Python SDK (PyPI `mcp`), over streamable HTTP
on 127.0.0.1:PORT: `slow` sleeps and, cancelled, writes `cancelled` into
MARKS (the proof the cancellation reached the server); `grow` adds a tool
`grown` and tells the client its tools changed.

usage: notify_server.py PORT MARKS"""

import pathlib
import sys

import anyio

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("notify-test")
marks = pathlib.Path(sys.argv[2])


async def slow(seconds: float) -> str:
    """Sleeps for `seconds`."""
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        (marks / "cancelled").write_text("cancelled")
        raise
    return "slept"


def grown() -> str:
    return "grown"


async def grow(ctx: Context) -> str:
    """Adds the tool `grown` and says the tools changed."""
    server.add_tool(grown, name="grown", description="Appeared after grow.")
    await ctx.session.send_tool_list_changed()
    return "grew"


server.add_tool(slow, name="slow", description="Sleeps for a while.")
server.add_tool(grow, name="grow", description="Adds a tool.")

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
