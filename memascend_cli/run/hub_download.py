"""A hub model for `train`: what it needs of the repo (hub.MODEL_PATTERNS), what of it the cache already holds, the
disk it needs next to the region, and the download itself (huggingface_hub's snapshot_download: resumable, into its
cache, HF_TOKEN / HF_ENDPOINT / HF_HUB_OFFLINE honoured) with a Rich progress bar.

No torch; huggingface_hub is imported here only (the CLI's other commands never load this module).
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field

from memascend_cli.errors import BadInput
from memascend_cli.hub import MODEL_PATTERNS, hub_cache_dir, hub_call
from memascend_cli.units import fmt_bytes


@dataclass
class HubModel:
    """A hub model as `train` finds it: in the cache (snapshot set, nothing to download) or on the hub."""

    repo_id: str
    revision: str | None
    commit: str | None = None
    snapshot: str | None = None
    """The complete cached snapshot folder; None while files are still to be downloaded."""
    files: list[dict] = field(default_factory=list)
    """{name, bytes, cached} of every file train needs (empty when the hub could not be asked)."""

    @property
    def download_bytes(self) -> int:
        return sum(f["bytes"] or 0 for f in self.files if not f["cached"])

    def to_dict(self) -> dict:
        """What --dry-run shows and sources.json records."""
        return {"repo_id": self.repo_id, "revision": self.revision or "main", "commit": self.commit,
                "snapshot": self.snapshot, "download_bytes": self.download_bytes,
                "download_files": [f["name"] for f in self.files if not f["cached"]],
                "cached_files": [f["name"] for f in self.files if f["cached"]]}


def missing_parts(names: list[str]) -> list[str]:
    """What a model folder lacks for training (weights, config, tokenizer), from its file names."""
    missing = []
    if "config.json" not in names:
        missing.append("config.json")
    if not any(n.endswith(".safetensors") for n in names):
        missing.append("*.safetensors weights")
    if not any(n in ("tokenizer.json", "tokenizer.model") for n in names):
        missing.append("tokenizer.json")
    return missing


def wanted(name: str) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in MODEL_PATTERNS)


def _snapshot_dir(repo_id: str, commit: str) -> str:
    return os.path.join(hub_cache_dir(), "models--" + repo_id.replace("/", "--"), "snapshots", commit)


def _ask_hub(repo_id: str, revision: str | None):
    """snapshot_download's dry run (file names, sizes, cached or not), or None when the hub cannot be reached."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import DryRunError

    from memascend_cli.hub import unreachable

    try:
        return snapshot_download(repo_id, revision=revision, allow_patterns=list(MODEL_PATTERNS), dry_run=True,
                                 tqdm_class=_silent_tqdm())
    except DryRunError as exc:
        cause = exc.__cause__
        if cause is None or unreachable(cause) is not None:
            return None  # no network or offline: the cache must hold it all
        raise cause from None  # gated, missing, a refused token: said as such by hub_call


def locate(repo_id: str, revision: str | None) -> HubModel:
    """The model's files on the hub (sizes, which are cached), or its complete cached snapshot when the hub cannot be
    reached (HF_HUB_OFFLINE, no network).

    Raises:
        BadInput: gated, missing repo or revision, a refused token; offline with the files missing (named).
    """
    from huggingface_hub import snapshot_download

    infos = hub_call(lambda: _ask_hub(repo_id, revision), repo_id, revision, what="the model")
    if infos is not None:
        files = [{"name": i.filename, "bytes": i.file_size, "cached": i.is_cached} for i in infos]
        missing = missing_parts([f["name"] for f in files])
        if missing:
            raise BadInput(f"model {repo_id}: the repo has no {', '.join(missing)} (memascend trains from safetensors "
                           "weights with a Hugging Face tokenizer)", "convert the weights to safetensors, or choose "
                           "another repo")
        model = HubModel(repo_id, revision, commit=infos[0].commit_hash, files=files)
        if all(f["cached"] for f in files):
            model.snapshot = _snapshot_dir(repo_id, model.commit)
        return model
    at = f" at revision {revision}" if revision else ""
    try:
        snapshot = hub_call(lambda: snapshot_download(repo_id, revision=revision, allow_patterns=list(MODEL_PATTERNS),
                                                      local_files_only=True), repo_id, revision, what="the model")
    except BadInput as exc:
        if "is not in the Hugging Face cache" not in exc.message:
            raise
        raise BadInput(f"model {repo_id}{at}: not in the Hugging Face cache ({hub_cache_dir()}) and the hub cannot be "
                       f"reached; train needs its {', '.join(missing_parts([]))}", exc.hint) from None
    names = sorted(os.path.relpath(os.path.join(d, n), snapshot) for d, _, ns in os.walk(snapshot) for n in ns)
    missing = missing_parts(names)
    if missing:
        raise BadInput(f"model {repo_id}{at}: the cached snapshot {snapshot} lacks {', '.join(missing)} and the hub "
                       "cannot be reached", "run once with a network connection (unset HF_HUB_OFFLINE) to download "
                       "them")
    files = [{"name": n, "bytes": os.path.getsize(os.path.join(snapshot, n)), "cached": True} for n in names if wanted(n)]
    return HubModel(repo_id, revision, commit=os.path.basename(snapshot), snapshot=snapshot, files=files)


def disk_problem(download_bytes: int, cache_free_bytes: int | None, region_bytes: int, same_disk: bool) -> str | None:
    """Why the download does not fit (None when it does): the cache's disk must hold the download, and the region
    file too when it is created on the same disk."""
    if cache_free_bytes is None:
        return None
    need = download_bytes + (region_bytes if same_disk else 0)
    if need <= cache_free_bytes:
        return None
    with_region = f" and the {fmt_bytes(region_bytes)} region file" if same_disk and region_bytes else ""
    return (f"the model's {fmt_bytes(download_bytes)} download{with_region} need {fmt_bytes(need)} on the disk of "
            f"{hub_cache_dir()}, which has {fmt_bytes(cache_free_bytes)} free")


def _device(path: str) -> int | None:
    p = os.path.abspath(path)
    while not os.path.exists(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    try:
        return os.stat(p).st_dev
    except OSError:
        return None


def check_disk(model: HubModel, region_path: str | None, region_create_bytes: int) -> None:
    """Refuse a download that the cache's disk cannot hold next to the region file this run creates.

    Raises:
        BadInput: naming both sizes and the free space.
    """
    from memascend_cli.run.preflight import free_bytes

    cache = hub_cache_dir()
    same = region_path is not None and _device(cache) == _device(region_path)
    problem = disk_problem(model.download_bytes, free_bytes(cache), region_create_bytes, same)
    if problem:
        raise BadInput(problem, "free space there, or point HF_HUB_CACHE (or HF_HOME) at a larger disk")


def _silent_tqdm():
    """A tqdm class that shows nothing (a dry run's "Fetching N files" bar)."""
    from tqdm.std import tqdm

    class Silent(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs.pop("name", None)
            super().__init__(*args, **{**kwargs, "disable": True})

    return Silent


def _rich_tqdm(progress):
    """A tqdm class whose bars are tasks of a Rich Progress (snapshot_download's tqdm_class)."""
    from tqdm.std import tqdm

    class RichTqdm(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs.pop("name", None)
            kwargs["file"] = open(os.devnull, "w")  # noqa: SIM115 - closed in close()
            # tqdm displays once while it starts: the task must be there first.
            self._task = progress.add_task(kwargs.get("desc") or "", total=kwargs.get("total") or None)
            super().__init__(*args, **kwargs)

        def display(self, msg=None, pos=None):
            progress.update(self._task, completed=self.n, total=self.total or None, description=self.desc or "")
            return True

        def close(self):
            if not self.disable:
                self.display()
            super().close()
            self.fp.close()

    return RichTqdm


def download(model: HubModel) -> str:
    """The model's files into the Hugging Face cache (resumed where a previous download stopped); the snapshot folder.

    Raises:
        BadInput: the hub's errors as one line.
    """
    from huggingface_hub import snapshot_download
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    from memascend_cli.console import err

    err.print(f"downloading {model.repo_id} ({fmt_bytes(model.download_bytes)} of safetensors, tokenizer and config) "
              f"into {hub_cache_dir()}", highlight=False)
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=err, transient=True) as progress:
        snapshot = hub_call(lambda: snapshot_download(model.repo_id, revision=model.commit or model.revision,
                                                      allow_patterns=list(MODEL_PATTERNS),
                                                      tqdm_class=_rich_tqdm(progress)),
                            model.repo_id, model.revision, what="the model")
    model.snapshot = snapshot
    model.commit = os.path.basename(snapshot)
    for f in model.files:
        f["cached"] = True
    return snapshot


# --- a train run's hub sources ------------------------------------------------------------------------


def resolve(recipe, *, resume: bool = False):
    """(the recipe, its hub model or None): a hub model id whose files the cache holds becomes its snapshot folder.
    --resume continues with the commit the run started from (sources.json), whatever the branch points at now."""
    from memascend_cli.hub import looks_like_hub_id

    if not looks_like_hub_id(recipe.model):
        return recipe, None
    revision = recipe.revision
    if resume:
        revision = recorded(recipe.output_dir).get("model", {}).get("commit") or revision
    model = locate(recipe.model, revision)
    model.revision = recipe.revision  # as the recipe gives it (the commit is recorded beside it)
    return (recipe.model_copy(update={"model": model.snapshot}) if model.snapshot else recipe), model


def fetch(recipe, model: HubModel | None, *, dry_run: bool, region_path: str | None, region_create_bytes: int):
    """The recipe with its hub model downloaded (the disk checked first); a dry run downloads nothing."""
    if model is None or model.snapshot is not None or dry_run:
        return recipe
    check_disk(model, region_path, region_create_bytes)
    return recipe.model_copy(update={"model": download(model)})


def dataset_repo_bytes(dataset) -> tuple[int | None, str]:
    """(the size of the hub dataset's files under its folder: what a first load downloads at most, or None; why it
    is unknown)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import DryRunError

    def ask():
        try:
            return snapshot_download(dataset.hub, repo_type="dataset", dry_run=True, tqdm_class=_silent_tqdm(),
                                     allow_patterns=[f"{dataset.folder}/*"] if dataset.folder else None)
        except DryRunError as exc:
            raise (exc.__cause__ or exc) from None

    try:
        infos = hub_call(ask, dataset.hub, None, what="the dataset", kind="dataset")
    except BadInput as exc:
        return None, "the hub cannot be reached" if "cannot be reached" in exc.message else exc.message
    return sum(i.file_size or 0 for i in infos if i.filename not in (".gitattributes", "README.md")), ""


def downloads(model: HubModel | None, recipe, data: dict) -> dict:
    """What a run would download (--dry-run): the model's files and sizes, the dataset not yet in the cache."""
    out: dict = {}
    if model is not None:
        out["model"] = model.to_dict()
        if model.snapshot is None and not model.files:
            out["model"]["download_bytes"] = None
    pending = data.get("pending")
    if pending and recipe.dataset.hub is not None:  # not loaded from the cache (or not tried: the model is pending)
        d = recipe.dataset
        out["dataset"] = {"dataset": d.hub, "subset": d.subset, "split": d.split, "folder": d.folder,
                          "why": pending.get("why", "read from the cache or downloaded when the run starts")}
        out["dataset"]["repo_bytes"], out["dataset"]["size_unknown"] = dataset_repo_bytes(d)
    return out


def say_downloads(doc: dict) -> None:
    """One line per download a dry run would start."""
    from memascend_cli.console import err

    model = doc.get("model")
    if model and model["download_files"]:
        size = fmt_bytes(model["download_bytes"]) if model["download_bytes"] is not None else "size unknown"
        err.print(f"would download: model {model['repo_id']} ({model['revision']}): {len(model['download_files'])} "
                  f"files, {size}", highlight=False, soft_wrap=True)
    data = doc.get("dataset")
    if data:
        size = f"at most {fmt_bytes(data['repo_bytes'])}" if data["repo_bytes"] is not None else \
            f"size unknown ({data['size_unknown']})"
        err.print(f"would download: dataset {data['dataset']} (split {data['split']}): {size}; tokenized when the run "
                  "starts", highlight=False, soft_wrap=True)


SOURCES_JSON = "sources.json"
"""Where a run records the hub repos it trained from (repo, revision, commit; the dataset's cached files)."""


def recorded(run_dir: str) -> dict:
    """sources.json of a run ({} when there is none)."""
    import json

    try:
        with open(os.path.join(run_dir, SOURCES_JSON)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def record(run_dir: str, model: HubModel | None, recipe, data: dict) -> None:
    """run_dir/sources.json: the hub model's repo, revision and commit, and the hub dataset's repo and files."""
    import json

    doc: dict = {}
    if model is not None:
        doc["model"] = {k: v for k, v in model.to_dict().items() if k not in ("download_files", "download_bytes")}
    if recipe.dataset.hub is not None:
        doc["dataset"] = {"repo_id": recipe.dataset.hub, "subset": recipe.dataset.subset,
                          "split": recipe.dataset.split, "folder": recipe.dataset.folder,
                          "files": data.get("dataset_files")}
    if doc:
        with open(os.path.join(run_dir, SOURCES_JSON), "w") as f:
            json.dump(doc, f, indent=2)
