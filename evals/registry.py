"""The registry of evals: name -> the module that declares it (`EVAL = common.EvalSpec(...)`).

Adding an eval is one module in this folder and one line here (CONTRIBUTING.md). Modules load on first use, as
transformers' auto mappings do, so that `linzoo <command>` does not import every eval to dispatch one. The order
is the order of cards' "Results" sections and of the Space's tables.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the registry itself stays import-light: `linzoo` dispatches commands through it
    from .common import EvalSpec

EVAL_MODULES = {
    "quality": "linzoo.evals.quality",
    "niah": "linzoo.evals.niah",
    "heads": "linzoo.evals.heads",
    "instruct": "linzoo.evals.instruct",
    "speed": "linzoo.evals.speed",
}


def get_eval(name: str) -> EvalSpec:
    if name not in EVAL_MODULES:
        raise ValueError(f"unknown eval {name!r}: pick one of {', '.join(EVAL_MODULES)}")
    return importlib.import_module(EVAL_MODULES[name]).EVAL


def all_evals() -> list[EvalSpec]:
    return [get_eval(name) for name in EVAL_MODULES]
