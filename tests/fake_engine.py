#!/usr/bin/env python3
"""A stand-in for an engine's Python (`launch --engine-python`): records what it was started with and, on the node
that serves, answers GET /health on --host/--port as vLLM, SGLang and trtllm-serve do.

Called as `fake_engine.py -m MODULE ARGS...`; writes $FAKE_ENGINE_OUT/node$SLURM_NODEID.json with its argv and
environment. Node 0 serves, the others exit 0 at once. FAKE_ENGINE_MODE: `serve` (default) answers /health once
and exits 0 a moment later; `silent` never answers (until TERM); `fail` exits 3 at once.
"""

from __future__ import annotations

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


class Health(BaseHTTPRequestHandler):
    answered = False

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        Health.answered = self.path == "/health"

    def log_message(self, *args: object) -> None:
        pass


def main() -> int:
    argv = sys.argv[1:]
    node = os.environ.get("SLURM_NODEID", "0")
    Path(os.environ["FAKE_ENGINE_OUT"], f"node{node}.json").write_text(json.dumps({"argv": argv,
                                                                                 "env": dict(os.environ)}))
    mode = os.environ.get("FAKE_ENGINE_MODE", "serve")
    if mode == "fail":
        return 3
    if node != "0":
        return 0
    if mode == "silent":
        time.sleep(300)
        return 0
    server = HTTPServer((option(argv, "--host"), int(option(argv, "--port"))), Health)
    while not Health.answered:
        server.handle_request()
    time.sleep(0.5)  # the script prints its URL line in the meantime
    return 0


if __name__ == "__main__":
    sys.exit(main())
