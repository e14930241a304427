"""memascend_cli/versions.py: the one DeepSpeed version parser (pure) and the installed version."""

import pytest

from memascend_cli.errors import BadInput
from memascend_cli.versions import installed_deepspeed_version, parse_version


@pytest.mark.parametrize("text,expected", [
    ("0.19.8", (0, 19, 8)), ("0.19.8+abc123", (0, 19, 8)), ("0.20.0rc1", (0, 20, 0)), ("0.20.0.dev0", (0, 20, 0)),
    ("0.19", (0, 19, 0)), (" 1.2.3 ", (1, 2, 3)),
])
def test_parse_version(text, expected):
    assert parse_version(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "v0.19.8", "+local"])
def test_unreadable_versions_are_bad_input(text):
    with pytest.raises(BadInput):
        parse_version(text)


def test_installed_version_reads_without_importing_deepspeed():
    import sys

    had = "deepspeed" in sys.modules
    version = installed_deepspeed_version()
    assert parse_version(version) >= (0, 19, 5)
    assert ("deepspeed" in sys.modules) == had
