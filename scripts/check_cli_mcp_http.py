#!/usr/bin/env python3
"""Each pinned agent CLI (Claude Code, Codex, Gemini CLI) with the broker's
MCP server given as a streamable HTTP URL, the way its provider writes it:
offline (a network namespace with only loopback), the scripted model
(tests/model/scripted_model.py) asking for one `echo` call, and
server-everything's streamable HTTP transport serving it at
http://127.0.0.1:3130/mcp (the broker's address inside a sandbox). Every
HTTP request the server gets is logged (method, path, status, JSON-RPC
methods), so a CLI's probes show.

The configuration files, environment and command line come from the
provider code itself (`cargo run -p substrat-provider --example
turn_setup`); only the paths of the program inside the sandbox are mapped
to the host's.

Usage: check_cli_mcp_http.py [--cache DIR] [CLI...]
  DIR holds agents/npm and peers/npm (default: REPO/.cache). Re-runs itself
  under `unshare -rn` unless already in a namespace of its own.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORT = 3130
URL = f"http://127.0.0.1:{PORT}/mcp"
PROMPT = "GO over HTTP"
# Where each CLI's provider binds its program (PROGRAM_DIR), on the host.
PROGRAMS = {
    "claude": "@anthropic-ai/claude-code",
    "codex": "@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl",
    "gemini": "@google/gemini-cli",
}
CONFIG_DIR = "/run/substrat/provider-config"
PROGRAM_DIR = "/run/substrat/provider"

# Logs every request the server gets, at its start and its end, with the
# JSON-RPC methods of its body (read as node's parser pushes it).
REQUEST_LOG = r"""
const http = require('http');
const push = http.IncomingMessage.prototype.push;
http.IncomingMessage.prototype.push = function (chunk, enc) {
  if (chunk) (this.__body ||= []).push(Buffer.from(chunk));
  return push.call(this, chunk, enc);
};
const emit = http.Server.prototype.emit;
const log = (o) => process.stderr.write('REQ ' + JSON.stringify(o) + '\n');
http.Server.prototype.emit = function (ev, req, res) {
  if (ev === 'request') {
    const start = Date.now();
    const what = {method: req.method, url: req.url,
      accept: req.headers['accept'], session: !!req.headers['mcp-session-id'],
      protocol: req.headers['mcp-protocol-version'] || null,
      authorization: !!req.headers['authorization'],
      agent: req.headers['user-agent'] || null};
    log({t: start, event: 'open', ...what});
    if (req.method === 'GET' && process.env.GET_405 === '1') {
      // A server without the standalone SSE stream (the specification
      // allows 405 Method Not Allowed).
      res.on('close', () => log({t: Date.now(), event: 'close', status: 405, ...what}));
      res.writeHead(405, {allow: 'POST, DELETE'}).end();
      return true;
    }
    res.on('close', () => {
      let rpc = null;
      const text = Buffer.concat(req.__body || []).toString();
      try {
        rpc = [].concat(JSON.parse(text)).map((m) =>
          (m.method || (m.id !== undefined ? 'response' : '?')) +
          (m.params && m.params.protocolVersion ? ' ' + m.params.protocolVersion : ''));
      } catch (e) {}
      log({t: Date.now(), event: 'close', ms: Date.now() - start, status: res.statusCode,
        type: res.getHeader('content-type') || null, rpc, ...what});
    });
  }
  return emit.apply(this, arguments);
};
"""


def isolate():
    """Re-run in new user and network namespaces: loopback only."""
    if os.environ.get("CHECK_CLI_MCP_HTTP_NS") == "1":
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        return
    env = dict(os.environ, CHECK_CLI_MCP_HTTP_NS="1")
    os.execvpe("unshare", ["unshare", "-rn", "--", sys.executable, *sys.argv], env)


def wait_for(what, seconds, done):
    start = time.time()
    while not done():
        if time.time() - start > seconds:
            raise SystemExit(f"check: timed out waiting until {what}")
        time.sleep(0.05)


def turn_setup(cli, home, ws, model_url):
    out = subprocess.run(
        ["cargo", "run", "-q", "-p", "substrat-provider", "--example", "turn_setup", "--",
         cli, home, ws, model_url, URL, "echo", PROMPT],
        cwd=REPO, capture_output=True, text=True, check=True,
        env=dict(os.environ, CARGO_INCREMENTAL="0"))
    return json.loads(out.stdout)


def one_cli(cli, cache, root, no_server, get_405):
    modules = os.path.join(cache, "agents/npm/node_modules")
    everything = os.path.join(
        cache, "peers/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
    home, ws, config = (os.path.join(root, d) for d in ("home", "ws", "provider-config"))
    for d in (home, ws, config):
        os.makedirs(d)
    preload = os.path.join(root, "request-log.cjs")
    with open(preload, "w") as f:
        f.write(REQUEST_LOG)
    server_log = open(os.path.join(root, "server.log"), "w+")
    server = subprocess.Popen(
        ["node", "-r", preload, everything, "streamableHttp"] if not no_server else ["true"],
        env=dict(os.environ, PORT=str(PORT), GET_405="1" if get_405 else "0"), stdout=server_log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL)
    script = os.path.join(root, "script.json")
    with open(script, "w") as f:
        json.dump([{"when": PROMPT, "calls": [{"tool": "echo", "args": {"message": "over http"}}],
                    "final": "all done"}], f)
    model_log = os.path.join(root, "model.log")
    model = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "tests/model/scripted_model.py"),
         "--script", script, "--log", model_log],
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        port = int(model.stdout.readline().split()[1])
        if not no_server:
            wait_for("the MCP server listens", 30,
                     lambda: "listening on port" in open(server_log.name).read())
        setup = turn_setup(cli, home, ws, f"http://127.0.0.1:{port}")
        for f in setup["files"]:
            path = f["inside"].replace(CONFIG_DIR, config)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as out:
                out.write(f["contents"])
        program = os.path.join(modules, PROGRAMS[cli])
        argv = [a.replace(CONFIG_DIR, config).replace(PROGRAM_DIR, program)
                for a in setup["argv"]]
        env = {"PATH": os.environ["PATH"], "HOME": home, "LANG": "C.UTF-8"}
        env.update(dict(setup["env"]))
        start = time.time()
        run = subprocess.run(argv, cwd=ws, env=env, stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=180)
        took = time.time() - start
        for name, text in (("stdout", run.stdout), ("stderr", run.stderr)):
            with open(os.path.join(root, f"cli.{name}"), "w") as f:
                f.write(text)
    finally:
        for p in (server, model):
            p.kill()
            p.wait()
    server_log.seek(0)
    requests = [json.loads(l[4:]) for l in server_log.read().splitlines() if l.startswith("REQ ")]
    return setup, run, took, start, requests


def echoed(stdout):
    """Whether the stream holds the echo tool's result from the server."""
    return "Echo: over http" in stdout


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cache", default=os.path.join(REPO, ".cache"))
    parser.add_argument("--keep", action="store_true", help="keep the temporary directories")
    parser.add_argument("--no-server", action="store_true",
                        help="start no MCP server: what each CLI does when the URL refuses")
    parser.add_argument("--get-405", action="store_true",
                        help="answer GET (the standalone SSE stream) with 405")
    parser.add_argument("clis", nargs="*", default=list(PROGRAMS))
    args = parser.parse_args()
    isolate()
    failed = False
    for cli in args.clis:
        # Not under /tmp: Codex refuses its helper binaries there.
        root = tempfile.mkdtemp(prefix=f"cli-mcp-http-{cli}-", dir=os.path.join(REPO, "target"))
        setup, run, took, start, requests = one_cli(cli, args.cache, root, args.no_server, args.get_405)
        ok = run.returncode == 0 and echoed(run.stdout) and any(
            "tools/call" in (r.get("rpc") or []) for r in requests)
        print(f"== {cli}: {'OK' if ok else 'FAILED'} in {took:.2f} s (exit {run.returncode})")
        failed |= not ok
        for f in setup["files"]:
            if "mcp" in f["contents"].lower():
                print(f"-- {f['inside']}\n{f['contents']}")
        for r in requests:
            if r["event"] == "close" or r["method"] == "GET":
                at = (r["t"] - start * 1000) / 1000
                print(f"   +{at:6.2f} s {r['event']:5} {r['method']} {r['url']} -> {r.get('status')} "
                      f"{r.get('type') or ''} rpc={r.get('rpc')} ms={r.get('ms')} "
                      f"session={r['session']} proto={r['protocol']} agent={r['agent']}")
        tail = [l for l in run.stdout.splitlines() if "over http" in l.lower()][:3]
        for line in tail:
            print(f"   stream: {line[:300]}")
        if run.stderr.strip():
            print("   stderr:", run.stderr[-3000:])
        if not ok:
            print("   stdout:", run.stdout[-3000:])
        if args.keep:
            print(f"   kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
