"""Hugging Face caches built without the network, in the layouts huggingface_hub and datasets read offline, and a
local server that answers as the hub does when it refuses (gated repo, missing revision or repo, bad token).

* model_snapshot: a model folder as huggingface_hub's cache holds a download (models--org--name/blobs/<sha256>,
  snapshots/<commit>/<file> links into blobs, refs/<revision>), optionally with the tree listing huggingface_hub caches
  per commit (which lets it say which files of a snapshot are missing offline);
* dataset_cache: a dataset prepared by the real `datasets` Json builder into HF_DATASETS_CACHE as `load_dataset` of a hub
  repo leaves it (<namespace>___<name>/default/0.0.0/<commit>/), which `load_dataset(repo)` reads with HF_HUB_OFFLINE;
* refusing_hub: HTTP status codes and X-Error-Code headers as the hub sends them (huggingface_hub utils/_http.py
  hf_raise_for_status reads them);
* serving_hub: a model repo served as the hub serves it (repo info, tree listing, resolve with X-Repo-Commit and ETag),
  so snapshot_download's dry run and download run for real.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import threading

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def model_snapshot(cache_dir: str, repo_id: str, folder: str, *, commit: str = COMMIT, revision: str = "main",
                   tree: bool = False, skip: tuple[str, ...] = ()) -> str:
    """Copy the files of `folder` into cache_dir as a downloaded snapshot of repo_id; `skip`: files listed in the tree
    but left out of the snapshot (an interrupted download). Returns the snapshot folder."""
    repo = os.path.join(cache_dir, "models--" + repo_id.replace("/", "--"))
    snap = os.path.join(repo, "snapshots", commit)
    os.makedirs(os.path.join(repo, "blobs"), exist_ok=True)
    os.makedirs(snap, exist_ok=True)
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    with open(os.path.join(repo, "refs", revision), "w") as f:
        f.write(commit)
    entries = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            data = f.read()
        sha = hashlib.sha256(data).hexdigest()
        entries[name] = (len(data), sha)
        if name in skip:
            continue
        with open(os.path.join(repo, "blobs", sha), "wb") as f:
            f.write(data)
        os.symlink(os.path.join("..", "..", "blobs", sha), os.path.join(snap, name))
    if tree:
        from huggingface_hub._tree_cache import TreeCacheEntry, write_tree_cache

        write_tree_cache(repo, commit, {n: TreeCacheEntry(size=size, blob_id=sha[:40], lfs_sha256=sha, lfs_size=size,
                                                          xet_hash=None) for n, (size, sha) in entries.items()})
    return snap


def dataset_cache(datasets_cache: str, repo_id: str, records_file: str, *, commit: str = COMMIT) -> str:
    """Prepare `records_file` (JSON) with datasets' Json builder where `load_dataset(repo_id)` finds it offline."""
    from datasets.packaged_modules.json.json import Json

    namespace, name = repo_id.split("/")
    # Built under the dataset's own name (the Arrow files are named <name>-train.arrow, as a hub load names them),
    # then moved under <namespace>___<name>, the folder a hub repo's prepared dataset lives in.
    builder = Json(cache_dir=datasets_cache, dataset_name=name, config_id="default", hash=commit,
                   data_files={"train": [records_file]})
    builder.download_and_prepare()
    os.rename(os.path.join(datasets_cache, name), os.path.join(datasets_cache, f"{namespace}___{name}"))
    return os.path.join(datasets_cache, f"{namespace}___{name}")


# repo id -> (status, headers) of every answer about it
REFUSALS = {
    "org/gated": (403, {"X-Error-Code": "GatedRepo", "X-Error-Message": "Access to model org/gated is restricted."}),
    "org/no-revision": (404, {"X-Error-Code": "RevisionNotFound", "X-Error-Message": "Invalid rev id: v9"}),
    "org/missing": (404, {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"}),
    "org/bad-token": (401, {"X-Error-Message": "Invalid credentials in Authorization header"}),
}


class _Refuser(http.server.BaseHTTPRequestHandler):
    def _answer(self):
        repo = next((r for r in REFUSALS if f"/{r}/" in self.path or self.path.endswith(f"/{r}")), None)
        status, headers = REFUSALS.get(repo, (404, {"X-Error-Code": "RepoNotFound"}))
        body = b'{"error": "refused"}'
        self.send_response(status)
        for k, v in {**headers, "Content-Type": "application/json", "Content-Length": str(len(body))}.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_POST = _answer

    def log_message(self, *args):
        pass


def refusing_hub():
    """(endpoint URL, server) of a local hub that refuses as REFUSALS says; call server.shutdown() when done."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refuser)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server


class _Server(http.server.BaseHTTPRequestHandler):
    """Repos served as the hub serves them to huggingface_hub: repo info, the tree listing, and HEAD / GET of
    [/datasets]/<repo>/resolve/<revision>/<file> with X-Repo-Commit and the ETag (the file's sha256, as for LFS
    files)."""

    repos: dict = {}  # (api kind: "models" or "datasets", repo id) -> {file name: (bytes, sha256)}

    def _send(self, status: int, body: bytes, headers: dict | None = None):
        self.send_response(status)
        for k, v in {"Content-Length": str(len(body)), **(headers or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _api(self, path: str) -> bool:
        import json

        for (kind, repo_id), files in self.repos.items():
            api = f"/api/{kind}/{repo_id}/"
            if path.startswith(api + "revision/"):
                siblings = [{"rfilename": n} for n in files]
                self._send(200, json.dumps({"id": repo_id, "sha": COMMIT, "siblings": siblings}).encode(),
                           {"Content-Type": "application/json"})
                return True
            if path.startswith(api + "tree/"):
                tree = [{"type": "file", "path": n, "size": len(d), "oid": h[:40],
                         "lfs": {"oid": h, "size": len(d), "pointerSize": 134}} for n, (d, h) in files.items()]
                self._send(200, json.dumps(tree).encode(), {"Content-Type": "application/json"})
                return True
        return False

    def do_GET(self):
        path = self.path.split("?")[0]
        if self._api(path):
            return
        for (kind, repo_id), files in self.repos.items():
            prefix = ("/datasets" if kind == "datasets" else "") + f"/{repo_id}/resolve/"
            if path.startswith(prefix):
                name = path[len(prefix):].split("/", 1)[1]
                if name in files:
                    data, sha = files[name]
                    return self._send(200, data, {"X-Repo-Commit": COMMIT, "ETag": f'"{sha}"',
                                                  "Content-Type": "application/octet-stream"})
                return self._send(404, b"{}", {"X-Error-Code": "EntryNotFound"})
        self._send(404, b"{}", {"X-Error-Code": "RepoNotFound"})

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


def _read(folder: str) -> dict:
    files = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            data = f.read()
        files[name] = (data, hashlib.sha256(data).hexdigest())
    return files


def serving_hub(repo_id: str, folder: str, datasets: dict[str, str] | None = None):
    """(endpoint URL, server) of a local hub serving `folder` as the model repo `repo_id` at COMMIT, and each
    {dataset repo id: folder} of `datasets` as a dataset repo."""
    repos = {("models", repo_id): _read(folder)}
    repos.update({("datasets", r): _read(f) for r, f in (datasets or {}).items()})
    handler = type("Handler", (_Server,), {"repos": repos})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server
