"""The pure parts of benchmarks/striped_bench.py: the bench command of each member count and the sitting's summary."""

from __future__ import annotations

import argparse
import importlib.util
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("striped_bench", os.path.join(REPO, "benchmarks", "striped_bench.py"))
sb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sb)


def test_every_member_count_runs_the_same_bench_but_for_the_region():
    a = argparse.Namespace(model="bench-llama-136m", seq_len=32, steps=4, dtype="fp32", run="memascend",
                           bandwidth="400MB/s", gradient_clipping=10.0)
    one, three = sb.bench_args(a, "/dev/loop0", "/o/1"), sb.bench_args(a, "/dev/loop4", "/o/3")
    assert [x for x in one if x not in ("/dev/loop0", "/o/1")] == [x for x in three if x not in ("/dev/loop4", "/o/3")]
    assert one[one.index("--ssd-bandwidth") + 1] == "400MB/s" and one[one.index("--region") + 1] == "/dev/loop0"


def test_summary_is_the_median_per_count_over_one_members():
    runs = [{"members": 1, "tokens_per_s": 2.0}, {"members": 1, "tokens_per_s": 3.0}, {"members": 1, "tokens_per_s": 2.5},
            {"members": 2, "tokens_per_s": 4.0}, {"members": 2, "tokens_per_s": 5.5}, {"members": 3, "tokens_per_s": 6.0},
            {"members": 3, "tokens_per_s": None}]  # a failed run counts for nothing
    s = sb.summarize(runs)
    assert s["median_tokens_per_s"] == {"1": 2.5, "2": 4.75, "3": 6.0}
    assert s["ratio_to_one_member"] == {"1": 1.0, "2": 1.9, "3": 2.4}


_io_spec = importlib.util.spec_from_file_location("striped_io_bench",
                                                  os.path.join(REPO, "benchmarks", "striped_io_bench.py"))
sio = importlib.util.module_from_spec(_io_spec)
_io_spec.loader.exec_module(sio)


def test_io_summary_is_the_median_gbps_per_count_over_one_members():
    runs = [{"members": 1, "write_gbps": 0.41, "read_gbps": 0.40}, {"members": 1, "write_gbps": 0.40, "read_gbps": 0.40},
            {"members": 3, "write_gbps": 1.2, "read_gbps": 1.1}, {"members": 3, "write_gbps": 1.3, "read_gbps": 1.3}]
    s = sio.summarize(runs)
    assert s["median_write_gbps"] == {"1": 0.405, "3": 1.25} and s["median_read_gbps"] == {"1": 0.4, "3": 1.2}
    assert s["write_gbps_ratio_to_one_member"] == {"1": 1.0, "3": 3.086}
    assert s["read_gbps_ratio_to_one_member"] == {"1": 1.0, "3": 3.0}


def test_the_time_page_takes_a_striped_runs_ssd_share_at_its_members_summed_limits():
    import sys

    sys.path.insert(0, os.path.join(REPO, "scripts"))
    import results_ssd

    limit = {"read_bytes_per_s": 400e6, "write_bytes_per_s": 400e6}
    run = {"devices": ["/dev/loop0", "/dev/loop1"], "seconds_per_step": 5.0, "ssd_read_bytes_per_step": 3.2e9,
           "ssd_write_bytes_per_step": 1.6e9,  # the swap disk's limit (vda) is not the region's
           "ssd_throttle": [{"device": d, **limit} for d in ("vda", "loop0", "loop1")]}
    assert results_ssd.striped_ssd_share(run) == 0.8  # reads: 3.2 GB at 0.8 GB/s, 4 s of the 5
    assert results_ssd.striped_ssd_share({**run, "seconds_per_step": None}) is None
