"""An agent's broker socket spoken to directly (JSON-RPC lines, as the
relay does): what the agent's own tool calls would do."""

import json
import socket


class Unknown(Exception):
    """The call may or may not have taken effect (timeout, connection lost
    after the request was written)."""


class Refused(Exception):
    """The call did not reach the broker (nothing listens on the socket)."""


def call_tool(path, tool, arguments, timeout=5.0):
    """The tool's result as (is_error, parsed JSON text). Raises Refused when
    the request was never written, Unknown when it was but no answer came."""
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(str(path))
        except OSError as e:
            raise Refused(f"connect {path}: {e}") from None
        f = sock.makefile("rwb")

        def send(obj):
            f.write((json.dumps(obj) + "\n").encode())
            f.flush()

        def answer(want_id):
            while True:
                line = f.readline()
                if not line:
                    raise OSError("connection closed")
                msg = json.loads(line)
                if msg.get("id") == want_id:
                    return msg

        try:
            send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "nemesis", "version": "1"}}})
            init = answer(1)
        except (OSError, ValueError) as e:
            # Nothing asked of the tool yet: a definite failure.
            raise Refused(f"initialize: {e}") from None
        if "error" in init:
            raise Refused(f"initialize: {init['error']}")
        try:
            send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": tool, "arguments": arguments}})
            msg = answer(2)
        except (OSError, ValueError) as e:
            raise Unknown(f"{tool}: {e}") from None
        if "error" in msg:
            return True, {"rpc_error": msg["error"]}
        result = msg.get("result", {})
        text = "".join(c.get("text", "") for c in result.get("content", []) if c.get("type") == "text")
        try:
            body = json.loads(text)
        except ValueError:
            body = {"text": text}
        return bool(result.get("isError")), body
    finally:
        sock.close()


def serves(path, timeout=0.5):
    """Whether a live broker answers `initialize` on the socket."""
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
        sock.sendall((json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "nemesis-probe", "version": "1"}}}) + "\n").encode())
        line = sock.makefile("rb").readline()
        return bool(line) and "result" in json.loads(line)
    except (OSError, ValueError):
        return False
    finally:
        sock.close()
