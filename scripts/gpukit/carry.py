"""The carry folder (built here, where PyPI and Debian's archive are reachable) and the size of what travels to the
GPU machine with each call (the working tree plus the carried folders; at most 64 MiB by default)."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

from gpukit.pure import (BUILD_REQUIREMENTS, CARRY_LIMIT_BYTES, DEBS, DEEPSPEED_VERSION, PYTHON_TARGET, REPO,
                         REQUIRED_DISTS, RUNTIME_REQUIREMENTS, WHEEL_PLATFORMS, WORK_DIR, MiB, parse_wheel_name,
                         wheel_fits_target)


def check_manifest(manifest: dict, carry_dir: str, *, verify_hashes: bool = True) -> list[str]:
    """Problems with a carry folder (empty list: complete). Reads the files it names."""
    problems = []
    files = manifest.get("files", [])
    names = set()
    for f in files:
        path = os.path.join(carry_dir, f["path"])
        if not os.path.isfile(path):
            problems.append(f"{f['path']} is listed in the manifest but missing")
            continue
        if os.path.getsize(path) != f["bytes"]:
            problems.append(f"{f['path']} has {os.path.getsize(path)} bytes, the manifest says {f['bytes']}")
        elif verify_hashes and sha256_file(path) != f["sha256"]:
            problems.append(f"{f['path']} does not match its sha256")
        if f["path"].startswith("wheels/"):
            w = parse_wheel_name(os.path.basename(f["path"]))
            if w is None:
                problems.append(f"{f['path']} is not a wheel file name")
                continue
            names.add(w["name"])
            if not wheel_fits_target(w):
                problems.append(f"{f['path']} does not install on CPython {PYTHON_TARGET} x86-64 Linux")
            if w["name"] == "deepspeed" and w["version"] != DEEPSPEED_VERSION:
                problems.append(f"{f['path']}: DeepSpeed {w['version']}, the kit pins {DEEPSPEED_VERSION}")
    for d in REQUIRED_DISTS:
        if d not in names:
            problems.append(f"no wheel of {d} in the carry folder")
    debs = [os.path.basename(f["path"]) for f in files if f["path"].startswith("debs/")]
    for pkg in DEBS:
        if not any(b.startswith((pkg + "_", pkg + "t64_")) for b in debs):
            problems.append(f"no .deb of {pkg} in the carry folder")
    return problems


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tree_files(repo: str, skip_dirs: list[str]) -> list[str]:
    """Paths (relative) of the working tree that goes to the GPU machine: tracked and untracked-not-ignored files where
    `repo` is a git checkout; elsewhere (the GPU machine receives the tree without .git) every file under
    `repo` except `skip_dirs` (the kit's work folder, the carried folders: counted on their own)."""
    if os.path.exists(os.path.join(repo, ".git")):
        r = subprocess.run(["git", "-C", repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True)
        return sorted({p for p in r.stdout.decode().split("\0") if p})
    skip = {os.path.abspath(d) for d in skip_dirs}
    out = []
    for root, dirs, files in os.walk(repo):
        dirs[:] = [d for d in dirs if os.path.abspath(os.path.join(root, d)) not in skip]
        out += [os.path.relpath(os.path.join(root, n), repo) for n in files]
    return sorted(out)


def travelling_bytes(repo: str, extra_dirs: list[str], limit_bytes: int = CARRY_LIMIT_BYTES) -> dict:
    """Bytes that go to the GPU machine: the working tree (tree_files) plus `extra_dirs`."""
    tree = 0
    for rel in tree_files(repo, [*extra_dirs, WORK_DIR]):
        p = os.path.join(repo, rel)
        if os.path.isfile(p) and not os.path.islink(p):
            tree += os.path.getsize(p)
    extra = {d: dir_bytes(d) for d in extra_dirs}
    return {"tree_bytes": tree, "carried_bytes": extra, "total_bytes": tree + sum(extra.values()),
            "limit_bytes": limit_bytes}


def dir_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for n in files:
            p = os.path.join(root, n)
            if not os.path.islink(p):
                total += os.path.getsize(p)
    return total


def build_carry(dest: str, python: str, limit_bytes: int = CARRY_LIMIT_BYTES) -> int:
    """pip wheel / pip download / apt-get download into `dest`, then the manifest and the size check."""
    tmp = dest + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    wheels, debs = os.path.join(tmp, "wheels"), os.path.join(tmp, "debs")
    os.makedirs(wheels)
    os.makedirs(debs)
    pip = [python, "-m", "pip", "--disable-pip-version-check"]

    def sh(cmd, cwd=None):
        print("$ " + shlex.join(cmd), flush=True)
        subprocess.run(cmd, cwd=cwd, check=True)

    # DeepSpeed ships only an sdist; its setup.py finds no torch in the isolated build env, so nothing is compiled
    # (it warns 'Unable to import torch, pre-compiling ops will be disabled'): a pure-Python wheel whose ops JIT-build
    # on first use.
    sh(pip + ["wheel", "--no-deps", "--no-cache-dir", "-w", wheels, f"deepspeed=={DEEPSPEED_VERSION}"])
    platform_args = [a for p in WHEEL_PLATFORMS for a in ("--platform", p)]
    sh(pip + ["download", "--only-binary=:all:", "--python-version", PYTHON_TARGET, "--implementation", "cp",
              *platform_args, "--no-cache-dir", "-d", wheels, *RUNTIME_REQUIREMENTS, *BUILD_REQUIREMENTS])
    try:
        sh(["apt-get", "download", *DEBS], cwd=debs)
    except subprocess.CalledProcessError:
        sh(["apt-get", "update", "-qq"])
        sh(["apt-get", "download", *DEBS], cwd=debs)

    files = []
    for sub in ("wheels", "debs"):
        for n in sorted(os.listdir(os.path.join(tmp, sub))):
            p = os.path.join(tmp, sub, n)
            files.append({"path": f"{sub}/{n}", "bytes": os.path.getsize(p), "sha256": sha256_file(p)})
    manifest = {"schema_version": 1, "deepspeed_version": DEEPSPEED_VERSION, "python_target": PYTHON_TARGET,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "files": files}
    with open(os.path.join(tmp, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    problems = check_manifest(manifest, tmp)
    if problems:
        print("carry folder incomplete:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(tmp, dest)
    for f in files:
        print(f"  {f['bytes'] / MiB:7.2f} MiB  {f['path']}")
    size = travelling_bytes(REPO, [dest])
    print(f"carry folder {dir_bytes(dest) / MiB:.2f} MiB; working tree {size['tree_bytes'] / MiB:.2f} MiB; "
          f"total {size['total_bytes'] / MiB:.2f} MiB of {limit_bytes / MiB:.0f} MiB")
    if size["total_bytes"] > limit_bytes:
        print(f"error: the working tree plus the carry folder exceed {limit_bytes / MiB:.0f} MiB\n"
              "hint: --limit-mib sets what your way of copying to the GPU machine takes", file=sys.stderr)
        return 1
    return 0


