"""A wall-clock deadline for `linzoo linearize` (`--max_wall_seconds`): a stage that reaches its share of the time
stops, saves, and the run goes on to the next stage and the final student, instead of being killed with nothing.

Each stage may run until its share of the time left when it starts, in proportion to its tokens among the stages
still to run (`stage_deadline`): a stage that is slower than planned cannot leave the later ones with nothing, and
time a stage does not use passes to the next. Every stage that runs takes at least one step, so a run that starts
past its deadline still ends in a saved student.
"""

import time

import torch
from transformers import TrainerCallback


def stage_deadline(deadline: float, stage_tokens: list[int], index: int, now: float | None = None) -> float:
    """The time (as `time.time()`) stage `index` may run until, given the run's `deadline` and every stage's tokens."""
    now = time.time() if now is None else now
    later = sum(stage_tokens[index:])
    share = stage_tokens[index] / later if later else 1.0
    return now + max(0.0, deadline - now) * share


class WallClockDeadline(TrainerCallback):
    """Stops training and saves a checkpoint at the first step that ends after `deadline` (a `time.time()` value).
    Under several processes they agree through one tiny all-reduce per step, so that none waits for the others."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.stopped = False

    def on_step_end(self, args, state, control, **kwargs):
        late = time.time() >= self.deadline
        if torch.distributed.is_available() and torch.distributed.is_initialized() and args.world_size > 1:
            flag = torch.tensor([float(late)], device=args.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            late = bool(flag.item())
        if late and state.global_step < state.max_steps:
            self.stopped = True
            control.should_training_stop = True
            control.should_save = True
        return control
