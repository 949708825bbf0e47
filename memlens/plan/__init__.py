"""Static offset planning: one arena, every block at a fixed offset, as close to max-live as possible.

`plan(source, time_limit_s=...)` runs the portfolio (published heuristics, exact search, local search) and
returns a validated `PlanResult`. See `memlens.plan.portfolio` for the stages.
"""
from __future__ import annotations

from memlens.plan.portfolio import PlanResult, plan
from memlens.plan.problem import PlanProblem, as_problem
from memlens.plan.validate import InvalidPlanError, plan_violations, validate_plan

__all__ = ["plan", "PlanResult", "PlanProblem", "as_problem", "validate_plan", "plan_violations",
           "InvalidPlanError"]
