"""A stand-in for the Hugging Face hub, for ``hpc-llm model fetch``: a FAKE, because the hub
cannot be reached from this machine (only package registries are).

It serves, over real HTTP on 127.0.0.1, the three calls huggingface_hub's own
``snapshot_download`` makes (huggingface_hub 0.33; ``HF_ENDPOINT`` points it here):

- ``GET /api/models/<repo>/revision/<rev>``: the commit sha and the file list (``siblings``);
- ``HEAD /<repo>/resolve/<rev>/<path>``: ``X-Repo-Commit``, ``ETag``, ``Content-Length``;
- ``GET  /<repo>/resolve/<rev>/<path>``: the bytes.

Repos are directories on disk (``repos[repo_id] = dir``); a repo listed in ``gated`` answers
file requests with 403 and ``X-Error-Code: GatedRepo``, an unknown one 404 ``RepoNotFound``,
as the hub does. ``requests`` records every path asked for.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, Path] = {}
        self.gated: set[str] = set()
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                pass

            def do_GET(self) -> None:  # noqa: N802
                hub._answer(self, body=True)

            def do_HEAD(self) -> None:  # noqa: N802
                hub._answer(self, body=False)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        """Stop serving and release the port: connections are refused from now on."""
        self._server.shutdown()
        self._server.server_close()

    def commit(self, repo_id: str) -> str:
        """A commit sha standing for the repo's current content."""
        h = hashlib.sha1()
        for f in self.files(repo_id):
            h.update(f.encode() + (self.repos[repo_id] / f).read_bytes())
        return h.hexdigest()

    def files(self, repo_id: str) -> list[str]:
        root = self.repos[repo_id]
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())

    def _answer(self, req: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlparse(req.path).path)
        self.requests.append(f"{req.command} {path}")
        if path.startswith("/api/models/"):
            repo_id, _, _rev = path.removeprefix("/api/models/").partition("/revision/")
            if repo_id not in self.repos:
                return self._error(req, 404, "RepoNotFound")
            info = {
                "id": repo_id,
                "sha": self.commit(repo_id),
                "siblings": [{"rfilename": f} for f in self.files(repo_id)],
                "private": False,
                "gated": "manual" if repo_id in self.gated else False,
            }
            return self._send(req, 200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body)
        repo_id, sep, rest = path.lstrip("/").partition("/resolve/")
        if not sep or repo_id not in self.repos:
            return self._error(req, 404, "RepoNotFound")
        if repo_id in self.gated:
            return self._error(req, 403, "GatedRepo")
        _rev, _, name = rest.partition("/")
        f = self.repos[repo_id] / name
        if not f.is_file():
            return self._error(req, 404, "EntryNotFound")
        data = f.read_bytes()
        headers = {
            "X-Repo-Commit": self.commit(repo_id),
            "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
            "Content-Type": "application/octet-stream",
        }
        self._send(req, 200, data, headers, body)

    def _error(self, req: BaseHTTPRequestHandler, status: int, code: str) -> None:
        msg = json.dumps({"error": code}).encode()
        self._send(req, status, msg, {"X-Error-Code": code, "X-Error-Message": code}, True)

    @staticmethod
    def _send(req: BaseHTTPRequestHandler, status: int, data: bytes, headers: dict[str, str], body: bool) -> None:
        req.send_response(status)
        for k, v in headers.items():
            req.send_header(k, v)
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        if body:
            req.wfile.write(data)
