"""The MemAscend offload engine (installed as `memascend_engine`); imports torch lazily."""
