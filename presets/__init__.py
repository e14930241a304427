"""Shipped presets: models/, hardware/, train/ (data files, read with importlib.resources).

This folder is `presets/` in the repository and is installed as the package `memascend_presets` (pyproject.toml
package-dir): a top-level package named `presets` would collide with other projects in site-packages.
"""

from importlib.resources import files


def preset_dir(kind: str):
    """The folder of one preset kind ("models", "hardware", "train") as a Traversable."""
    return files(__name__) / kind
