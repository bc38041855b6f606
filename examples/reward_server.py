"""A reference reward service for ``reward: {http: URL}`` (docs/rewards.md): copy it and replace
:func:`score` with your own.

    python examples/reward_server.py --port 8000 --journal scores.jsonl
    # config: reward: {http: "http://127.0.0.1:8000/score"}

It speaks the contract of :mod:`agentrt.rewards.http`: ``POST /score`` with
``{"samples": [{"id", "key", "prompt", "response", "info"}, ...]}`` answers
``{"rewards": [...]}``. Every key it scored is appended to the journal (flushed and fsynced
before the answer leaves), and a key it has seen is answered from the journal without scoring
again: a batch retried after a lost answer, or after this process was killed and restarted,
is never scored twice. ``GET /stats`` counts what this process did; ``GET /health`` is 200.
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def score(prompt: str, response: str, info: dict[str, Any]) -> float:
    """Exact match: 1.0 when the stripped response equals ``info['answer']``."""
    del prompt
    return float(response.strip() == str(info.get("answer", "")).strip())


class Journal:
    """Scored keys and their rewards, persisted as JSON lines (one fsync per batch)."""

    def __init__(self, path: Path | None) -> None:
        self.path, self.lock = path, threading.Lock()
        self.rewards: dict[str, float] = {}
        self.stats = {"requests": 0, "samples": 0, "scored": 0, "cached": 0}
        if path is not None and path.exists():
            for line in path.read_text().splitlines():
                try:
                    row = json.loads(line)
                except ValueError:
                    continue  # a line torn by a kill mid-write: that sample is scored again
                self.rewards[row["key"]] = row["reward"]

    def score_batch(self, samples: list[dict[str, Any]]) -> list[float]:
        with self.lock:
            self.stats["requests"] += 1
            self.stats["samples"] += len(samples)
            rows, out = [], []
            for s in samples:
                key = str(s.get("key") or s["id"])
                if key not in self.rewards:
                    self.rewards[key] = score(s["prompt"], s["response"], s.get("info") or {})
                    rows.append({"key": key, "id": s.get("id"), "reward": self.rewards[key]})
                    self.stats["scored"] += 1
                else:
                    self.stats["cached"] += 1
                out.append(self.rewards[key])
            if rows and self.path is not None:
                with self.path.open("a") as f:
                    f.write("".join(json.dumps(r) + "\n" for r in rows))
                    f.flush()
                    os.fsync(f.fileno())
            return out


def make_handler(journal: Journal) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            if self.path.rstrip("/") != "/score":
                return self._send(404, {"error": f"no route {self.path}; POST /score"})
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                samples = body["samples"]
                assert isinstance(samples, list)
            except (ValueError, KeyError, TypeError, AssertionError):
                return self._send(400, {"error": 'expected {"samples": [{"id", "key", '
                                                 '"prompt", "response", "info"}, ...]}'})
            self._send(200, {"rewards": journal.score_batch(samples)})

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/stats":
                with journal.lock:
                    return self._send(200, {**journal.stats, "journal": len(journal.rewards)})
            self._send(200 if self.path == "/health" else 404, {"ok": self.path == "/health"})

        def _send(self, code: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass  # quiet: one line per request would flood a training log

    return Handler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    ap.add_argument("--journal", type=Path, default=None,
                    help="JSONL of scored keys: dedupe across restarts (default: memory only)")
    args = ap.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), make_handler(Journal(args.journal)))
    host, port = server.server_address[:2]
    print(f"reward server listening on http://{host}:{port}/score", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
