"""engine/procfs.py's per-arena heap reader: glibc's malloc_info(3) XML parsed, and read from this process."""

from __future__ import annotations

import subprocess
import sys

from memascend_engine.procfs import malloc_arenas, malloc_state, parse_malloc_info

# Shape of glibc 2.36's malloc_info(0, fp) output (malloc/malloc.c __malloc_info), two arenas.
MALLOC_INFO = """<malloc version="1">
<heap nr="0">
<sizes>
<size from="17" to="32" total="64" count="2"/>
<unsorted from="0" to="0" total="0" count="0"/>
</sizes>
<total type="fast" count="2" size="64"/>
<total type="rest" count="3" size="4096"/>
<system type="current" size="135168"/>
<system type="max" size="200704"/>
<aspace type="total" size="135168"/>
<aspace type="mprotect" size="135168"/>
</heap>
<heap nr="1">
<sizes>
</sizes>
<total type="fast" count="0" size="0"/>
<total type="rest" count="1" size="65536"/>
<system type="current" size="1048576"/>
<system type="max" size="1048576"/>
<aspace type="total" size="1048576"/>
<aspace type="mprotect" size="1048576"/>
</heap>
<total type="fast" count="2" size="64"/>
<total type="rest" count="4" size="69632"/>
<total type="mmap" count="1" size="2101248"/>
<system type="current" size="1183744"/>
<system type="max" size="1249280"/>
<aspace type="total" size="1183744"/>
<aspace type="mprotect" size="1183744"/>
</malloc>"""


def test_parse_gives_each_arena_its_system_and_free_bytes():
    assert parse_malloc_info(MALLOC_INFO) == [[135168, 4160], [1048576, 65536]]


def test_a_thread_that_frees_under_contention_keeps_its_own_arena():
    # A fresh interpreter: threads that allocate while the main arena is busy get arenas of their own, and their
    # freed blocks stay there (malloc/arena.c arena_get2). The arenas' system bytes add up to mallinfo2's; their
    # binned free bytes to at most its fordblks, which also counts each arena's top chunk.
    code = """
import threading
from memascend_engine.procfs import malloc_arenas, malloc_state
start = threading.Barrier(4)
def work():
    start.wait()
    blocks = [bytearray(1 << 20) for _ in range(8)]
    del blocks
threads = [threading.Thread(target=work) for _ in range(4)]
[t.start() for t in threads]; [t.join() for t in threads]
a, m = malloc_arenas(), malloc_state()
print(len(a), sum(s for s, _ in a) == m["arena_bytes"], sum(f for _, f in a) <= m["free_kept_bytes"])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert int(out[0]) >= 2 and out[1:] == ["True", "True"]


def test_malloc_state_carries_the_arenas():
    arenas = malloc_arenas()
    assert arenas and all(system >= free >= 0 for system, free in arenas)
    assert malloc_state()["arenas"][0][0] > 0
