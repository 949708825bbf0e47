"""Shared options of the verbs that can see the recording as a training cycle (ati, outliers, swap):
``--steady-state`` and ``--iteration K`` (memlens.analysis.ati.access_intervals, memlens.swap.plan_swaps)."""
from __future__ import annotations


def add_cycle_args(p) -> None:
    """Add --steady-state and --iteration to parser `p`."""
    g = p.add_argument_group("training cycle")
    g.add_argument("--steady-state", action="store_true",
                   help="treat a recorded iteration as one period of the training cycle: blocks alive across "
                        "the boundary (parameters, optimizer state) get their wrap-around interval")
    g.add_argument("--iteration", type=int, metavar="K", default=None,
                   help="only iteration K (from memlens.step() markers, optimizer steps or the detected period)")


def cycle_kwargs(args) -> dict:
    """{'steady_state': ..., 'iteration': ...} from the parsed options."""
    return {"steady_state": bool(getattr(args, "steady_state", False)), "iteration": getattr(args, "iteration", None)}


def cycle_text(doc: dict) -> str:
    """'steady state, iteration 2 (period 12.3 ms)' or 'the recording as a straight line'."""
    from memlens.units import format_ns
    if not doc.get("steady_state") and doc.get("iteration") is None:
        return "the recording as a straight line (no wrap-around)"
    parts = ["steady state" if doc.get("steady_state") else "one iteration"]
    if doc.get("iteration") is not None:
        parts.append(f"iteration {doc['iteration']}" + (" (the last after the warm-up; --iteration K picks "
                                                         "another)" if doc.get("iteration_default") else ""))
    if doc.get("period_ns"):
        parts.append(f"period {format_ns(float(doc['period_ns']))}")
    return ", ".join(parts)


def refuse_out_of_core(args) -> None:
    """--steady-state / --iteration need the whole trace in memory (the cycle spans every bucket)."""
    from memlens.errors import InputError
    if getattr(args, "steady_state", False) or getattr(args, "iteration", None) is not None:
        raise InputError("--steady-state and --iteration run on the memory engine only (a wrap-around interval "
                         "needs the whole iteration); add --engine memory")
