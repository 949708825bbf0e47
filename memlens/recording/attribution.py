"""Attribution that comes from hooks rather than ops: module paths, categories, iteration marks.

Mixed into `Session`. The global hooks (`memlens.recording.hooks`) call these methods; they only append
to the session's compact streams (`marks`, `iter_marks`) and update its context word (`_ctx`: the
current module index << 2 | phase bits), which every op record copies.
"""
from __future__ import annotations

from time import perf_counter_ns

import torch

PHASE_OPTIMIZER = 2            # ctx bit: inside optimizer.step()

# category codes used in the `marks` stream (resolved by the builder)
MARK_PARAMETER, MARK_BUFFER, MARK_OPTIMIZER_STATE, MARK_GRADIENT, MARK_INPUT = range(5)
ITER_STEP, ITER_OPTIMIZER = 0, 1


class Attribution:
    """Hook-side half of a recording session (see `Session` for the state it uses)."""

    python_module_hooks = True     # module enter/exit come from hooks.py's Python module hooks

    # ---- categories and attribution (called from global hooks) -------------------------------
    def mark(self, tensor, category: int, module_idx: int = 0) -> None:
        """Record that `tensor`'s block has `category` (and, for parameters/buffers, its owning module)."""
        if not self.active or not isinstance(tensor, torch.Tensor):
            return
        try:
            with self.lock:
                self._mark_locked(tensor, category, module_idx)
        except Exception as exc:
            self.fail(exc)

    def _mark_locked(self, tensor, category: int, module_idx: int) -> None:
        st = tensor.untyped_storage()
        b = self._live.get(id(st))
        if b is None:
            b = self._discover(st, self.n_ops, perf_counter_ns(), True)
        if b >= 0 and (b, category) not in self._marked:   # state and params: once, not every step
            self._marked.add((b, category))
            self.buf.marks.data.extend((b, category, self.n_ops, module_idx))

    def _register_modules(self, root, prefix: str) -> None:
        """Name every module under `root` ("model.layers.3.attn") and mark its parameters and buffers."""
        for name, module in root.named_modules():
            idx = self._module_idx.get(id(module))
            if idx is None:
                path = f"{prefix}.{name}" if name and prefix else (name or prefix)
                self.module_paths.append(path)
                idx = self._module_idx[id(module)] = len(self.module_paths) - 1
            for p in module.parameters(recurse=False):
                self.mark(p, MARK_PARAMETER, idx)
                if p.grad is not None:
                    self.mark(p.grad, MARK_GRADIENT, idx)
            for b in module.buffers(recurse=False):
                self.mark(b, MARK_BUFFER, idx)

    def enter_module(self, module, args) -> None:
        """Forward pre-hook: push the module; a root module's tensor arguments are inputs."""
        if not self.active:
            return
        try:
            idx = self._module_idx.get(id(module))
            if idx is None:
                idx = self._name_unknown_module(module)
            is_root = not self._module_stack
            self._module_stack.append((id(module), self._ctx, module))
            self._ctx = (idx << 2) | (self._ctx & 3)
            if is_root:
                for a in args:
                    self.mark(a, MARK_INPUT)
        except Exception as exc:
            self.fail(exc)

    def exit_module(self, module) -> None:
        """Forward post-hook (also after an exception): pop back to the caller's module."""
        stack = self._module_stack
        key = id(module)
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] == key:
                self._ctx = stack[i][1]
                del stack[i:]
                return

    def _name_unknown_module(self, module) -> int:
        """A module not under `model=`: name it inside its parent, or as a new root by class name."""
        if self._module_stack:
            parent_id, _, parent = self._module_stack[-1]
            parent_path = self.module_paths[self._module_idx[parent_id]]
            child = next((n for n, m in parent.named_children() if m is module), type(module).__name__)
            self._register_modules(module, f"{parent_path}.{child}")
        else:
            self._register_modules(module, type(module).__name__)
        return self._module_idx[id(module)]

    def optimizer_pre(self, optimizer) -> None:
        """Optimizer step begins: parameters and their gradients are known for certain here."""
        if not self.active:
            return
        self._ctx |= PHASE_OPTIMIZER
        for group in optimizer.param_groups:
            for p in group["params"]:
                self.mark(p, MARK_PARAMETER)
                if p.grad is not None:
                    self.mark(p.grad, MARK_GRADIENT)

    def optimizer_post(self, optimizer) -> None:
        """Optimizer step ended: its state tensors are optimizer state; one optimizer iteration done."""
        self._ctx &= ~PHASE_OPTIMIZER
        if not self.active:
            return
        for state in list(optimizer.state.values()):
            for value in state.values():
                self.mark(value, MARK_OPTIMIZER_STATE)
        self.buf.iter_marks.data.extend((self.n_ops, ITER_OPTIMIZER))

    def mark_step(self) -> None:
        """`memlens.step()`: a new iteration starts at the next op."""
        if not self.active:
            return
        self.buf.iter_marks.data.extend((self.n_ops, ITER_STEP))
        self.mark_model_gradients()

    def mark_model_gradients(self) -> None:
        """The `.grad` of every parameter of `model=` is a gradient (at a step marker and at the end)."""
        if self.model is None or not self.active:
            return
        for p in self.model.parameters():
            if p.grad is not None:
                self.mark(p.grad, MARK_GRADIENT)

