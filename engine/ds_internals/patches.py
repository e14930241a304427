"""Reversible attribute replacement: every monkey-patch memascend makes on DeepSpeed goes through :class:`Patches`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Patches:
    """Attributes replaced on modules/objects, restored in reverse order."""

    saved: list[tuple[Any, str, Any, bool]] = field(default_factory=list)  # (owner, name, old, existed)

    def set(self, owner: Any, name: str, value: Any) -> None:
        existed = name in vars(owner) if hasattr(owner, "__dict__") else hasattr(owner, name)
        self.saved.append((owner, name, getattr(owner, name, None), existed))
        setattr(owner, name, value)

    def restore(self) -> None:
        while self.saved:
            owner, name, old, existed = self.saved.pop()
            if existed:
                setattr(owner, name, old)
            else:
                try:
                    delattr(owner, name)
                except AttributeError:
                    pass
