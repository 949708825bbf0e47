"""The MCP server's stdio transport, bounded: one message per line, at most `MAX_MESSAGE_BYTES` read per line,
and a JSON-RPC error answered for every line that is not a message.

The mcp package's own stdio transport reads a whole line whatever its length and drops a line it cannot parse
without answering. Here a line longer than the limit is skipped as it streams in (never held in memory) and
answered with *Invalid Request* (-32600); a line that is not JSON is answered with *Parse error* (-32700), and
JSON that is not a JSON-RPC message with *Invalid Request*, as JSON-RPC 2.0 asks. The protocol's writer (the
mcp package's, which also keeps stray output of native code off stdout) sends both answers and replies.
"""
from __future__ import annotations

import sys

MAX_MESSAGE_BYTES = 1 << 20  # one JSON-RPC message; a tool's arguments are a few paths and options
_OVERSIZE = "\x00memlens: line over the size limit\n"  # stands for a skipped line; never valid JSON
_CHUNK = 1 << 16


class BoundedLines:
    """`async for line in BoundedLines(binary_stream)`: its lines as text (UTF-8, bad bytes replaced), each
    line longer than `limit` bytes replaced by a marker after being read through and discarded."""

    def __init__(self, stream, limit: int = MAX_MESSAGE_BYTES):
        self.stream = stream
        self.limit = limit

    def _next_line(self) -> str | None:
        line = self.stream.readline(self.limit + 1)
        if not line:
            return None
        if len(line) > self.limit and not line.endswith(b"\n"):
            while True:  # read the rest of the line through, a chunk at a time
                rest = self.stream.readline(_CHUNK)
                if not rest or rest.endswith(b"\n"):
                    break
            return _OVERSIZE
        return line.decode("utf-8", errors="replace")

    def __aiter__(self):
        return self

    async def __anext__(self) -> str:
        import anyio
        line = await anyio.to_thread.run_sync(self._next_line)
        if line is None:
            raise StopAsyncIteration
        return line


def error_reply(exc: Exception):
    """The JSON-RPC error answering a line the transport could not turn into a message (`exc`, the parse or
    validation error), with the request's id when the line was a JSON object that had one."""
    import mcp_types as types
    from mcp.shared.message import SessionMessage

    try:
        first = exc.errors()[0]  # a pydantic ValidationError, as the mcp transport raises
    except Exception:  # noqa: BLE001 - any other failure to read a line is answered as a parse error
        first = {"type": "json_invalid", "input": None}
    msg_id, code, message = None, types.PARSE_ERROR, "Parse error: the line is not JSON"
    if first.get("input") == _OVERSIZE:
        code, message = types.INVALID_REQUEST, f"Invalid Request: a message may be at most {MAX_MESSAGE_BYTES} bytes"
    elif first.get("type") != "json_invalid":
        code, message = types.INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 message"
        doc = first.get("input")
        if isinstance(doc, dict) and isinstance(doc.get("id"), (str, int)) and not isinstance(doc["id"], bool):
            msg_id = doc["id"]
    return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=msg_id,
                                             error=types.ErrorData(code=code, message=message)))


async def serve_stdio(lowlevel_server) -> None:
    """Run `lowlevel_server` (an mcp ``Server``) over stdin/stdout until stdin closes, answering every line
    that is not a message with a JSON-RPC error."""
    import anyio
    from mcp.server.stdio import stdio_server

    async with stdio_server(stdin=BoundedLines(sys.stdin.buffer)) as (read_stream, write_stream):
        to_server, from_transport = anyio.create_memory_object_stream(0)

        async def sort_lines():
            async with to_server:
                async for item in read_stream:
                    if isinstance(item, Exception):
                        await write_stream.send(error_reply(item))
                    else:
                        await to_server.send(item)

        async with anyio.create_task_group() as tg:
            tg.start_soon(sort_lines)
            await lowlevel_server.run(from_transport, write_stream,
                                      lowlevel_server.create_initialization_options())
