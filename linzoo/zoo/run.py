"""`linzoo zoo`: one command builds the zoo — every mixer as each variant of a zoo file (base, instruct,
instruct-distilled, ...), each evaluated beside the teacher, with one report. The build (`Build`), the lock on
`<out>`, the GPU queue and the CLI: the last module of the zoo package, importing the others.


    linzoo zoo --config recipes/135m/zoo-cpu.yaml --dry-run              # the plan and its time estimate; runs nothing
    linzoo zoo --config recipes/135m/zoo-cpu.yaml --out runs/zoo         # build it (run again after a kill: resumes)
    linzoo zoo --config recipes/135m/zoo-gpu.yaml --jobs 4 --max-seconds 1500
    linzoo zoo --config recipes/135m/zoo-gpu.yaml --check               # what it would fail on, one line each
    linzoo zoo --next recipes/135m/gpu-queue.txt                        # the queue's first build not yet reported
"""

from __future__ import annotations

import contextlib
import enum
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from linzoo.integrity import read_json

from . import check  # `check.check_plan` looked up at each call: a test may stand in for it
from .model import (DEADLINE_FLAGS, MIN_TRAIN_SECONDS, Zoo, _number, choose_mixers, choose_variants, queue_builds,
                    read_zoo)
from .plan import (Command, Step, Task, ZooState, _where, command_seconds, duration, makespan, move_aside, plan,
                   plan_lines, rebuild_broken, replaced_rows, same_command, tasks_of, trained_tokens)
from .report import machine, write_report


LOCK_FILE = ".zoo.lock"  # <out>'s: held by the build (or --report-only) writing it


def job_env(jobs: int, environ=None, cores: int | None = None, threads: int | None = None) -> dict:
    """The environment of each command: the zoo file's `threads` where it gives them; else, with `jobs` side by side,
    each gets its share of the cores as its threads (OMP_NUM_THREADS, which torch reads), unless the caller set that
    itself. On a 2-core machine a training run beside an eval, both with torch's default of a thread per core, trained
    at 15 tokens/s against ~200 alone. The thread count decides how a CPU's matrix products split their sums, so the
    last bits of every result: the same command at 1 and 2 threads trained different weights (a DeltaNet student,
    4,096 tokens: 225 of 392 tensors differ, by up to 6e-5), at the same threads the same bits."""
    env = dict(os.environ if environ is None else environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    elif jobs > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (cores or os.cpu_count() or 1) // jobs))
    return env


def die_with_parent():
    """On Linux, what a command runs first: SIGTERM when the zoo's process dies (even by SIGKILL), so that no orphan
    trains on holding its folder's lock (PR_SET_PDEATHSIG; looked up here, not in the forked child)."""
    if sys.platform != "linux":
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    return lambda: prctl(1, signal.SIGTERM)


@contextlib.contextmanager
def holding(out):
    """Holds the zoo's folder `out` for this process: an OS lock (flock) on `<out>/.zoo.lock`, which the kernel lets
    go when the process ends, however it ends (SIGKILL too), and in the file who holds it: pid, host, since. Held by
    another process: a ValueError naming it and what to do. The file stays: the lock is on it, not its being there
    (removing it while another process has it open would let two hold it)."""
    import fcntl
    import socket

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file: give a folder for the zoo (created if missing)")
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by the commands (Python opens it CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(held_by(out, path)) from None
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                  "since": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv}) + "\n").encode())
        yield path
    finally:
        os.close(fd)  # lets go of the lock


def held_by(out: Path, path: Path) -> str:
    """The refusal of a second build on `out`, naming the process that holds its lock file `path`."""
    try:
        holder = json.loads(path.read_text())
        who, stop = f"pid {holder['pid']} on {holder['host']}, since {holder['since']}", f"kill {holder['pid']}"
    except (OSError, ValueError, TypeError, KeyError):  # it has just taken the lock, and not yet written its record
        who, stop = "its record not yet written", "kill it"
    return (f"{out} is in use by another `linzoo zoo` ({who}; it holds {path}): two builds would train over each "
            f"other's rows; wait for it to end, or stop it ({stop}: a later run resumes), then run again "
            "(--dry-run and --check need no lock)")


def hold(out, stack: contextlib.ExitStack):
    """Takes `out`'s lock (`holding`) for the rest of `stack`, and SIGTERM ends this process through its exits:
    the build stops its commands and writes the report, the lock goes with the process."""
    stack.enter_context(holding(out))
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    stack.callback(signal.signal, signal.SIGTERM, previous)


class Status(str, enum.Enum):
    """A task's, or a step's, state in a build (a str: the report and zoo.json write its value)."""
    DONE = "done"
    FAILED = "failed"
    BLOCKED = "blocked"  # what it waits on failed, or its training time is spent
    RUNNING = "running"
    TO_DO = "to do"
    NOT_RUN = "not run"

    def __str__(self):
        return self.value


ENDED = (Status.DONE, Status.FAILED, Status.BLOCKED)


@dataclass
class Running:
    """A task's command running as a subprocess: which command of the task, since when, where its output goes."""
    task: Task
    index: int
    proc: subprocess.Popen
    started: float
    log: IO[str]

    @property
    def command(self) -> Command:
        return self.task.commands[self.index]


class Build:
    """Runs the plan: tasks start in plan order once what they wait on is done, `jobs` at a time; each command is a
    subprocess; progress lines, zoo_state.json and the report after each step."""

    def __init__(self, zoo: Zoo, steps: list[Step], out, jobs: int, max_seconds: float = 0, say=print):
        self.zoo, self.steps, self.out, self.jobs, self.say = zoo, steps, Path(out), jobs, say
        self.deadline = time.time() + max_seconds if max_seconds else None
        self.state = ZooState.read(out)
        self.tasks = tasks_of(steps)
        self.status: dict[str, Status] = {}  # task name -> DONE | FAILED | BLOCKED
        self.ran = set()  # steps that ran a command in this call (their card is written again)
        self.running: dict[str, Running] = {}  # task name -> its running command
        self.counted = set()  # steps whose end was announced
        self.env = job_env(jobs, threads=zoo.threads)  # every command's environment
        self.die_with_parent = die_with_parent()

    def seconds_left(self) -> float:
        now, tasks = time.time(), []
        for t in self.tasks:
            if self.status.get(t.name) in ENDED:
                continue
            first = self.running[t.name].index if t.name in self.running else 0
            secs = sum(command_seconds(t.step, c, self.zoo, self.state) for c in t.commands[first:]
                       if not self.state.is_done(t.step, c))
            if t.name in self.running:
                secs = max(0.0, secs - (now - self.running[t.name].started))
            tasks.append((t.name, secs, t.after))
        return makespan(tasks, self.jobs) if tasks else 0.0

    def record(self, step: Step, cmd: Command, rc: int, seconds: float):
        tokens = cmd.tokens
        if cmd.label == "train" and rc == 0:  # what it trained (a deadline may stop it early)
            tokens = trained_tokens(cmd.output) or tokens
        self.state["steps"].setdefault(step.name, {})[cmd.label] = {
            "label": cmd.label, "argv": cmd.argv, "rc": rc, "seconds": round(seconds, 1), "tokens": tokens,
            "command": cmd.command, "ended": time.strftime("%Y-%m-%d %H:%M:%S"),
            # the torch threads it ran with (torch's default, a thread per core, where the environment sets none)
            "threads": int(self.env.get("OMP_NUM_THREADS") or os.cpu_count() or 1), **_where(self.out)}
        self.state.save(self.out)

    def note_start(self, step: Step, cmd: Command):
        """Records a training's command line as it starts (rc None until it ends), so that a row killed mid-training
        whose command then changes in the zoo file is named by `replaced_rows`, not left to the trainer's refusal."""
        record = self.state["steps"].setdefault(step.name, {}).get(cmd.label)
        if record is None or not same_command(record, step, cmd):
            self.state["steps"][step.name][cmd.label] = {
                "label": cmd.label, "argv": cmd.argv, "rc": None, "tokens": cmd.tokens, "command": cmd.command,
                "started": time.strftime("%Y-%m-%d %H:%M:%S"), **_where(self.out)}
            self.state.save(self.out)

    def train_deadline(self, cmd: Command) -> list[str] | None:
        """The flags that end a training command by the zoo's `train_seconds` (counted from the first training start
        of this plan: the zoo file and its mixers, kept in zoo_state.json across calls); [] without one; None when its
        time is up."""
        if self.zoo.train_seconds is None:
            return []
        plan_key = f"{self.zoo.path} --mixers {','.join(self.zoo.mixers)}"
        began = self.state.setdefault("train_began", {})
        if plan_key not in began:
            began[plan_key] = time.time()
            self.state.save(self.out)
        left = began[plan_key] + self.zoo.train_seconds - time.time()
        if left < MIN_TRAIN_SECONDS:
            return None
        flag = DEADLINE_FLAGS.get(cmd.command)
        return [flag, str(int(left))] if flag else []

    def start_next(self, task: Task, index: int) -> bool | None:
        """Starts the task's first command from `index` that is not done; False when none is left, None when it is a
        training whose time (`train_seconds`) is up."""
        step = task.step
        for i in range(index, len(task.commands)):
            cmd = task.commands[i]
            if self.state.is_done(step, cmd) and not (cmd.label == "card" and step.name in self.ran):
                continue
            deadline = self.train_deadline(cmd) if cmd.label == "train" else []
            if deadline is None:
                return None
            self.ran.add(step.name)
            if cmd.label == "train":
                self.note_start(step, cmd)
            step.log.parent.mkdir(parents=True, exist_ok=True)
            log = open(step.log, "a")
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} $ linzoo {shlex.join(cmd.argv + deadline)}\n")
            log.flush()
            proc = subprocess.Popen([sys.executable, "-m", "linzoo.cli", *cmd.argv, *deadline], stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    preexec_fn=self.die_with_parent, env=self.env)
            self.running[task.name] = Running(task, i, proc, time.time(), log)
            self.say(f"  {step.name}: {cmd.label} started (log: {step.log})")
            return True
        return False

    def end_task(self, task: Task, status: Status, why: str = ""):
        self.status[task.name] = status
        step = task.step
        if step.name in self.counted or (status == Status.DONE and task.trains):
            return
        self.counted.add(step.name)
        n = f"[{len(self.counted)}/{len(self.steps)}] {step.name}:"
        took = sum(r.get("seconds", 0) for r in self.state["steps"].get(step.name, {}).values())
        if status == Status.DONE and step.name not in self.ran:
            self.say(f"{n} done earlier (skipped)")
        elif status == Status.DONE:
            self.say(f"{n} done in {took:.0f} s, est. left {duration(self.seconds_left())}")
        else:
            self.say(f"{n} {'FAILED: ' if status == Status.FAILED else ''}{why}")
        write_report(self.zoo, self.steps, self.out, self.state, self.status_of)

    def status_of(self, step: Step) -> Status:
        names = [f"{step.name}:train"] * bool(step.train) + [f"{step.name}:eval"]
        states = [self.status.get(n) for n in names]
        if all(s == Status.DONE for s in states):
            return Status.DONE
        if any(s in (Status.FAILED, Status.BLOCKED) for s in states):
            return Status.FAILED if Status.FAILED in states else Status.NOT_RUN
        return Status.RUNNING if any(n in self.running for n in names) else Status.TO_DO

    def stop_all(self):
        """Stops what runs (a deadline, an interrupt). A stopped command is no result, but the time it ran is part of
        the build's: zoo_state.json's "stopped" keeps it (scripts/zoo_results.py counts it)."""
        for job in self.running.values():
            job.proc.terminate()
        stopped = []
        for job in self.running.values():
            try:
                job.proc.wait(30)
            except subprocess.TimeoutExpired:
                job.proc.kill()
                job.proc.wait()
            job.log.close()
            # stamped once it has exited: the seconds it took to stop are the build's too
            stopped.append({"step": job.task.step.name, "label": job.command.label,
                            "seconds": round(time.time() - job.started, 1),
                            "ended": time.strftime("%Y-%m-%d %H:%M:%S")})
        self.running.clear()
        if stopped:
            self.state.setdefault("stopped", []).extend(stopped)
            self.state.save(self.out)

    def run(self) -> int:
        self.state["device"] = machine()  # what the report names (a build resumed elsewhere: the last machine)
        pending = list(self.tasks)
        try:
            while pending or self.running:
                if self.deadline and time.time() > self.deadline:
                    self.stop_all()
                    left = len(self.steps) - sum(self.status_of(s) == Status.DONE for s in self.steps)
                    self.say(f"zoo: not finished: the deadline (--max-seconds) came with {left} steps left; run the "
                             "same command again (it resumes)")
                    return 3
                # under `train_seconds` the trainings start first: evals started before them would spend their time
                order = sorted(pending, key=lambda t: not t.trains) if self.zoo.train_seconds \
                    else list(pending)
                for task in order:
                    if len(self.running) >= self.jobs:
                        break
                    after = [self.status.get(a) for a in task.after]
                    if any(a in (Status.FAILED, Status.BLOCKED) for a in after):
                        pending.remove(task)
                        bad = next(a for a in task.after if self.status.get(a) in (Status.FAILED, Status.BLOCKED))
                        what = "not evaluated" if not task.trains and task.step.train else "not run"
                        self.end_task(task, Status.BLOCKED, f"{what}: {bad.split(':')[0]} did not finish")
                    elif all(a == Status.DONE for a in after):
                        pending.remove(task)
                        started = self.start_next(task, 0)
                        if started is None:
                            self.end_task(task, Status.BLOCKED, f"not trained: the zoo's train_seconds "
                                                           f"({self.zoo.train_seconds:g} s) are spent")
                        elif not started:
                            self.end_task(task, Status.DONE)
                for name, job in list(self.running.items()):
                    rc = job.proc.poll()
                    if rc is None:
                        continue
                    job.log.close()
                    del self.running[name]
                    task, cmd = job.task, job.command
                    self.record(task.step, cmd, rc, time.time() - job.started)
                    if rc != 0:
                        what = " ".join(cmd.argv[:2] if cmd.argv[0] == "eval" else cmd.argv[:1])
                        log = task.step.log
                        self.end_task(task, Status.FAILED, f"`linzoo {what}` exited with {rc}: {last_line(log)} "
                                                           f"(log: {log})")
                    elif not self.start_next(task, job.index + 1):
                        self.end_task(task, Status.DONE)
                time.sleep(0.2)
        finally:
            self.stop_all()
            write_report(self.zoo, self.steps, self.out, self.state, self.status_of)
        failed = [s.name for s in self.steps if self.status_of(s) != Status.DONE]
        if failed:
            self.say(f"zoo: FAILED: {', '.join(failed)} did not finish (their logs: <folder>.log); the report: "
                     f"{self.out / 'zoo.md'}")
            return 1
        self.say(f"zoo: done: {len(self.steps)} steps; the report: {self.out / 'zoo.md'}")
        return 0


def last_line(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines()[-40:] if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


def next_in_queue(queue, results) -> tuple[str, list[str]] | None:
    """The queue's first build that no report under `results` (any `zoo.json` below it, as results/gpu/<date>/ keep
    them) shows complete: the same zoo file's name and mixers, a done row for every step of its plan. None when all
    are."""
    reports = []
    for p in sorted(Path(results).rglob("zoo.json")) if Path(results).is_dir() else []:
        data = read_json(p)
        if isinstance(data, dict) and data.get("schema") == "linzoo.zoo/v1":
            reports.append(data)
    for zoo_file, args, zoo in queue_builds(queue):
        wanted = {s.name for s in plan(zoo, "_")}
        if not any(Path(r.get("zoo_file", "")).name == Path(zoo_file).name and set(report_mixers(r)) == set(zoo.mixers)
                   and wanted <= {row.get("step") for row in r.get("rows") or [] if row.get("state") == "done"}
                   for r in reports):
            return zoo_file, args
    return None


def report_mixers(report: dict) -> list[str]:
    """The mixers a zoo.json built: its `mixers`, or (a report written before it had them) its rows'."""
    return report.get("mixers") or list(dict.fromkeys(row["mixer"] for row in report.get("rows") or []
                                                      if row.get("mixer")))


def main(argv: list[str] | None = None) -> int:
    from linzoo.arguments import ArgumentParser

    parser = ArgumentParser(prog="linzoo zoo", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="the zoo file (YAML): teacher, mixers, jobs, variants, evals, estimate")
    parser.add_argument("--next", metavar="QUEUE",
                        help="print the first build of this queue file (`ZOO_FILE [--mixers a,b]` a line) that no "
                             "zoo.json under --results shows complete; runs nothing (exit 1: none is left)")
    parser.add_argument("--results", default="results/gpu", help="where --next looks for reports (default: %(default)s)")
    parser.add_argument("--out", default="runs/zoo", help="the zoo's folder: <out>/<mixer>/<variant>, the report")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and its time estimate; run nothing")
    parser.add_argument("--report-only", action="store_true",
                        help="write the report (zoo.md, zoo.json, zoo.png) of what --out holds; run nothing")
    parser.add_argument("--jobs", type=int, help="steps side by side (default: the zoo file's jobs)")
    parser.add_argument("--mixers", help="build only these of the zoo file's mixers (comma-separated), with the "
                                         "teacher: a part of the zoo that fits one lease")
    parser.add_argument("--variants", help="build only these of the zoo file's variants (comma-separated), with the "
                                           "variants they are trained from: a part of a build (e.g. the first step "
                                           "of a token ladder), the rest later in the same --out")
    parser.add_argument("--max-seconds", type=float, default=0.0,
                        help="stop every running command at this deadline (the next call resumes); 0: none")
    parser.add_argument("--rebuild-changed", action="store_true",
                        help="rows whose folder holds a training the zoo file no longer describes (its command "
                             "changed, or its parent's did): move each folder to <folder>.replaced-N and build it "
                             "again, with its descendants; without it such a build stops first and names them")
    parser.add_argument("--print-command", metavar="ROW",
                        help="print ROW's training command (ROW: <mixer>/<variant>, as the plan names it) as the build "
                             "would run it, in <out>, shell-quoted; runs nothing")
    parser.add_argument("--check", action="store_true",
                        help="what the plan would fail on that can be seen now (imports, the teacher, every command's "
                             "flags, the eval data), one line each; runs nothing (a build checks this first)")
    args = parser.parse_args(argv)
    if args.next:
        entry = next_in_queue(args.next, args.results)
        if entry is None:
            print(f"zoo: every build of {args.next} has a complete report under {args.results}")
            return 1
        print(shlex.join([entry[0], *entry[1]]))
        return 0
    if not args.config:
        raise ValueError("give --config ZOO_FILE (or --next QUEUE)")
    zoo = read_zoo(args.config)
    if args.jobs is not None:
        zoo.jobs = int(_number(args.jobs, "--jobs", integer=True))
    if args.mixers is not None:
        choose_mixers(zoo, args.mixers)
    if args.variants is not None:
        choose_variants(zoo, args.variants)
    if args.max_seconds < 0 or not math.isfinite(args.max_seconds):
        raise ValueError(f"--max-seconds {args.max_seconds}: give a number of seconds >= 0 (0: no deadline)")
    steps = plan(zoo, args.out)
    if args.print_command:
        row = next((s for s in steps if s.name == args.print_command), None)
        if row is None or row.train is None:
            rows = ", ".join(s.name for s in steps if s.train)
            raise ValueError(f"--print-command {args.print_command}: no such row of {args.config} (its rows: {rows})")
        print(shlex.join(["linzoo", *row.train.argv]))
        return 0
    say = lambda line: print(line, flush=True)  # noqa: E731
    with contextlib.ExitStack() as held:
        writes = args.report_only or not (args.dry_run or args.check)
        locked = writes and (args.report_only or Path(args.out).is_dir())
        if locked:  # a build already there is named before anything else
            hold(args.out, held)
        state = ZooState.read(args.out)
        if args.report_only:
            rows = write_report(zoo, steps, args.out, state)
            print(f"zoo: the report of {sum(r['state'] == 'done' for r in rows)} of {len(rows)} steps done: "
                  f"{Path(args.out) / 'zoo.md'}")
            return 0
        say("\n".join(plan_lines(zoo, steps, args.out, zoo.jobs, state)))
        replaced = replaced_rows(steps, state)
        if args.dry_run:
            for step, why in replaced:
                say(f"zoo: {step.name}: {why}: built again with --rebuild-changed")
        problems = check.check_plan(args.config, args.mixers, args.out, args.variants)
        for line in problems:
            say(f"zoo: check: {line}")
        if problems or args.check:
            say(f"zoo: check: {len(problems)} problems" + (": fix them, then run again" if problems else ": ready"))
            return 2 if problems else 0
        if args.dry_run:
            return 0
        if not locked:  # a new folder, made once the check passed (a build it stops leaves none)
            hold(args.out, held)
            state = ZooState.read(args.out)
            replaced = replaced_rows(steps, state)
        for step, why in replaced:
            say(f"zoo: {step.name}: {why}")
            if args.rebuild_changed:
                move_aside(step, state, say=say)
        if replaced and not args.rebuild_changed:
            say(f"zoo: {len(replaced)} rows hold trainings this zoo file no longer describes: pass --rebuild-changed "
                "to move their folders to <folder>.replaced-N (nothing is deleted) and build them again, or run the "
                "zoo file that built them")
            return 2
        if rebuild_broken(steps, state, say=say) or replaced:
            state.save(args.out)
        return Build(zoo, steps, args.out, zoo.jobs, args.max_seconds, say=say).run()
