"""The prediction's attribute patches go back exactly as they were (one class serves the single-GPU and the
multi-GPU environments)."""
from __future__ import annotations

import types

from memlens.prediction.patches import AttributePatches


class Base:
    def inherited(self):
        return "base"


class Child(Base):
    @staticmethod
    def helper():
        return "static"


def test_restore_puts_back_what_was_there_last_patch_first():
    module = types.SimpleNamespace(f=1)
    p = AttributePatches()
    p.set(Child, "inherited", lambda self: "patched")       # inherited: Child has no own attribute
    p.set(Child, "helper", lambda: "patched")               # a staticmethod in Child's own __dict__
    p.set(module, "f", 2)
    p.set(module, "f", 3)                                    # patched twice: back to 1, not 2
    p.set(module, "new", 4)                                  # absent before: deleted at restore
    assert Child().inherited() == "patched" and module.f == 3 and module.new == 4
    p.restore()
    assert "inherited" not in Child.__dict__ and Child().inherited() == "base"
    assert isinstance(Child.__dict__["helper"], staticmethod) and Child.helper() == "static"
    assert module.f == 1 and not hasattr(module, "new")
    p.restore()                                              # nothing left: a second restore changes nothing
    assert module.f == 1
