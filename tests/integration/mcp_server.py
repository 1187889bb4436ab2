"""A small stdio MCP server for the tests of env `mcp`, written with the `mcp` SDK's FastMCP: a calculator with a
memory. Started as `python tests/integration/mcp_server.py`. With MCP_TEST_DIR set it writes its process id there as
`<pid>.pid`, so a test can find and kill it, and its `crash` tool ends the process the first MCP_TEST_CRASHES times
it is called (counted across the servers that share the folder)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mcp.server.fastmcp import FastMCP

server = FastMCP("calculator", log_level="WARNING")
memory: dict[str, float] = {}


@server.tool()
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


@server.tool()
def divide(a: float, b: float) -> float:
    """Divide a by b."""
    return a / b  # b = 0 raises: the client gets a result with isError and the error's text


@server.tool()
def remember(key: str, value: float) -> str:
    """Store a number under a key."""
    memory[key] = value
    return f"stored {key}"


@server.tool()
def recall(key: str) -> float:
    """The number stored under a key."""
    return memory[key]


@server.tool()
def forget() -> str:
    """Clear the memory."""
    memory.clear()
    return "memory cleared"


@server.tool()
def crash() -> str:
    """Exit the server process (the first MCP_TEST_CRASHES calls)."""
    folder = Path(os.environ["MCP_TEST_DIR"])
    if len(list(folder.glob("*.crash"))) < int(os.environ.get("MCP_TEST_CRASHES", "0")):
        (folder / f"{os.getpid()}.crash").touch()
        os._exit(1)  # as a server that dies does: no answer, the pipe closes
    return "still running"


if __name__ == "__main__":
    if folder := os.environ.get("MCP_TEST_DIR"):
        (Path(folder) / f"{os.getpid()}.pid").touch()
    if len(sys.argv) == 3 and sys.argv[1] == "--http":  # streamable HTTP at http://127.0.0.1:PORT/mcp
        server.settings.port = int(sys.argv[2])
        server.run("streamable-http")
    else:
        server.run("stdio")
