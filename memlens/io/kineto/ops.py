"""The ops of a Kineto/Chrome trace: ``cpu_op`` events (``Operator`` in 2021 traces), with the module and
profiler step around each one."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from memlens.errors import InputError
from memlens.io.kineto.attrib import innermost_enclosing

OP_CATEGORIES = ("cpu_op", "Operator", "operator")
_MODULE_PREFIX = "nn.Module: "
_STEP_PREFIX = "ProfilerStep#"


@dataclass
class OpTable:
    """Ops as arrays (times in the trace's microseconds) until the trace start is known."""

    names: list[str]
    thread: list[str]          # "pid/tid"
    start_us: np.ndarray
    end_us: np.ndarray
    external_id: np.ndarray    # -1 when absent
    modules: list[str]
    iteration: np.ndarray      # -1 when the op lies in no ProfilerStep#N
    args: list                 # each op's ``args`` dict (shapes, types, strides, scalars, ids)
    context: "_Context | None" = None   # the module spans and steps, for rows added later (`with_rows`)

    def __len__(self) -> int:
        return len(self.names)

    def with_rows(self, names: list[str], thread: list[str], start_us: np.ndarray, end_us: np.ndarray) -> "OpTable":
        """These ops and more, appended (no External id, no logged arguments), each with its module and
        iteration found as for the others."""
        start_us, end_us = np.asarray(start_us, np.float64), np.asarray(end_us, np.float64)
        modules = self.context.modules(list(thread), start_us) if self.context else [""] * len(names)
        iteration = self.context.iterations(start_us) if self.context else np.full(len(names), -1, np.int64)
        return OpTable(self.names + list(names), self.thread + list(thread), np.r_[self.start_us, start_us],
                       np.r_[self.end_us, end_us], np.r_[self.external_id, np.full(len(names), -1, np.int64)],
                       self.modules + modules, np.r_[self.iteration, iteration],
                       self.args + [{} for _ in names], self.context)

    def table(self, start_ns: np.ndarray, end_ns: np.ndarray, thread_code: np.ndarray) -> pd.DataFrame:
        """The `ops` table with ns times relative to the trace start."""
        return pd.DataFrame({
            "op_id": np.arange(len(self), dtype=np.int64), "name": self.names,
            "start_ns": start_ns, "end_ns": np.maximum(end_ns, start_ns), "module": self.modules,
            "iteration": pd.arrays.IntegerArray(self.iteration.clip(0), self.iteration < 0),
            "thread": self.thread,
            "external_id": pd.arrays.IntegerArray(self.external_id.clip(0), self.external_id < 0),
        })


def _spans(events: list, keep) -> tuple[list[dict], np.ndarray, np.ndarray, list[str]]:
    chosen = [e for e in events if type(e) is dict and e.get("ph") == "X" and keep(e)]
    start = np.array([e["ts"] for e in chosen], dtype=np.float64)
    end = start + np.array([e.get("dur", 0) or 0 for e in chosen], dtype=np.float64)
    if not (np.isfinite(end).all() and (np.abs(end) < 2.0**52).all()):
        raise InputError("a complete ('X') event's 'ts' or 'dur' is not a finite time in microseconds")
    thread = [f"{e.get('pid')}/{e.get('tid')}" for e in chosen]
    return chosen, start, end, thread


def _step_number(label: str) -> int:
    label = label.strip()
    return int(label) if label.isdigit() and len(label) < 18 else -1


def read_ops(events: list, where) -> OpTable:
    """Ops, modules and profiler steps of the trace's complete ("X") events."""
    try:
        ops, start, end, thread = _spans(events, lambda e: e.get("cat") in OP_CATEGORIES)
        names = [str(e.get("name", "")) for e in ops]
        args = [e.get("args") if type(e.get("args")) is dict else {} for e in ops]
        ext = np.array([a.get("External id", -1) for a in args], dtype=np.int64)
        mods, m_start, m_end, m_thread = _spans(
            events, lambda e: str(e.get("name", "")).startswith(_MODULE_PREFIX))
        steps, s_start, s_end, _ = _spans(events, lambda e: str(e.get("name", "")).startswith(_STEP_PREFIX))
        # "ProfilerStep#12" -> 12; a label that is not a number ("ProfilerStep#abc", from a user's own
        # record_function) is still a step annotation, with no number (-1)
        step_numbers = np.array([_step_number(str(e["name"])[len(_STEP_PREFIX):]) for e in steps], dtype=np.int64)
    except InputError as exc:
        raise InputError(exc.message, where) from None
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise InputError(f"malformed trace event ({type(exc).__name__}: {str(exc)[:120]})", where) from None
    context = _Context([str(m["name"])[len(_MODULE_PREFIX):] for m in mods], m_thread, m_start, m_end,
                       s_start, s_end, step_numbers)
    return OpTable(names, thread, start, end, ext, context.modules(thread, start), context.iterations(start),
                   args, context)


@dataclass
class _Context:
    """The ``nn.Module:`` spans and ``ProfilerStep#`` ranges of a trace (trace microseconds): what gives an
    op its module and iteration."""

    module_names: list[str]
    module_thread: list[str]
    module_start: np.ndarray
    module_end: np.ndarray
    step_start: np.ndarray
    step_end: np.ndarray
    step_numbers: np.ndarray

    def modules(self, thread: list[str], start: np.ndarray) -> list[str]:
        """The innermost module span around each (thread, start) ("" for none)."""
        if not self.module_names or not len(start):
            return [""] * len(start)
        codes, _ = pd.factorize(pd.Series(list(self.module_thread) + list(thread), dtype=object))
        t0 = min(start.min(), self.module_start.min())

        def ns(us: np.ndarray) -> np.ndarray:
            return np.rint((us - t0) * 1000).astype(np.int64)
        n = len(self.module_names)
        inner = innermost_enclosing(codes[:n], ns(self.module_start), ns(self.module_end), codes[n:], ns(start))
        return [self.module_names[i] if i >= 0 else "" for i in inner]

    def iterations(self, start: np.ndarray) -> np.ndarray:
        """The number of the profiler step whose range holds each start (-1 for none)."""
        iteration = np.full(len(start), -1, dtype=np.int64)
        if len(self.step_start) and len(start):
            order = np.argsort(self.step_start)
            pos = np.searchsorted(self.step_start[order], start, side="right") - 1
            inside = (pos >= 0) & (start <= self.step_end[order][pos.clip(0)])
            iteration[inside] = self.step_numbers[order][pos[inside]]
        return iteration
