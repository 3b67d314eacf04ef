"""An MCP server for the content tests (crates/cli/tests/broker/content.rs),
built on the official Python SDK (PyPI `mcp`): a tool dressed in every
field a definition may carry (title, annotations, icons, _meta, an output
schema) and one returning every kind of content block, with an image of
the size asked for. Over stdio (a direct client's view) or streamable HTTP
on 127.0.0.1:PORT (the broker's remote upstream).

usage: content_server.py stdio | content_server.py streamable PORT"""

import base64
import sys

from pydantic import BaseModel

from mcp.server.mcpserver import MCPServer
from mcp.types import (
    AudioContent,
    BlobResourceContents,
    EmbeddedResource,
    Icon,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
    ToolAnnotations,
)

server = MCPServer("content-test")


class Weather(BaseModel):
    city: str
    temperature: int
    conditions: str


@server.tool(
    title="Dressed Tool",
    annotations=ToolAnnotations(title="Dressed", readOnlyHint=True, openWorldHint=False),
    icons=[Icon(src="data:image/png;base64,iVBORw0KGgo=", mimeType="image/png", sizes=["16x16"])],
    meta={"example.com/owner": "tests", "rank": 3},
    structured_output=True,
)
def dressed(city: str) -> Weather:
    """Weather of a city, with an output schema."""
    return Weather(city=city, temperature=21, conditions="clear \"quoted\" é😀")


@server.tool(structured_output=False)
def kinds(image_bytes: int) -> list:
    """Every kind of content block, the image of image_bytes bytes."""
    image = base64.b64encode(bytes(range(256)) * (image_bytes // 256) + bytes(image_bytes % 256)).decode()
    audio = base64.b64encode(b"RIFF" + bytes(60)).decode()
    return [
        TextContent(type="text", text="before \"é😀\"", annotations={"audience": ["user"], "priority": 0.5}),
        ImageContent(type="image", data=image, mimeType="image/png"),
        AudioContent(type="audio", data=audio, mimeType="audio/wav", _meta={"seconds": 0}),
        EmbeddedResource(type="resource", resource=BlobResourceContents(
            uri="demo://blob", mimeType="application/octet-stream", blob=base64.b64encode(b"\x00\x01\x02").decode())),
        EmbeddedResource(type="resource", resource=TextResourceContents(
            uri="demo://text", mimeType="text/plain", text="a text resource")),
        ResourceLink(type="resource_link", uri="demo://link", name="link", description="a link", mimeType="text/plain"),
        TextContent(type="text", text="after"),
    ]


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        import uvicorn

        uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
