"""The plan of a zoo: its steps (a row, or the teacher: its training command, its evals, its card), the resume state
(`<out>/zoo_state.json`), which rows are done, changed or broken, and the estimates. Imports the zoo file's model only.

A step is one row (`<mixer>/<variant>`, or the teacher): its training command, its evals, then `linzoo card`. Each
command is its own process, `python -m linzoo.cli ...`, its output appended to `<folder>.log`; the zoo sets what
ties a row into the zoo (--teacher, --mixer, --model_name_or_path: the parent's folder, --total_tokens: the budget,
--output_dir; an eval's --model and --out, and where an eval compares with the teacher's own results, those:
TEACHER_FLAGS), so the flags may not. A row trains once its parent is trained and is evaluated once the teacher is.
Resuming: a command whose output is there (a trained folder's lineage; an eval's results, measured on these
weights) is skipped unless zoo_state.json records another command line for it; anything else runs again, and the
trainers resume a killed run from its checkpoints (or refuse a folder of other arguments). A row whose folder holds
a training the zoo file no longer describes (its command changed, its parent's did, or its parent was trained again
after it) stops the build before anything runs, named with what changed; `--rebuild-changed` moves each such folder
to `<folder>.replaced-N` (nothing is deleted) and builds it again. A finished row is skipped only once its folder
passes its check (`integrity.verify_folder`: its weights and config.json are the bytes its run recorded the sha256
of, every JSON and safetensors file reads): one that fails it (or is gone) is moved aside the same way and built
again, with the rows built from it. `<out>/zoo_state.json`
keeps each command's line, exit code and seconds, which size the estimates of the steps left (a damaged one is
refused, named: moved aside, the build finds its finished rows by their folders). `--max-seconds`
stops every running command at that deadline (the next call resumes); `train_seconds` gives each training its own
(linearize's --max_wall_seconds: it stops, saves and is evaluated; a training that would start after it does not).
A build, and `--dry-run`, first check what it would fail on (`linzoo.zoo.check`). One build at a time holds
`<out>`: a build (or `--report-only`, which writes the report) takes `<out>/.zoo.lock` (an OS lock on the file,
which records the holder's pid, host and start: it ends with the process, however it ends), and another is refused,
named; `--dry-run` and `--check` write nothing there and take none. The report, `<out>/zoo.md`, `zoo.json` and
`zoo.png`, is written after every step. This is also the engine of the lent GPU's plans (scripts/device_jobs.sh
stages the machine, runs a build and packs its report).
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from linzoo.integrity import LINEAGE_FILE, read_json, write_json

from .model import COMMANDS, MODEL_FLAGS, TEACHER_FLAGS, Zoo, mixers_of, model_flags


STATE_FILE, CARD_FILE = "zoo_state.json", "README.md"


@dataclass
class Command:
    label: str  # "train", "eval <eval[/sub]>", "card"
    argv: list[str]  # after `linzoo`
    output: Path  # what it leaves when done: the lineage, the results file, the card
    tokens: int = 0
    command: str = ""  # a training command's name


@dataclass
class Step:
    name: str  # "teacher" or "<mixer>/<variant>"
    folder: Path
    mixer: str | None = None
    variant: str | None = None
    parent: str | None = None  # the step it trains on; None: the teacher
    train: Command | None = None
    evals: list[Command] = field(default_factory=list)
    card: Command | None = None
    out: Path | None = None  # the zoo's folder as given (the prefix of the paths in its commands)

    @property
    def log(self) -> Path:
        return Path(f"{self.folder}.log")

    @property
    def commands(self) -> list[Command]:
        return [c for c in (self.train, *self.evals, self.card) if c is not None]


def eval_commands(zoo: Zoo, model: str, folder: Path, teacher_eval: Path | None, variant: str | None = None
                  ) -> list[Command]:
    """The evals of one row (`teacher_eval`: where the teacher's results are; None: this is the teacher's row,
    which gets every eval; a student's row those whose `variants` list its variant, or that list none)."""
    from linzoo.evals.registry import get_eval

    out = []
    for e in zoo.evals:
        if variant is not None and e.variants is not None and variant not in e.variants:
            continue
        if teacher_eval is None and e.eval in MODEL_FLAGS:  # the teacher is measured in each student's run
            continue
        where = folder / "eval" / e.sub if e.sub else folder / "eval"
        result = get_eval(e.eval).result_file
        extra = []
        if teacher_eval is not None and e.eval in TEACHER_FLAGS:
            extra = TEACHER_FLAGS[e.eval](zoo.teacher, (teacher_eval / e.sub if e.sub else teacher_eval) / result)
        out.append(Command(f"eval {e.label}", ["eval", e.eval, *model_flags(e.eval, zoo.teacher, model), "--out",
                                               str(where), *extra, *e.flags],
                           where / result))
    return out


def plan(zoo: Zoo, out) -> list[Step]:
    """The teacher's evals, then every mixer's variants, parents first: the order steps start in."""
    out = Path(out)
    teacher = Step("teacher", out / "teacher", out=out)
    teacher.evals = eval_commands(zoo, zoo.teacher, teacher.folder, None)
    steps = [teacher]
    for mixer in zoo.mixers:
        for v in zoo.variants.values():
            if mixer not in mixers_of(v, zoo.mixers):
                continue
            folder = out / mixer / v.name
            parent = out / mixer / v.parent if v.parent else None
            tokens = v.tokens_for(mixer)
            argv = [v.command, *COMMANDS[v.command](zoo.teacher, mixer, parent and str(parent)),
                    "--total_tokens", str(tokens), *v.flags_for(mixer), "--output_dir", str(folder)]
            step = Step(f"{mixer}/{v.name}", folder, mixer, v.name, f"{mixer}/{v.parent}" if v.parent else None,
                        Command("train", argv, folder / LINEAGE_FILE, tokens, v.command), out=out)
            step.evals = eval_commands(zoo, str(folder), folder, teacher.folder / "eval", v.name)
            # --overwrite: the folder is the zoo's own, and sft's Trainer leaves its own README.md there
            step.card = Command("card", ["card", str(folder), "--overwrite"], folder / CARD_FILE)
            steps.append(step)
    return steps


JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
              bool: "true or false", type(None): "null"}


# a command's record -> its keys and their types (Build.record, Build.note_start): a finished command's (rc not
# null) has the first five, one only started (rc null) the first two
RECORD_KEYS = {"argv": list, "rc": (int, type(None)), "tokens": (int, float), "seconds": (int, float), "ended": str,
               "label": str, "command": str, "started": str, "out": str, "cwd": str}


def state_problem(state) -> str | None:
    """What in a zoo_state.json's content differs from what the build writes and reads (None: nothing)."""
    if not isinstance(state, dict):
        return f"{JSON_TYPES.get(type(state), type(state).__name__)}, not an object of steps"
    if not isinstance(state.get("steps"), dict):
        return '"steps" is missing' if "steps" not in state else f'"steps" is {JSON_TYPES[type(state["steps"])]}'
    for step, records in state["steps"].items():
        if not isinstance(records, dict):
            return f"steps.{step} is {JSON_TYPES[type(records)]}, not an object of commands"
        for label, record in records.items():
            where = f"steps.{step}.{label}"
            if not isinstance(record, dict):
                return f"{where} is {JSON_TYPES[type(record)]}, not a command's record"
            needed = list(RECORD_KEYS)[:2 if record.get("rc") is None else 5]
            missing = [key for key in needed if key not in record]
            if missing:
                return f"{where} lacks {', '.join(missing)}"
            for key, kind in RECORD_KEYS.items():
                value = record.get(key)
                if key in record and (not isinstance(value, kind) or isinstance(value, bool)):
                    return f"{where}.{key} is {JSON_TYPES.get(type(value), type(value).__name__)}"
            if not all(isinstance(word, str) for word in record["argv"]):
                return f"{where}.argv holds other than words"
    stopped = state.get("stopped", [])
    if not isinstance(stopped, list) or not all(isinstance(s, dict) for s in stopped):
        return '"stopped" is not an array of objects'
    return None


def _where(out) -> dict:
    """What a record keeps to read its paths from another folder: the zoo's folder as given, and the cwd."""
    return {"out": str(out), "cwd": os.getcwd()}


def _absolute(argv: list[str], out: str, cwd: str) -> list[str]:
    """argv with the zoo's folder `out` (as its commands spell it) made absolute from `cwd`."""
    root = os.path.normpath(os.path.join(cwd, out))
    return [root + w[len(out):] if w == out or w.startswith(out.rstrip("/") + "/") else w for w in argv]


def same_command(record: StateRecord, step: Step, cmd: Command) -> bool:
    """Whether a state record is `cmd`'s command line: the same words, or the same once the zoo's folder is made
    absolute on both sides (a build run as `--out runs/zoo` from its clone, read as `--out /abs/runs/zoo` elsewhere)."""
    if record["argv"] == cmd.argv:
        return True
    if not (record.get("out") and record.get("cwd") and step.out is not None):
        return False
    return _absolute(record["argv"], record["out"], record["cwd"]) == _absolute(cmd.argv, str(step.out), os.getcwd())


class StateRecord(TypedDict, total=False):
    """A command's record in zoo_state.json (`Build.record`; `Build.note_start` while it runs: rc None, "started")."""
    label: str
    argv: list[str]  # after `linzoo`
    rc: int | None  # None: started, not ended
    seconds: float
    tokens: int | float  # what it trained (a training), else its budget
    command: str
    started: str
    ended: str
    out: str  # the zoo's folder as given, and the cwd: its paths read from another folder (`same_command`)
    cwd: str


class ZooState(dict):
    """`<out>/zoo_state.json`: {"schema", "steps": {step name: {command label: StateRecord}}, "stopped": [what a
    deadline stopped], "train_began", "device"}. Read, saved and asked what is done here; the JSON is the dict."""

    @classmethod
    def read(cls, out) -> ZooState:
        """<out>/zoo_state.json, or a new state where there is none. A damaged one (not JSON, cut short, or not the
        shape the build writes) is a one-line ValueError naming the file and the way out, before anything reads it
        wrongly."""
        path = Path(out) / STATE_FILE
        if not path.is_file():
            return cls(schema="linzoo.zoo_state/v1", steps={})
        try:
            state = json.loads(path.read_bytes())
        except ValueError as err:  # a UnicodeDecodeError too
            why = f"not JSON: {' '.join(str(err).split())}"
        else:
            why = state_problem(state)
        if why:
            raise ValueError(f"{path} is damaged ({why}): move it aside (mv {shlex.quote(str(path))} "
                             f"{shlex.quote(f'{path}.damaged')}) and run again: the build then finds its finished "
                             "rows by their folders")
        return cls(state)

    def save(self, out):
        Path(out).mkdir(parents=True, exist_ok=True)
        write_json(Path(out) / STATE_FILE, self)

    def record(self, step: str, label: str) -> StateRecord | None:
        return self["steps"].get(step, {}).get(label)

    def is_done(self, step: Step, cmd: Command) -> bool:
        """Whether `cmd` need not run: its output is there (an eval's, measured on the folder's present weights) and
        zoo_state.json records no other command line for it."""
        record = self.record(step.name, cmd.label)
        if not cmd.output.is_file() or (record is not None and not same_command(record, step, cmd)):
            return False
        if cmd.label == "card":  # a README.md may be the Trainer's: the card is done where this build wrote it
            return record is not None and record["rc"] == 0
        if cmd.label.startswith("eval") and step.train is not None:
            from linzoo.evals.common import weights_sha256  # torch's import: only where an eval's output is there

            try:
                measured = json.loads(cmd.output.read_text()).get("weights_sha256")
            except (OSError, ValueError):
                return False
            return measured is not None and measured == weights_sha256(str(step.folder))
        return True


def replaced_rows(steps: list[Step], state: ZooState) -> list[tuple[Step, str]]:
    """The rows whose folder holds a training this zoo file no longer describes, parents first, with why: the zoo file
    changed the row's training command (zoo_state.json records another line for it, finished or killed mid-way), its
    parent is one of them, or its parent was trained again after it (its weights come from a parent that is gone).
    Rebuilding such a row needs its folder out of the way: the trainers refuse a folder of other arguments, and a stale
    descendant would pass for done."""
    found = {}
    for step in steps:
        if step.train is None or not step.folder.is_dir() or not any(step.folder.iterdir()):
            continue
        record = state["steps"].get(step.name, {}).get("train")
        parent_record = state["steps"].get(step.parent, {}).get("train") if step.parent else None
        if record is not None and not same_command(record, step, step.train):
            found[step.name] = (step, f"its training command changed in the zoo file "
                                      f"({argv_change(record['argv'], step.train.argv)})")
        elif step.parent in found:
            found[step.name] = (step, f"its parent {step.parent} is rebuilt")
        elif (record is not None and parent_record is not None and record.get("rc") == 0
              and parent_record.get("rc") == 0 and parent_record.get("ended", "") > record.get("ended", "")):
            found[step.name] = (step, f"its parent {step.parent} was trained again after it "
                                      f"({parent_record['ended']} > {record['ended']})")
    return list(found.values())


def argv_change(old: list[str], new: list[str]) -> str:
    """What differs between two command lines, word by word, each change with the flag it belongs to:
    "--dataset embedded -> long; --max_seq_length 256 -> 512"."""
    import difflib

    changes = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if op == "equal":
            continue
        first = (old[i1:i2] or new[j1:j2])[0]
        flag = old[i1 - 1] if i1 > 0 and old[i1 - 1].startswith("--") and not first.startswith("--") else ""
        was, now = " ".join(old[i1:i2]) or "(nothing)", " ".join(new[j1:j2]) or "(nothing)"
        changes.append(f"{flag} {was} -> {now}".strip())
    return "; ".join(changes)


def move_aside(step: Step, state: ZooState, say=print) -> Path | None:
    """Moves a row's folder (replaced, or failing its check) and its log to `<folder>.replaced-N` (the first N free)
    and forgets its commands in `state`: nothing is deleted. A row whose folder is gone: its commands are forgotten
    (None)."""
    if not step.folder.exists():
        state["steps"].pop(step.name, None)
        return None
    n = 1
    while Path(f"{step.folder}.replaced-{n}").exists():
        n += 1
    aside = Path(f"{step.folder}.replaced-{n}")
    step.folder.rename(aside)
    if step.log.is_file():
        step.log.rename(Path(f"{aside}.log"))
    state["steps"].pop(step.name, None)
    say(f"zoo: {step.name}: moved to {aside} (rebuilt from the zoo file)")
    return aside


def descendants(step: Step, steps: list[Step]) -> list[Step]:
    """The rows built from `step`'s weights: its children, theirs, and so on (in plan order, parents first)."""
    names, found = {step.name}, []
    for s in steps:
        if s.parent in names:
            names.add(s.name)
            found.append(s)
    return found


# the end of integrity.verify_folder's reasons: how to mend the file by hand (the zoo builds the row again instead)
MENDS = re.compile(r"; (copy it again|restore it)\b.*$")


def folder_problem(step: Step) -> str | None:
    """Why a finished row's folder is no longer the model its training saved (None: it is): it is gone, it lacks its
    lineage or weights, or `integrity.verify_folder` finds a file that does not read or whose sha256 is not the one
    the lineage records (the weights, config.json)."""
    from linzoo.integrity import verify_folder

    if not step.folder.is_dir():
        return "the folder is gone"
    if not step.train.output.is_file():
        return f"its {step.train.output.name} is gone"
    try:
        verify_folder(step.folder)
    except (OSError, ValueError) as err:
        return MENDS.sub("", " ".join(str(err).split()))
    return None if any(step.folder.glob("*.safetensors")) else "it holds no weights (*.safetensors)"


def broken_rows(steps: list[Step], state: ZooState) -> list[tuple[Step, str]]:
    """The finished rows (their training recorded as done with this command line, or its lineage there) whose folder
    fails its check (`folder_problem`), parents first, with why. Skipped as done, such a row would pass its broken
    weights on to its evals and children, or stop the build at its first eval with no way on. The rows built from
    one of them are not checked: they are built again with it."""
    found, rebuilt = [], set()
    for step in steps:
        if step.train is None or step.name in rebuilt:
            continue
        record = state["steps"].get(step.name, {}).get("train")
        finished = record is not None and record["rc"] == 0 and same_command(record, step, step.train)
        if not (finished or state.is_done(step, step.train)):
            continue
        why = folder_problem(step)
        if why:
            found.append((step, why))
            rebuilt |= {s.name for s in descendants(step, steps)}
    return found


def rebuild_broken(steps: list[Step], state: ZooState, say=print) -> list[Step]:
    """Each of `broken_rows`, said in a line, moved aside (`move_aside`: nothing is deleted) with the rows built from
    it, so that the build makes them again; the rows it found."""
    broken = broken_rows(steps, state)
    for step, why in broken:
        rows = descendants(step, steps)
        children = f" and the {len(rows)} row{'s' * (len(rows) != 1)} built from it" if rows else ""
        say(f"zoo: {step.name}: {step.folder} fails its check ({why}): rebuilding it{children}")
        for row in (step, *rows):
            move_aside(row, state, say)
    return [step for step, _ in broken]


def command_seconds(step: Step, cmd: Command, zoo: Zoo, state: ZooState) -> float:
    """What `cmd` should take: this build's own timings of its kind (training: the same command, the same mixer where
    measured), else the zoo file's figures (slowed down when jobs share a machine: `side_by_side`)."""
    done = [r | {"step": s} for s, records in state["steps"].items() for r in records.values()
            if r.get("rc") == 0 and r.get("seconds")]
    est = zoo.estimate
    alone = (zoo.jobs / est["side_by_side"]) if est["side_by_side"] and zoo.jobs > 1 else 1.0
    if cmd.label == "train":
        for same in ([r for r in done if r.get("command") == cmd.command and r["step"].split("/")[0] == step.mixer],
                     [r for r in done if r.get("command") == cmd.command]):
            if same:
                return cmd.tokens * sum(r["seconds"] for r in same) / sum(r["tokens"] for r in same)
        return (est["start_seconds"] + cmd.tokens / est["tokens_per_second"][cmd.command]) * alone
    same = [r["seconds"] for r in done if r.get("label") == cmd.label]
    if same:
        return sum(same) / len(same)
    return (est["eval_seconds"][cmd.label.split(" ", 1)[1]] if cmd.label != "card" else est["start_seconds"]) * alone


def makespan(tasks: list[tuple[str, float, list[str]]], jobs: int) -> float:
    """Seconds until the last of `tasks` ((name, seconds, names it waits for), in the order they start) ends, `jobs`
    at a time; a task waiting on a name not listed waits on nothing."""
    names = {t[0] for t in tasks}
    ends, running, now, pending = {}, [], 0.0, list(tasks)
    while pending or running:
        for t in list(pending):
            if len(running) >= jobs:
                break
            if all(d not in names or ends.get(d, math.inf) <= now for d in t[2]):
                pending.remove(t)
                running.append((now + t[1], t[0]))
        if not running:  # waiting on a task that cannot end: a loop (read_zoo refuses one)
            raise ValueError(f"tasks wait on each other: {[t[0] for t in pending]}")
        running.sort()
        now, name = running.pop(0)
        ends[name] = now
    return now


def duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 120:
        return f"{seconds} s"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min"


@dataclass
class Task:
    """What a build schedules: a step's training, or its evals with its card; `after`: the tasks it waits on."""
    name: str  # "<step>:train" | "<step>:eval"
    step: Step
    commands: list[Command]
    after: list[str]

    @property
    def trains(self) -> bool:
        return self.name.endswith(":train")


def tasks_of(steps: list[Step]) -> list[Task]:
    """Each step as its tasks: training (waits on the parent's training) and evaluation with the card (waits on the
    step's training and the teacher's evals)."""
    tasks = []
    for s in steps:
        if s.train:
            tasks.append(Task(f"{s.name}:train", s, [s.train], [f"{s.parent}:train"] if s.parent else []))
        tasks.append(Task(f"{s.name}:eval", s, [c for c in (*s.evals, s.card) if c],
                          [f"{s.name}:train", "teacher:eval"] if s.train else []))
    return tasks


def trained_tokens(lineage: Path) -> int | None:
    """The tokens a finished training's record (linzoo_training.json) says it trained; None where it has none."""
    try:
        return sum((read_json(lineage).get("tokens") or {}).values()) or None
    except (OSError, ValueError, AttributeError):
        return None


def plan_lines(zoo: Zoo, steps: list[Step], out, jobs: int, state: ZooState) -> list[str]:
    measured = sum(r.get("rc") == 0 for rec in state["steps"].values() for r in rec.values())
    lines = [f"zoo plan: {zoo.path} -> {out}: {len(zoo.mixers)} mixers, {len(zoo.variants)} variants: "
             f"{len(steps) - 1} students, and the teacher `{zoo.teacher}` evaluated once; {jobs} at a time",
             "each row's evals (results in <folder>/eval[/sub]), then `linzoo card <folder>`:"]
    lines += [f"  eval {e.label:18s} linzoo eval {e.eval} "
              f"{' '.join(model_flags(e.eval, zoo.teacher, '<folder>'))} "
              f"--out <folder>/eval{'/' * bool(e.sub)}{e.sub} {shlex.join(e.flags)}" for e in zoo.evals]
    lines += [f"  ({e.label} measures the teacher beside each student, in the same process: the teacher's row has "
              "none)" for e in zoo.evals if e.eval in MODEL_FLAGS]
    for e in zoo.evals:
        if e.eval in TEACHER_FLAGS:
            flags = shlex.join(TEACHER_FLAGS[e.eval](zoo.teacher, f"{out}/teacher/eval/..."))
            lines.append(f"  ({e.label} of a student adds {flags}: scored against the teacher row's results)")
    tasks = []
    for n, s in enumerate(steps, 1):
        left = [c for c in s.commands if not state.is_done(s, c)]
        secs = {c.label: command_seconds(s, c, zoo, state) for c in left}
        status = "done" if not left else "to do" if len(left) == len(s.commands) else "partly done"
        lines.append(f"[{n:2d}] {s.name:30s} from {s.parent or ('teacher' if s.train else '-'):30s} "
                     f"est. {duration(sum(secs.values())):>10s}  {status}  -> {s.folder}")
        if s.train:
            lines.append(f"     linzoo {shlex.join(s.train.argv)}")
        for t in tasks_of([s]):
            tasks.append((t.name, sum(secs.get(c.label, 0.0) for c in t.commands), t.after))
    how = f"this build's timings ({measured} commands) where measured, else " if measured else ""
    lines.append(f"total: est. {duration(makespan(tasks, jobs))} with {jobs} at a time ({how}the zoo file's estimate)")
    return lines
