import pytest

from memascend_cli.errors import BadInput
from memascend_cli.units import GiB, fmt_bytes, parse_bandwidth_gbps, parse_count, parse_size


@pytest.mark.parametrize("text,expected", [
    ("128GiB", 128 * GiB), ("2TB", 2 * 10**12), ("24 G", 24 * GiB), ("512MiB", 512 * 1024**2), ("1.5gib", int(1.5 * GiB)),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text,fragment", [("128", "no unit"), ("-5GiB", "negative"), ("12 parsecs", "unit"),
                                           ("lots", "cannot read"), ("0GiB", "positive")])
def test_parse_size_rejects(text, fragment):
    with pytest.raises(BadInput) as e:
        parse_size(text, "--dram")
    assert fragment in e.value.message and e.value.hint


def test_bandwidth_and_counts():
    assert parse_bandwidth_gbps("6.5") == 6.5
    assert parse_bandwidth_gbps("3500MB/s") == pytest.approx(3.5)
    assert parse_count("1e9") == 10**9
    with pytest.raises(BadInput):
        parse_count("1.5")
    with pytest.raises(BadInput):
        parse_bandwidth_gbps("-1")
    assert fmt_bytes(1536 * 1024**2) == "1.50 GiB"
