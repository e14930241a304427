"""Hub datasets (`dataset: {hub: org/name, subset, split, folder}`, LLaMA-Factory's hf_hub_url entries): loaded with
`datasets.load_dataset` as LLaMA-Factory loads them, into the `datasets` cache (HF_HOME / HF_DATASETS_CACHE; with
HF_HUB_OFFLINE, from that cache only), and handed to the tokenizer as the Arrow files of that cache, which
data_records reads record by record like a local file.

Runs in the tokenize child of `memascend train` (engine/tokenize_job.py), never in the CLI process.
"""

from __future__ import annotations

import os

from memascend_engine.data import DataError


class HubDataError(DataError):
    """A hub dataset that cannot be loaded, with the fix as `hint`."""

    def __init__(self, message: str, hint: str):
        super().__init__(message)
        self.hint = hint


class NotCached(HubDataError):
    """The dataset is not in the cache and the hub is not asked (offline, no network, or a dry run)."""


def _describe(dataset) -> str:
    extra = [f"{k} {v}" for k, v in (("subset", dataset.subset), ("folder", dataset.folder)) if v]
    return f"dataset {dataset.hub}" + (f" ({', '.join(extra)})" if extra else "") + f", split {dataset.split}"


def arrow_files(dataset, *, dry_run: bool = False) -> list[str]:
    """The cached Arrow files of the hub dataset (downloaded and prepared first when needed).

    dry_run: ask only the cache (a dry run downloads nothing).

    Raises:
        HubDataError: gated or missing dataset, unknown split; NotCached: offline (or no network) and not cached.
    """
    user_offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    if dry_run:
        os.environ["HF_HUB_OFFLINE"] = "1"  # read by datasets and huggingface_hub when they are imported
    try:
        import datasets
    except ImportError:
        raise HubDataError(f"{_describe(dataset)}: loading hub datasets needs the datasets package",
                           "pip install datasets (memascend's train extras include it)") from None
    from datasets.exceptions import DatasetNotFoundError

    datasets.utils.logging.set_verbosity_error()
    datasets.disable_progress_bars()  # the CLI reads this process's stderr line by line
    what = _describe(dataset)
    try:
        ds = datasets.load_dataset(dataset.hub, name=dataset.subset, data_dir=dataset.folder, split=dataset.split)
    except ConnectionError as exc:
        # datasets: "Couldn't reach 'org/name' on the Hub (OfflineModeIsEnabled)" when it is not cached either.
        reason = "HF_HUB_OFFLINE is set" if user_offline else \
            "a dry run downloads nothing" if dry_run else "no connection to the hub"
        raise NotCached(f"{what}: not in the datasets cache ({datasets.config.HF_DATASETS_CACHE}) and {reason}",
                        "connect once (unset HF_HUB_OFFLINE) to download it, or copy the cache from a machine that "
                        f"has it ({str(exc).splitlines()[0]})") from None
    except DatasetNotFoundError as exc:
        text = str(exc).splitlines()[0]
        hint = (f"accept the conditions on https://huggingface.co/datasets/{dataset.hub} and set HF_TOKEN"
                if "gated" in text else "check the repo id on https://huggingface.co/datasets and HF_TOKEN for a "
                "private one")
        raise HubDataError(f"{what}: {text}", hint) from None
    except ValueError as exc:  # an unknown split or subset: datasets lists the ones there are
        raise HubDataError(f"{what}: {str(exc).splitlines()[0]}", "fix split / subset (LLaMA-Factory: the entry's "
                           "split and subset in dataset_info.json)") from None
    files = [f["filename"] for f in ds.cache_files]
    if not files:
        raise HubDataError(f"{what}: datasets returned it without cache files", "set HF_DATASETS_CACHE to a writable "
                           "folder")
    return files
