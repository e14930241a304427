"""Hugging Face hub ids (org/name): the local Hugging Face cache, read as `from_pretrained` finds a model offline, the
hub itself through `huggingface_hub` (config.json alone for planning, the model's files for training), and the shipped
presets whose config.json comes from a known hub id (the offline fallback a hint names).

huggingface_hub is imported only where the cache cannot answer (`plan` with a cached config never imports it). Its
errors become one `error:` line with a `hint:` (hub_error): gated and missing repos, missing revisions, a refused token,
no network and offline mode with files missing from the cache.
"""

from __future__ import annotations

import os
import re

from memascend_cli.errors import BadInput

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_SOURCE_ID = re.compile(r"https://huggingface\.co/([\w.-]+/[\w.-]+)/")
_COMMIT = re.compile(r"[0-9a-f]{40}")
# Instruction-tuned and renamed releases share their base model's architecture (config.json up to generation
# settings): Qwen/Qwen2.5-7B-Instruct is Qwen2.5-7B, meta-llama/Meta-Llama-3.1-8B-Instruct is Llama-3.1-8B.
_VARIANT_SUFFIX = re.compile(r"-(instruct|chat|it)(-\d+)?$")

MODEL_PATTERNS = ("model.safetensors", "model-*-of-*.safetensors", "model.safetensors.index.json", "config.json",
                  "generation_config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                  "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja",
                  "chat_template.json")
"""What `train` downloads of a model repo (snapshot_download allow_patterns): the safetensors weights under the names
transformers loads (model.safetensors, or the shards of model.safetensors.index.json), the tokenizer, config and
generation config. Never the .bin/.pth/.onnx/.gguf copies many repos also carry, nor a second safetensors copy in
another layout (Mistral's consolidated.safetensors, Llama's original/)."""


def looks_like_hub_id(text: str) -> bool:
    return bool(_HUB_ID.fullmatch(text)) and not os.path.exists(text)


def hub_cache_dir(env: dict | None = None) -> str:
    """Where huggingface_hub caches models: $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub
    (huggingface_hub constants.py)."""
    env = os.environ if env is None else env
    if env.get("HF_HUB_CACHE"):
        return env["HF_HUB_CACHE"]
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                              "huggingface")
    return os.path.join(home, "hub")


def offline(env: dict | None = None) -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set, as huggingface_hub reads it."""
    env = os.environ if env is None else env
    value = env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in ("1", "ON", "YES", "TRUE")


def cached_snapshot(hub_id: str, revision: str | None = None, env: dict | None = None) -> str | None:
    """The cache snapshot folder `from_pretrained(hub_id, revision=...)` would use offline (refs/<revision> ->
    snapshots/<commit>, or snapshots/<revision> for a commit hash), when it holds a config.json; None otherwise."""
    repo = os.path.join(hub_cache_dir(env), "models--" + hub_id.replace("/", "--"))
    revision = revision or "main"
    commit = revision if _COMMIT.fullmatch(revision) else None
    if commit is None:
        try:
            with open(os.path.join(repo, "refs", revision)) as f:
                commit = f.read().strip()
        except OSError:
            return None
    snapshot = os.path.join(repo, "snapshots", commit)
    return snapshot if os.path.isfile(os.path.join(snapshot, "config.json")) else None


def _base_name(hub_id: str) -> str:
    name = hub_id.split("/")[-1].lower().removeprefix("meta-")
    return _VARIANT_SUFFIX.sub("", name)


def preset_for(hub_id: str, preset_sources: dict[str, str]) -> str | None:
    """The preset whose config.json comes from `hub_id` or its base model ({preset name: its `source` URL})."""
    want = (hub_id.split("/")[0].lower(), _base_name(hub_id))
    for name, source in preset_sources.items():
        m = _SOURCE_ID.match(source or "")
        if m and (m.group(1).split("/")[0].lower(), _base_name(m.group(1))) == want:
            return name
    return None


# --- the hub's errors as one line -------------------------------------------------------------------


def unreachable(exc: BaseException) -> str | None:
    """Why the hub could not be asked (offline mode, no connection), or None for an answer from the hub."""
    import httpx2
    from huggingface_hub.errors import OfflineModeIsEnabled

    seen = exc
    while seen is not None:
        if isinstance(seen, OfflineModeIsEnabled) or "HF_HUB_OFFLINE" in str(seen):
            return "HF_HUB_OFFLINE is set"
        if isinstance(seen, (httpx2.ConnectError, httpx2.TimeoutException, ConnectionError)):
            from huggingface_hub import constants

            return f"no connection to {constants.ENDPOINT}"
        seen = seen.__cause__ or seen.__context__
    return None


def hub_error(exc: BaseException, repo_id: str, revision: str | None, *, what: str, kind: str = "model",
              fallback: str | None = None) -> BadInput:
    """One-line BadInput for a huggingface_hub error while getting `what` (e.g. "config.json") of `repo_id`.
    `fallback`: what works without the hub (the preset with the same architecture), named in the hint."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    page = f"https://huggingface.co/{'datasets/' if kind == 'dataset' else ''}{repo_id}"
    rev = f" at revision {revision}" if revision else ""
    token = "HF_TOKEN is set" if os.environ.get("HF_TOKEN") else "no HF_TOKEN is set"
    if isinstance(exc, GatedRepoError):
        return BadInput(f"{kind} {repo_id} is gated: access needs an accepted licence and a token ({token})",
                        f"accept the conditions on {page}, then set HF_TOKEN to a token of that account "
                        "(or `hf auth login`)")
    if isinstance(exc, RevisionNotFoundError):
        return BadInput(f"{kind} {repo_id} has no revision {revision!r}",
                        f"give a branch, tag or commit of the repo (`revision:`; see {page}/tree/main)")
    if isinstance(exc, HfHubHTTPError) and exc.response is not None and exc.response.status_code == 401 and \
            not isinstance(exc, RepositoryNotFoundError):
        return BadInput(f"the hub refused the token while getting {repo_id} ({token}: invalid credentials)",
                        "set HF_TOKEN to a valid token (https://huggingface.co/settings/tokens), or unset it for "
                        "public repos")
    if isinstance(exc, RepositoryNotFoundError):
        return BadInput(f"{kind} {repo_id} does not exist on the hub or is private ({token})",
                        f"check the id on {page}; a private repo needs HF_TOKEN with access to it")
    reason = unreachable(exc)
    fallback_hint = f"; without the hub: {fallback}" if fallback else ""
    if isinstance(exc, IncompleteSnapshotError):
        missing = re.search(r"(\d+ file\(s\) are missing \([^)]*\)(?: \(\d+ more\))?)", str(exc))
        return BadInput(f"{kind} {repo_id}{rev}: the cached copy is incomplete: "
                        f"{missing.group(1) if missing else 'files are missing'} and the hub cannot be reached "
                        f"({reason or 'offline'})", "run once with a network connection (unset HF_HUB_OFFLINE) to "
                        f"complete it{fallback_hint}")
    if reason is not None or isinstance(exc, LocalEntryNotFoundError):
        return BadInput(f"{kind} {repo_id}{rev}: {what} is not in the Hugging Face cache ({hub_cache_dir()}) and the "
                        f"hub cannot be reached ({reason or 'offline'})",
                        "connect once (unset HF_HUB_OFFLINE) or copy the cache from a machine that has it"
                        + fallback_hint)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return BadInput(f"{kind} {repo_id}{rev}: the hub answered with an error ({first})",
                    f"check {page}; retry later if the hub is down")


CONNECT_TIMEOUT_S = 5.0
"""How long the one TCP connection that tells whether the hub's endpoint answers at all may take."""
PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def _connect_refused(endpoint: str) -> ConnectionError | None:
    """A refused, unroutable or unresolvable endpoint, found by one TCP connection: huggingface_hub retries such a
    connection with backoff for ~25 s before it gives up. None when it connects, or when a proxy stands between (the
    library reaches the hub through it, this check could not)."""
    import socket
    from urllib.parse import urlsplit

    if any(os.environ.get(v) for v in PROXY_VARS):
        return None
    url = urlsplit(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        return ConnectionError(f"{endpoint}: {exc.strerror or exc}")
    return None


def hub_call(fn, repo_id: str, revision: str | None, *, what: str, kind: str = "model", fallback: str | None = None):
    """fn() with huggingface_hub's errors turned into one BadInput line (hub_error); an endpoint that refuses a
    connection fails at once instead of after the library's retries."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.errors import DryRunError, HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled
    from huggingface_hub.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # its retry warnings: the error line says what failed
    refused = None if constants.HF_HUB_OFFLINE else _connect_refused(constants.ENDPOINT)
    if refused is not None:
        raise hub_error(refused, repo_id, revision, what=what, kind=kind, fallback=fallback)
    try:
        return fn()
    except (HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled, DryRunError, httpx2.HTTPError) as exc:
        raise hub_error(exc, repo_id, revision, what=what, kind=kind, fallback=fallback) from None


# --- models -------------------------------------------------------------------------------------------


def config_path(hub_id: str, revision: str | None = None, *, fallback: str | None = None) -> str:
    """The config.json of a hub model: the cached snapshot's, else downloaded alone (a few KB) into the cache.

    Raises:
        BadInput: one line for every hub error (gated, missing, no network, offline and not cached).
    """
    snapshot = cached_snapshot(hub_id, revision)
    if snapshot is not None:
        return os.path.join(snapshot, "config.json")
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:  # `plan` alone installs no hub client (memascend's train extras bring it)
        raise BadInput(f"model {hub_id}: config.json is not in the Hugging Face cache ({hub_cache_dir()}) and "
                       "huggingface_hub is not installed to download it",
                       "pip install huggingface_hub" + (f"; without the hub: {fallback}" if fallback else "")) from None
    return hub_call(lambda: hf_hub_download(hub_id, "config.json", revision=revision), hub_id, revision,
                    what="config.json", fallback=fallback)
