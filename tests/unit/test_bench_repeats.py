"""bench --repeat: which repeat stands for a run (memascend_cli/bench/runner.median_run). The live two-repeat bench is a
`long` test (tests/integration/test_bench_slow.py)."""

from memascend_cli.bench.runner import RunResult, median_run


def _run(peak: int | None, ok: bool = True, log: str = "", error: str | None = None) -> RunResult:
    return RunResult(name="tuned", mode="tuned", disabled=[], ok=ok, peak_system_bytes=peak, log_path=log, error=error)


def test_one_repeat_is_the_run_itself():
    only = _run(5, log="a")
    assert median_run([only]) is only and only.repeats == []


def test_the_median_peak_stands_for_the_run_and_every_repeat_is_kept():
    runs = [_run(9, log="r1"), _run(3, log="r2"), _run(5, log="r3")]
    chosen = median_run(runs)
    assert chosen.log_path == "r3" and chosen.peak_system_bytes == 5
    assert [r["log_path"] for r in chosen.repeats] == ["r1", "r2", "r3"]  # in the order run
    assert [r["peak_system_bytes"] for r in chosen.repeats] == [9, 3, 5]


def test_an_even_count_takes_the_lower_middle():
    assert median_run([_run(8, log="a"), _run(2, log="b")]).log_path == "b"
    assert median_run([_run(4, log="a"), _run(1, log="b"), _run(9, log="c"), _run(6, log="d")]).log_path == "a"


def test_a_failed_repeat_is_reported_rather_than_hidden():
    chosen = median_run([_run(4, log="a"), _run(None, ok=False, log="b"), _run(6, log="c")])
    assert chosen.log_path == "b" and not chosen.ok and len(chosen.repeats) == 3


def test_a_failed_repeat_says_how_many_of_the_repeats_failed():
    oom = "does not fit: OOM-killed at step 2 (step2_backward) under the DRAM cap"
    chosen = median_run([_run(4, log="a"), _run(None, ok=False, log="b", error=oom), _run(6, log="c")])
    assert chosen.error == oom + " (failed in 1 of 3 repeats)"
