"""Shipped presets: models/, hardware/, train/ (data files, read with importlib.resources)."""

from importlib.resources import files


def preset_dir(kind: str):
    """The folder of one preset kind ("models", "hardware", "train") as a Traversable."""
    return files(__name__) / kind
