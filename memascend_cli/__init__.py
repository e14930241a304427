"""memascend: plan, prepare and run host-memory-lean SSD-offloaded fine-tuning."""

__version__ = "0.1.0"
