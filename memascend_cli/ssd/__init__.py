"""The SSD region: on-disk format and per-rank sub-regions (region), ownership locks (owner), creating one safely
(prepare), measuring it (probe), deciding what is safe to write (safety), and block-device facts (blockdev)."""
