"""A loopback server speaking the part of the Hugging Face Hub HTTP API that huggingface_hub's
download path calls, serving repos built in the test (synthetic GGUF shard sets).

Endpoints: GET /api/models/{repo}/revision/{rev} (repo info), GET /api/models/{repo}/tree/{rev}
(recursive listing with sizes and LFS sha256), HEAD/GET /{repo}/resolve/{rev}/{path} (file
metadata headers, bytes, Range). Faults for tests: gated repos (401 without a token), repos
whose API answers one HTTP status, a one-shot connection cut after N bytes of a file, corrupted
bytes, a listed size larger than the file (for disk-space refusals), and an HTML sign-in page for
every request. ``prefix`` mounts the hub under a path, as an intranet mirror often is.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse


@dataclasses.dataclass
class HubFile:
    data: bytes
    listed_size: int | None = None  # what the listing claims (defaults to len(data))
    corrupt: bool = False  # serve altered bytes (the listing keeps the true sha256)
    cut_after: int | None = None  # close the connection after this many bytes, once
    cut_always: bool = False  # ...on every request that reaches that byte, not once
    slow: float = 0.0  # seconds of pause per MiB sent (to interrupt a download mid-way)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def git_oid(self) -> str:
        return hashlib.sha1(b"blob %d\0" % len(self.data) + self.data).hexdigest()


@dataclasses.dataclass
class HubRepo:
    files: dict[str, HubFile]
    commit: str = "0123456789abcdef0123456789abcdef01234567"
    gated: bool = False
    status: int | None = None  # the API answers this HTTP status for the repo (a broken mirror)


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, HubRepo] = {}
        self.requests: list[tuple[str, str, dict]] = []  # method, path, headers
        self.token = "hf_test_token"
        self.prefix = ""  # e.g. "/mirror": every path starts with it
        self.login_page = False  # answer every request with an HTML page (a captive portal, a proxy's sign-in)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                hub.handle(self, head=True)

            def do_GET(self) -> None:
                hub.handle(self, head=False)

        class Server(ThreadingHTTPServer):
            def handle_error(self, request, client_address) -> None:  # clients that hang up mid-file are the point
                import sys

                if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
                    super().handle_error(request, client_address)

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def add_repo(self, repo_id: str, files: dict[str, bytes | HubFile], **options) -> HubRepo:
        repo = HubRepo({p: f if isinstance(f, HubFile) else HubFile(f) for p, f in files.items()}, **options)
        self.repos[repo_id] = repo
        return repo

    def add_folder(self, repo_id: str, folder: Path, prefix: str = "", **options) -> HubRepo:
        files = {f"{prefix}{p.name}": p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
        return self.add_repo(repo_id, files, **options)

    # -- protocol

    def _send(self, h: BaseHTTPRequestHandler, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False) -> None:
        h.send_response(status)
        for k, v in (headers or {}).items():
            h.send_header(k, str(v))
        h.send_header("Content-Length", str(len(body)) if not (headers and "Content-Length" in headers) else headers["Content-Length"])
        h.end_headers()
        if not head and body:
            h.wfile.write(body)

    def _error(self, h, status: int, code: str, message: str, head: bool) -> None:
        body = json.dumps({"error": message}).encode()
        self._send(h, status, body, {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"}, head)

    def _repo(self, h, repo_id: str, head: bool) -> HubRepo | None:
        repo = self.repos.get(repo_id)
        if repo is None:
            self._error(h, 404, "RepoNotFound", "Repository not found", head)
            return None
        if repo.gated and h.headers.get("Authorization") != f"Bearer {self.token}":
            self._error(h, 401, "GatedRepo", "Access to this model is restricted; you must be authenticated", head)
            return None
        if repo.status:
            self._error(h, repo.status, "Broken", "the mirror failed", head)
            return None
        return repo

    def _ms_json(self, h, data, head: bool, status: int = 200) -> None:
        body = json.dumps({"Code": status, "Success": status == 200, "Data": data, "Message": "" if status == 200 else "error"}).encode()
        self._send(h, status, body, {"Content-Type": "application/json"}, head)

    def handle_modelscope(self, h, path: str, query: dict, head: bool) -> bool:
        """ModelScope's legacy API as modelscope-hub calls it: repo info, file list, file bytes."""
        m = re.fullmatch(r"/api/v1/models/([^/]+/[^/]+)(/repo/files|/repo|/revisions)?", path)
        if not m:
            return False
        repo = self.repos.get(m[1])
        if repo is None:
            self._ms_json(h, None, head, status=404)
            return True
        if repo.gated and h.headers.get("Authorization") != f"Bearer {self.token}" and self.token not in h.headers.get("Cookie", ""):
            self._ms_json(h, None, head, status=401)
            return True
        if repo.status:
            self._ms_json(h, None, head, status=repo.status)
            return True
        if m[2] is None:
            self._ms_json(h, {"Id": 1, "Path": m[1].split("/")[0], "Name": m[1].split("/")[1], "Revision": repo.commit}, head)
        elif m[2] == "/revisions":
            self._ms_json(h, {"RevisionMap": {"Branches": [{"Revision": "master"}], "Tags": []}}, head)
        elif m[2] == "/repo/files":
            root = query.get("Root", [""])[0]
            entries = []
            for p, f in sorted(repo.files.items()):
                if root and not p.startswith(root.rstrip("/") + "/"):
                    continue
                size = f.listed_size if f.listed_size is not None else len(f.data)
                entries.append({"Name": p.rsplit("/", 1)[-1], "Path": p, "Type": "blob", "Size": size,
                                "Sha256": f.sha256, "Revision": repo.commit, "IsLFS": True})
            self._ms_json(h, {"Files": entries}, head)
        else:
            self.send_file(h, repo, query.get("FilePath", [""])[0], head)
        return True

    def send_file(self, h, repo: HubRepo, name: str, head: bool) -> None:
        f = repo.files.get(name)
        if f is None:
            self._error(h, 404, "EntryNotFound", "Entry not found", head)
            return
        data = bytes(b ^ 0xFF for b in f.data[:64]) + f.data[64:] if f.corrupt else f.data
        start = 0
        rng = h.headers.get("Range")
        if rng:
            start = int(re.match(r"bytes=(\d+)-", rng)[1])
        body = data[start:]
        headers = {
            "X-Repo-Commit": repo.commit, "X-Linked-Etag": f'"{f.sha256}"', "ETag": f'"{f.git_oid}"',
            "X-Linked-Size": len(f.data), "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream",
            "Content-Length": len(body),
        }
        if head:
            self._send(h, 200, b"", dict(headers, **{"Content-Length": len(data)}), head=True)
            return
        status = 200
        if rng:
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, str(v))
        h.end_headers()
        if f.cut_after is not None and (start < f.cut_after or f.cut_always):
            h.wfile.write(body[: max(0, f.cut_after - start)])
            h.wfile.flush()
            if not f.cut_always:
                f.cut_after = None  # one-shot
            h.close_connection = True
            try:
                h.connection.shutdown(2)
            except OSError:
                pass
            return
        step = 1 << 20
        for i in range(0, len(body), step):
            h.wfile.write(body[i : i + step])
            if f.slow:
                h.wfile.flush()
                time.sleep(f.slow)

    def handle(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        url = urlparse(h.path)
        path = unquote(url.path)
        self.requests.append(("HEAD" if head else "GET", path, dict(h.headers)))
        if self.login_page:
            self._send(h, 200, b"<html><body>Please sign in</body></html>", {"Content-Type": "text/html"}, head)
            return
        if self.prefix:
            if not path.startswith(self.prefix + "/"):
                self._error(h, 404, "NotFound", f"{path} is outside {self.prefix}", head)
                return
            path = path[len(self.prefix):]
        if self.handle_modelscope(h, path, parse_qs(url.query), head):
            return
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        if m:
            repo = self._repo(h, m[1], head)
            if repo:
                body = json.dumps({"id": m[1], "modelId": m[1], "sha": repo.commit, "private": False, "gated": repo.gated,
                                   "siblings": [{"rfilename": p} for p in sorted(repo.files)]}).encode()
                self._send(h, 200, body, {"Content-Type": "application/json"}, head)
            return
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", path)
        if m:
            repo = self._repo(h, m[1], head)
            if repo:
                entries, dirs = [], set()
                for p, f in sorted(repo.files.items()):
                    parts = p.split("/")
                    for i in range(1, len(parts)):
                        dirs.add("/".join(parts[:i]))
                    size = f.listed_size if f.listed_size is not None else len(f.data)
                    entries.append({"type": "file", "oid": f.git_oid, "size": size, "path": p,
                                    "lfs": {"oid": f.sha256, "size": size, "pointerSize": 134}})
                entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": d} for d in sorted(dirs)]
                self._send(h, 200, json.dumps(entries).encode(), {"Content-Type": "application/json"}, head)
            return
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m:
            repo = self._repo(h, m[1], head)
            if repo is None:
                return
            self.send_file(h, repo, m[3], head)
            return
        self._error(h, 404, "NotFound", f"no route for {path}", head)
