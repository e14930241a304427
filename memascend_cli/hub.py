"""Hugging Face hub ids (org/name) without the network: the local Hugging Face cache, read as `from_pretrained`
finds a model offline, and the shipped presets whose config.json comes from a known hub id.

Pure apart from looking at the cache folder; no huggingface_hub import.
"""

from __future__ import annotations

import os
import re

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_SOURCE_ID = re.compile(r"https://huggingface\.co/([\w.-]+/[\w.-]+)/")
# Instruction-tuned and renamed releases share their base model's architecture (config.json up to generation
# settings): Qwen/Qwen2.5-7B-Instruct is Qwen2.5-7B, meta-llama/Meta-Llama-3.1-8B-Instruct is Llama-3.1-8B.
_VARIANT_SUFFIX = re.compile(r"-(instruct|chat|it)(-\d+)?$")


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


def cached_snapshot(hub_id: str, revision: str = "main", env: dict | None = None) -> str | None:
    """The cache snapshot folder `from_pretrained(hub_id)` would use offline (refs/<revision> -> snapshots/<commit>),
    when it holds a config.json; None otherwise."""
    repo = os.path.join(hub_cache_dir(env), "models--" + hub_id.replace("/", "--"))
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
