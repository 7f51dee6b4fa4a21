"""The zoo engine behind `linzoo zoo`: a zoo file (`model`) becomes a plan of steps with their resume state and
estimates (`plan`), checked before anything runs (`check`), built (`run`: the build, the lock on its folder, the GPU
queue, the CLI) and reported after every step (`report`). The modules import one way, each only those before it:
model <- plan <- check, report <- run. This package's names are the public ones of those modules."""

from .model import EvalEntry, Variant, Zoo, merge_flags, read_queue, read_zoo
from .plan import STATE_FILE, Command, StateRecord, Step, Task, ZooState, command_seconds, makespan, move_aside, plan, \
    replaced_rows
from .run import LOCK_FILE, Build, Running, Status, holding, job_env, main, next_in_queue

__all__ = ["LOCK_FILE", "STATE_FILE", "Build", "Command", "EvalEntry", "Running", "StateRecord", "Status", "Step",
           "Task", "Variant", "Zoo", "ZooState", "command_seconds", "holding", "job_env", "main", "makespan",
           "merge_flags", "move_aside", "next_in_queue", "plan", "read_queue", "read_zoo", "replaced_rows"]
