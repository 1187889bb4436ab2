"""``McpConnection``: one MCP client session for a synchronous caller.

The ``mcp`` SDK's client is async (anyio) and its transports are context managers that must be entered and left
in one task, so the session lives in a task of its own (``_hold``) on an event loop that a background thread runs,
and every call is handed to that loop and waited for. A server that exits, hangs or breaks the protocol surfaces as
``McpServerError`` naming the server; the connection is then ``broken`` and the env opens a new one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import shlex
import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from agentgym_rl.envs.base import EnvError, EnvUnavailable

if TYPE_CHECKING:
    from mcp import ClientSession, types

_CLOSE_S = 10.0  # the SDK's stdio shutdown: stdin closed, 2 s to exit, then SIGTERM and SIGKILL


class McpServerError(EnvUnavailable):
    """The MCP server did not start, exited, hung or broke the protocol; the message names it."""


def _import_mcp() -> Any:
    """The ``mcp`` package, or an error naming the extra that installs it."""
    try:
        import mcp
    except ImportError as exc:
        raise EnvError("env 'mcp' needs the mcp package: pip install -e '.[mcp]'") from exc
    return mcp


def _leaf(exc: BaseException) -> BaseException:
    """The first error inside anyio's exception groups: the one that says what happened."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _reason(exc: BaseException) -> str:
    leaf = _leaf(exc)
    text = str(leaf).strip().splitlines()
    return f"{type(leaf).__name__}: {text[0]}" if text else type(leaf).__name__


class McpConnection:
    """An open MCP client session (stdio or streamable HTTP) and the server's tools.

    Args:
        command: Executable of a stdio server (with ``args``, ``env``, ``cwd``); None for ``url``.
        url: Streamable-HTTP endpoint of a running server (with ``headers``); None for ``command``.
        start_timeout_s: Seconds for the server to start and answer ``initialize`` and ``tools/list``.
        call_timeout_s: Seconds for one request (a tool call, a ping).

    Raises:
        McpServerError: the server did not start or answer within ``start_timeout_s``.
        EnvError: the ``mcp`` package is not installed.
    """

    def __init__(
        self,
        *,
        command: str | None = None,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        url: str | None = None,
        headers: dict[str, str] | None = None,
        start_timeout_s: float,
        call_timeout_s: float,
    ) -> None:
        _import_mcp()
        self.label = f"MCP server {url}" if url else f"MCP server `{shlex.join([command or '', *(args or [])])}`"
        self._transport = (command, list(args or []), env, cwd, url, dict(headers or {}))
        self._call_timeout_s = call_timeout_s
        self.broken = False
        self._session: ClientSession | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-session", daemon=True)
        self._thread.start()
        self._stop = asyncio.Event()
        self._holder: asyncio.Task | None = None
        try:
            self.tools: list[types.Tool] = self._wait(self._open(), start_timeout_s, "start")
        except BaseException:
            self.close()
            raise

    def call_tool(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """The server's result of ``name(**arguments)``. A tool that failed is a result with ``isError``, and so is
        a request the server refused with a JSON-RPC error (unknown tool, bad arguments): both are for the agent
        to read.

        Raises:
            McpServerError: the server exited or hung (``broken`` after).
        """
        from mcp import McpError, types

        assert self._session is not None
        request = self._session.call_tool(name, arguments)
        try:
            return self._wait(request, self._call_timeout_s, f"call tool {name!r}", refusals=True)
        except McpError as exc:
            return types.CallToolResult(content=[types.TextContent(type="text", text=exc.error.message)], isError=True)

    def ping(self) -> None:
        """Check that the server still answers.

        Raises:
            McpServerError: it does not (``broken`` after).
        """
        assert self._session is not None
        self._wait(self._session.send_ping(), self._call_timeout_s, "answer a ping")

    def close(self) -> None:
        """End the session and stop the server (a stdio server's process ends with it); idempotent."""
        if self._loop.is_closed():
            return
        if self._holder is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            finished = asyncio.run_coroutine_threadsafe(self._finish(), self._loop)
            with contextlib.suppress(concurrent.futures.TimeoutError):
                finished.result(_CLOSE_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(_CLOSE_S)
        if not self._thread.is_alive():
            self._loop.close()
        self.broken = True

    async def _finish(self) -> None:
        """Wait for the session task to leave its transport, cancelling it when it does not in time."""
        assert self._holder is not None
        done, _ = await asyncio.wait({self._holder}, timeout=_CLOSE_S - 1)
        if not done:
            self._holder.cancel()
        # The session's own failure was reported when it happened; closing only waits for the task to end.
        with contextlib.suppress(BaseException):
            await self._holder

    async def _open(self) -> list[types.Tool]:
        """Start the session task and wait until it holds an initialised session and the tool list."""
        ready: asyncio.Future[list[types.Tool]] = self._loop.create_future()
        self._holder = asyncio.ensure_future(self._hold(ready))
        await asyncio.wait({ready, self._holder}, return_when=asyncio.FIRST_COMPLETED)
        if ready.done():
            return ready.result()
        exc = self._holder.exception()
        raise McpServerError(f"{self.label} did not start: {_reason(exc) if exc else 'it ended at once'}")

    async def _hold(self, ready: asyncio.Future[list[types.Tool]]) -> None:
        """Own the transport and the session from start to close: anyio's scopes end in the task that began them."""
        from mcp import ClientSession

        async with self._streams() as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            tools, cursor = [], None
            while True:
                page = await session.list_tools(cursor)
                tools.extend(page.tools)
                if not (cursor := page.nextCursor):
                    break
            self._session = session
            ready.set_result(tools)
            await self._stop.wait()

    @contextlib.asynccontextmanager
    async def _streams(self):
        """The (read, write) streams of the transport the options name."""
        command, args, env, cwd, url, headers = self._transport
        if url is not None:
            from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

            async with (
                create_mcp_http_client(headers=headers) as client,
                streamable_http_client(url, http_client=client) as (read, write, _),
            ):
                yield read, write
        else:
            from mcp import StdioServerParameters
            from mcp.client.stdio import stdio_client

            parameters = StdioServerParameters(command=command, args=args, env=env, cwd=cwd)
            async with stdio_client(parameters) as (read, write):
                yield read, write

    def _wait(self, request: Coroutine[Any, Any, Any], timeout: float, what: str, *, refusals: bool = False) -> Any:
        """Run ``request`` on the session's loop for at most ``timeout`` seconds; a failure of the server raises
        McpServerError and marks the connection broken. ``refusals``: the server's JSON-RPC errors (other than a
        closed connection) come back as McpError, not as a failure of the server."""
        if self.broken:
            request.close()
            raise McpServerError(f"{self.label} failed earlier; the env starts a new one at the next reset")
        future = asyncio.run_coroutine_threadsafe(self._guarded(request, timeout, what, refusals), self._loop)
        try:
            return future.result()
        except McpServerError:
            self.broken = True
            raise

    async def _guarded(self, request: Coroutine[Any, Any, Any], timeout: float, what: str, refusals: bool) -> Any:
        """Await ``request`` unless the session task ends first (the transport failed) or ``timeout`` passes."""
        call = asyncio.ensure_future(request)
        watched = {call} if self._holder is None else {call, self._holder}
        done, _ = await asyncio.wait(watched, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if call not in done:
            call.cancel()
            if self._holder is not None and self._holder.done():
                exc = self._holder.exception() if not self._holder.cancelled() else None
                raise McpServerError(f"{self.label} stopped while asked to {what}: {_reason(exc) if exc else 'ended'}")
            raise McpServerError(f"{self.label} did not {what} within {timeout:g} s")
        if (exc := call.exception()) is not None:
            from mcp import McpError, types

            if isinstance(exc, McpServerError):
                raise exc
            if refusals and isinstance(exc, McpError) and exc.error.code != types.CONNECTION_CLOSED:
                raise exc
            raise McpServerError(f"{self.label} failed to {what}: {_reason(exc)}") from exc
        return call.result()
