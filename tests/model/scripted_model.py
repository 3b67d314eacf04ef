#!/usr/bin/env python3
"""A scripted model server for the agent CLIs' tests: the Anthropic
Messages API, the OpenAI Responses API and Gemini's streamGenerateContent,
each answered as server-sent events from a script, never from a model.

Stateless per request (the CLIs make side requests and replay the whole
history on resume): the answer depends only on the request. The script is
a JSON list of rules:

    [{"when": "START lead", "calls": [{"tool": "spawn_agent", "args": {...}}],
      "final": "spawned"}]

The request's user messages are searched from the newest to the oldest for
the first that contains a rule's `when`; that message starts the turn. The
tool results after it say how far the turn has come: with n of them, the
answer is the rule's call n (the tool named by the suffix of a tool the
request offers: `mcp__substrat__send_message`, `mcp_substrat_send_message`,
or `send_message` in Codex's `mcp__substrat` namespace), or, once every
call is made, its `final` text. A request no rule matches gets the text
`no script matched` (and is logged as such), so a CLI never waits. A
rule's `slow_step` and `slow_s` hold the answer to that step back (a test
stops the daemon meanwhile); rules are tried in their order, so a rule for
a re-run's note comes before the rule of the prompt it repeats. A rule's
`status` (with `error`, its message) answers every request it matches
with that HTTP status and the API's error body instead.

Each request is logged as one JSON line (path, model, the credentials it
carried, the rule and step chosen) to --log, so a test can check what the
gateway forwarded.

Usage: scripted_model.py --script FILE --log FILE [--port N]
Prints `listening PORT` once it accepts connections.
"""

import argparse
import json
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()


def texts_of(content):
    """The text pieces of one message's content, whatever the API's shape."""
    if isinstance(content, str):
        return [content]
    out = []
    if isinstance(content, list):
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict):
                for key in ("text",):
                    if isinstance(part.get(key), str):
                        out.append(part[key])
    return out


class Conversation:
    """A request's history reduced to what the script needs: the user
    messages with text (in order, with their position) and the positions of
    tool results; and the tools offered."""

    def __init__(self):
        self.prompts = []  # (position, text)
        self.results = []  # positions
        self.tools = []  # names as the CLI offers them
        self.code_mode = False  # Codex's exec tool offered
        self.position = 0

    def prompt(self, text):
        self.prompts.append((self.position, text))
        self.position += 1

    def result(self):
        self.results.append(self.position)
        self.position += 1

    def other(self):
        self.position += 1


def anthropic_conversation(body):
    conv = Conversation()
    for message in body.get("messages", []):
        content = message.get("content")
        parts = content if isinstance(content, list) else [content]
        if message.get("role") == "user":
            if any(isinstance(p, dict) and p.get("type") == "tool_result" for p in parts):
                conv.result()
            else:
                conv.prompt("\n".join(texts_of(content)))
        else:
            conv.other()
    conv.tools = [t.get("name", "") for t in body.get("tools", []) if isinstance(t, dict)]
    return conv


def openai_conversation(body):
    conv = Conversation()
    items = body.get("input", [])
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    for item in items:
        kind = item.get("type", "message")
        if kind == "message" and item.get("role") == "user":
            conv.prompt("\n".join(texts_of(item.get("content"))))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            conv.result()
        else:
            conv.other()
    # Codex offers tools in `tools` or, for models it runs in code mode,
    # in an `additional_tools` input item: one `exec` tool whose
    # JavaScript calls the MCP tools (`tools.mcp__substrat__send_message`).
    offered = list(body.get("tools", []))
    for item in items:
        if item.get("type") == "additional_tools":
            offered += item.get("tools", [])
    for tool in offered:
        if tool.get("type") == "namespace":
            for inner in tool.get("tools", []):
                conv.tools.append((tool.get("name", ""), inner.get("name", "")))
        elif "name" in tool:
            conv.tools.append(("", tool["name"]))
    conv.code_mode = ("functions", "exec") in conv.tools
    return conv


def gemini_conversation(body):
    conv = Conversation()
    for content in body.get("contents", []):
        parts = content.get("parts", [])
        if content.get("role") == "user":
            if any("functionResponse" in p for p in parts if isinstance(p, dict)):
                conv.result()
            else:
                conv.prompt("\n".join(texts_of(parts)))
        else:
            conv.other()
    for group in body.get("tools", []):
        for decl in group.get("functionDeclarations", []):
            conv.tools.append(decl.get("name", ""))
    return conv


def tool_kinds(api, body):
    """Every tool the request offers, as `kind:name` (Anthropic: type or
    `custom`; OpenAI: type, namespaces opened; Gemini: each tool's keys,
    function declarations by name), so a test sees what a CLI offers."""
    kinds = []
    tools = body.get("tools", [])
    if api == "openai":
        for item in body.get("input", []) if isinstance(body.get("input"), list) else []:
            if isinstance(item, dict) and item.get("type") == "additional_tools":
                tools = tools + item.get("tools", [])
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        if api == "gemini":
            for key, value in tool.items():
                if key in ("functionDeclarations", "function_declarations"):
                    kinds += [f"function:{d.get('name', '')}" for d in value or []]
                else:
                    kinds.append(f"{key}:")
        elif tool.get("type") == "namespace":
            kinds += [f"{t.get('type', '')}:{tool.get('name', '')}.{t.get('name', '')}"
                      for t in tool.get("tools", [])]
        else:
            kinds.append(f"{tool.get('type', 'custom')}:{tool.get('name', '')}")
    return kinds


def decide(script, conv):
    """(rule index, step, call or None, final text)."""
    for position, text in reversed(conv.prompts):
        for index, rule in enumerate(script):
            if rule["when"] in text:
                step = sum(1 for r in conv.results if r > position)
                calls = rule.get("calls", [])
                if step < len(calls):
                    return index, step, calls[step], None
                return index, step, None, rule.get("final", "done")
    return None, 0, None, "no script matched"


def tool_named(offered, tool):
    """The offered name that ends with the script's tool name."""
    for name in offered:
        if isinstance(name, tuple):
            if name[1] == tool or name[1].endswith("_" + tool):
                return name
        elif name == tool or name.endswith("_" + tool):
            return name
    return None


def sse(handler, events):
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Cache-Control", "no-cache")
    handler.send_header("Connection", "close")
    handler.end_headers()
    for name, data in events:
        if name:
            handler.wfile.write(f"event: {name}\n".encode())
        handler.wfile.write(f"data: {json.dumps(data)}\n\n".encode())
        handler.wfile.flush()
    handler.close_connection = True


def anthropic_events(body, call, text):
    model = body.get("model", "scripted")
    msg_id = "msg_" + uuid.uuid4().hex[:12]
    events = [("message_start", {"type": "message_start", "message": {
        "id": msg_id, "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 1}}})]
    if call is not None:
        name, args = call
        events += [
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {
                "type": "tool_use", "id": "toolu_" + uuid.uuid4().hex[:12], "name": name, "input": {}}}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {
                "type": "input_json_delta", "partial_json": json.dumps(args)}}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ]
        stop = "tool_use"
    else:
        events += [
            ("content_block_start", {"type": "content_block_start", "index": 0,
                                     "content_block": {"type": "text", "text": ""}}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                     "delta": {"type": "text_delta", "text": text}}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ]
        stop = "end_turn"
    events += [
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                           "usage": {"output_tokens": 7}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    return events


# The namespace of a call made through Codex's exec tool (code mode).
CODE_MODE = "<code mode>"


def exec_source(tool, args):
    """Codex code mode: JavaScript that finds the nested tool of the
    script's name (a built-in one, or an MCP tool ending in it), calls it,
    returns its result."""
    return (f"const want = {json.dumps(tool)};\n"
            f"const name = Object.keys(tools).find(n => n === want || "
            f"(n.startsWith('mcp__') && n.endsWith('__' + want)));\n"
            f"if (!name) {{ text('no tool ' + want); }}\n"
            f"else {{ text(JSON.stringify(await tools[name]({json.dumps(args)}))); }}\n")


def openai_events(body, call, text):
    resp_id = "resp_" + uuid.uuid4().hex[:12]
    if call is not None and call[0][0] == CODE_MODE:
        (_, tool), args = call
        item = {"type": "custom_tool_call", "id": "ctc_" + uuid.uuid4().hex[:12],
                "call_id": "call_" + uuid.uuid4().hex[:12], "name": "exec",
                "input": exec_source(tool, args), "status": "completed"}
    elif call is not None:
        (namespace, name), args = call
        item = {"type": "function_call", "id": "fc_" + uuid.uuid4().hex[:12],
                "call_id": "call_" + uuid.uuid4().hex[:12], "name": name,
                "arguments": json.dumps(args), "status": "completed"}
        if namespace:
            item["namespace"] = namespace
    else:
        item = {"type": "message", "id": "msg_" + uuid.uuid4().hex[:12], "role": "assistant",
                "status": "completed", "content": [{"type": "output_text", "text": text, "annotations": []}]}
    usage = {"input_tokens": 12, "input_tokens_details": {"cached_tokens": 0},
             "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 19}
    base = {"id": resp_id, "object": "response", "model": body.get("model", "scripted")}
    events = [("response.created", {"type": "response.created", "sequence_number": 0,
                                    "response": dict(base, status="in_progress", output=[])}),
              ("response.output_item.added", {"type": "response.output_item.added", "sequence_number": 1,
                                              "output_index": 0, "item": dict(item, status="in_progress")})]
    if call is None:
        events.append(("response.output_text.delta", {
            "type": "response.output_text.delta", "sequence_number": 2, "item_id": item["id"],
            "output_index": 0, "content_index": 0, "delta": text}))
    events += [
        ("response.output_item.done", {"type": "response.output_item.done", "sequence_number": 3,
                                       "output_index": 0, "item": item}),
        ("response.completed", {"type": "response.completed", "sequence_number": 4,
                                "response": dict(base, status="completed", output=[item], usage=usage)}),
    ]
    return events


def gemini_events(body, call, text):
    if call is not None:
        name, args = call
        part = {"functionCall": {"name": name, "args": args}}
    else:
        part = {"text": text}
    return [(None, {"candidates": [{"content": {"role": "model", "parts": [part]},
                                    "finishReason": "STOP", "index": 0}],
                    "usageMetadata": {"promptTokenCount": 12, "candidatesTokenCount": 7,
                                      "totalTokenCount": 19}})]


def sample_of(schema):
    """A value of a (Gemini-style, upper-case types) JSON schema."""
    kind = str(schema.get("type", "OBJECT")).upper()
    if kind == "OBJECT":
        return {k: sample_of(v) for k, v in (schema.get("properties") or {}).items()}
    if kind == "ARRAY":
        return []
    if kind == "STRING":
        return (schema.get("enum") or ["scripted"])[0]
    if kind in ("INTEGER", "NUMBER"):
        return 10
    if kind == "BOOLEAN":
        return False
    return None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    script = []
    log_path = None

    def log_message(self, fmt, *args):
        pass

    def record(self, entry):
        if self.log_path:
            with LOCK, open(self.log_path, "a") as log:
                log.write(json.dumps(entry) + "\n")

    def do_POST(self):
        arrived_ms = int(time.time() * 1000)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        path = self.path.split("?")[0]
        if path.endswith("/messages"):
            api, conv = "anthropic", anthropic_conversation(body)
        elif path.endswith("/responses"):
            api, conv = "openai", openai_conversation(body)
        elif ":streamGenerateContent" in path or ":generateContent" in path:
            api, conv = "gemini", gemini_conversation(body)
        else:
            self.record({"path": self.path, "status": 404})
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        schema = (body.get("generationConfig") or {}).get("responseJsonSchema")
        if api == "gemini" and isinstance(schema, dict):
            # A side request (Gemini CLI's model routing) wanting JSON of a
            # schema: answered from the schema, not from the script.
            self.record({"path": self.path, "api": api, "side": True,
                         "x_goog_api_key": self.headers.get("x-goog-api-key"),
                         "arrived_ms": arrived_ms})
            return self.json_answer(gemini_events(body, None, json.dumps(sample_of(schema)))[0][1])
        rule, step, call, text = decide(self.script, conv)
        chosen = None
        if call is not None:
            chosen = tool_named(conv.tools, call["tool"])
            if chosen is None and conv.code_mode:
                chosen = (CODE_MODE, call["tool"])
            if chosen is None:
                call, text = None, f"the script's tool {call['tool']} is not offered"
        self.record({
            "path": self.path, "api": api, "model": body.get("model") or path.split("/")[-1],
            "authorization": self.headers.get("Authorization"),
            "x_api_key": self.headers.get("x-api-key"),
            "x_goog_api_key": self.headers.get("x-goog-api-key"),
            "rule": rule, "step": step, "tool": chosen if call is not None else None,
            "text": text, "tools_offered": len(conv.tools),
            "tool_kinds": tool_kinds(api, body),
            "history": conv.position, "arrived_ms": arrived_ms,
        })
        if rule is not None and "status" in self.script[rule]:
            return self.error_answer(api, self.script[rule])
        if rule is not None and self.script[rule].get("slow_step") == step:
            # Logged first: a test sees the request while its answer waits.
            time.sleep(float(self.script[rule].get("slow_s", 0)))
        answer = (chosen, call["args"]) if call is not None else None
        if api == "anthropic":
            sse(self, anthropic_events(body, answer, text))
        elif api == "openai":
            sse(self, openai_events(body, answer, text))
        elif ":streamGenerateContent" in path:
            sse(self, gemini_events(body, answer, text))
        else:
            self.json_answer(gemini_events(body, answer, text)[0][1])

    def error_answer(self, api, rule):
        """The rule's status, with an error body in the API's shape."""
        status, message = int(rule["status"]), rule.get("error", "scripted error")
        if api == "anthropic":
            body = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
        elif api == "openai":
            body = {"error": {"type": "invalid_request_error", "code": None, "message": message}}
        else:
            body = {"error": {"code": status, "status": "INVALID_ARGUMENT", "message": message}}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def json_answer(self, value):
        data = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.record({"path": self.path, "method": "GET", "status": 404})
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--script", required=True)
    parser.add_argument("--log")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    with open(args.script) as f:
        script = json.load(f)
    if not isinstance(script, list) or not all(isinstance(r, dict) and "when" in r for r in script):
        sys.exit("scripted_model: the script is a list of rules with `when`")
    Handler.script = script
    Handler.log_path = args.log
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print(f"listening {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
