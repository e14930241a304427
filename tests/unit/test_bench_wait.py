"""bench's reading of a rank that waits on an op build lock (outcome.waiting_on): only a wait nothing followed counts."""

from __future__ import annotations

from memascend_cli.bench.outcome import waiting_on

WAIT = {"event": "wait", "on": "/x/.torch_ext/cpu_adam/lock", "holders": ["pid 7 (python)"], "waited_s": 3.0}


def test_a_wait_is_the_last_event_of_a_rank():
    phase = {"event": "phase", "name": "initialize"}
    assert waiting_on({0: [phase, WAIT]}) == WAIT
    assert waiting_on({0: [phase], 1: [phase, WAIT]}) == WAIT  # any rank
    assert waiting_on({0: [phase, WAIT, {"event": "phase", "name": "step1_forward"}]}) is None  # it got the lock
    assert waiting_on({0: []}) is None and waiting_on({}) is None
