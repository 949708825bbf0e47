"""Attribute patches a prediction applies to torch (and the user's modules) and takes back afterwards."""
from __future__ import annotations

from typing import Any

_MISSING = object()


class AttributePatches:
    """Attribute patches, restored in reverse order. A class's attribute is saved from the class's own
    ``__dict__`` (an inherited one is not copied onto the class at restore, and a staticmethod or classmethod
    goes back as it was); any other owner's (a module, an instance) with ``getattr``."""

    def __init__(self):
        self._saved: list[tuple[Any, str, Any]] = []

    def set(self, owner, name: str, value) -> None:
        """Set ``owner.name = value``, keeping what was there for `restore`."""
        self._saved.append((owner, name, owner.__dict__.get(name, _MISSING) if isinstance(owner, type)
                            else getattr(owner, name, _MISSING)))
        setattr(owner, name, value)

    def restore(self) -> None:
        """Put every patched attribute back (deleted where there was none), the last patched first."""
        while self._saved:
            owner, name, value = self._saved.pop()
            if value is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, value)
