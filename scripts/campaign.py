"""The Python half of `device_jobs.sh campaign`: reads the campaign file, checks before any GPU minute is spent,
sizes the runs from the speed phase, and packs the results. device_jobs.sh calls it; see its header for the campaign.

    python scripts/campaign.py show CAMPAIGN phase|speed|eval|run       the lines of one kind, for the shell
    python scripts/campaign.py check CAMPAIGN --dev .dev [--dry]        bundles, imports, paths, every line's flags
    python scripts/campaign.py size CAMPAIGN --bench bench_speed.json --seconds S --out sized.runs
    python scripts/campaign.py report --campaign C --work WORK --out OUT
    python scripts/campaign.py next QUEUE --results results/gpu          the queue's first campaign not yet done

A campaign file: one line each, `#` starts a comment line.
    phase NAME SECONDS          the plan, in order: speed, train, eval (planned seconds; the time accounting)
    side_by_side X              aggregate tokens/s of the runs sharing one card over one run's alone
    startup SECONDS             of each training run before its first step (loading, packing, the fitted start)
    speed SCRIPT [flags]        a script of scripts/ for the speed phase (run with --teacher and --out added)
    eval niah|quality [flags]   flags for `linzoo eval niah|quality` of the teacher and every student
    eval speed [flags]          flags for one `linzoo eval speed` of the teacher and every student together, first and
                                alone on the card (its --models and --out are the campaign's). A campaign with eval
                                lines runs those evals only; one without runs NIAH and quality with their defaults.
    NAME MIXER TOKENS [flags]   a training run: `linzoo linearize` with recipes/135m/linearize.yaml and these flags
                                (any linearize flag); TOKENS the most it gets (the speed phase may size it down)
The run lines alone (recipes/135m/ablation.runs) are a campaign of the `start wait eval` phases.
"""

import argparse
import json
import os
import re
import shlex
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "135m" / "linearize.yaml"
KEYWORDS = ("phase", "side_by_side", "startup", "speed", "eval")
PHASES = ("speed", "train", "eval")
EVALS = ("niah", "quality", "speed")  # the `eval` lines' kinds: each a `linzoo eval` command
STAGES = ("stage1-attention-transfer", "stage2-hidden-alignment", "stage3-kd")
# What the GPU image lacks and the plan imports: module -> the wheels that carry it (`../shared/device/prepare.sh`
# puts them in the bundles; pass any missing one to it). CUDA_ONLY modules are imported on the GPU only.
NEEDS = {
    "fla": ("flash_linear_attention", "fla_core"),
    "tilelang": ("tilelang", "apache_tvm_ffi", "torch_c_dlpack_ext", "z3_solver"),  # a correct GDN backward on Hopper
    "gguf": ("gguf",),
    "trl": ("trl",),
    "datasets": ("datasets", "dill", "multiprocess"),
    "lm_eval": ("lm_eval", "sacrebleu", "portalocker", "tabulate", "lxml", "chardet", "colorama", "more_itertools"),
    "mlstm_kernels": ("mlstm_kernels",),
}
CUDA_ONLY = {"fla", "tilelang"}
MAX_FILES, MAX_BYTES = 8, 16 * 2**20  # what comes back from one device call


def read_campaign(path):
    """{"phases": [(name, seconds)], "side_by_side", "startup", "speed": [[script, *flags]], "eval": {kind: flags},
    "runs": [[name, mixer, tokens, *flags]]}; a bad line raises ValueError naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"campaign file {path} does not exist")
    c = {"phases": [], "side_by_side": 1.0, "startup": 0.0, "speed": [], "eval": {}, "runs": []}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        words = shlex.split(line, comments=True)
        if not words:
            continue
        where = f"{path}:{number}"
        kind = words[0]
        try:
            if kind == "phase":
                name, seconds = words[1], float(words[2])
                if name not in PHASES or len(words) != 3 or seconds <= 0:
                    raise ValueError
                c["phases"].append((name, seconds))
            elif kind in ("side_by_side", "startup"):
                c[kind] = float(words[1])
            elif kind == "speed":
                if not (ROOT / "scripts" / words[1]).is_file():
                    raise ValueError
                c["speed"].append(words[1:])
            elif kind == "eval":
                if words[1] not in EVALS or words[1] in c["eval"]:
                    raise ValueError
                c["eval"][words[1]] = words[2:]
            else:
                int(words[2])
                if not re.fullmatch(r"[A-Za-z0-9_-]+", kind):
                    raise ValueError
                c["runs"].append(words)
        except (IndexError, ValueError):
            raise ValueError(f"{where}: cannot read {line.strip()!r} (the line kinds: see scripts/campaign.py)") from None
    names = [r[0] for r in c["runs"]]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: run names repeat: {names}")
    if c["phases"] and [p for p, _ in c["phases"]] != [p for p in PHASES if p in dict(c["phases"])]:
        raise ValueError(f"{path}: phases must come in the order {', '.join(PHASES)}")
    return c


def show(c, kind):
    if kind == "phase":
        return [f"{name} {seconds:g}" for name, seconds in c["phases"]]
    if kind == "speed":
        return [shlex.join(words) for words in c["speed"]]
    if kind == "eval":
        return [shlex.join([k, *flags]) for k, flags in c["eval"].items()]
    return [shlex.join(words) for words in c["runs"]]


# ------------------------------------------------------------------------------------------ check


def run_config(run, teacher="embedded", extra=()):
    """The LinearizeConfig a run line gives, parsed as device_jobs.sh runs it (YAML < its flags < `extra`, TRAIN_ARGS)."""
    from trl import TrlParser

    from linzoo.trainers.linearize_config import LinearizeConfig

    name, mixer, tokens, *flags = run
    argv = ["--config", str(RECIPE), "--teacher", teacher, "--mixer", mixer, "--total_tokens", tokens,
            "--output_dir", str(Path(tempfile.gettempdir()) / name), *flags, *extra]
    try:
        (cfg,) = TrlParser(LinearizeConfig).parse_args_and_config(argv)
    except SystemExit:  # argparse has printed what it did not understand
        raise ValueError(f"run {name}: its flags do not parse (argparse's message above): {shlex.join(flags)}") from None
    except ValueError as err:
        raise ValueError(f"run {name}: {err}") from None
    return cfg


def wheel_names(dev):
    """Distribution names (lower case, `_` for `-`) of the wheels the bundles' MANIFEST lists, and the errors found:
    no bundle, a MANIFEST file that no bundle holds."""
    bundles = sorted(p for p in Path(dev).glob("b[0-9]*") if p.is_dir())
    if not bundles:
        return set(), [f"no bundles in {dev} (b0, b1, ...): run `bash ../shared/device/prepare.sh` in the checkout"]
    listed, present = set(), set()
    for b in bundles:
        present |= {p.name for p in b.iterdir()}
        if (b / "MANIFEST").is_file():
            listed |= set((b / "MANIFEST").read_text().split())
    errors = [f"{dev}: MANIFEST lists {f} but no bundle holds it: run prepare.sh again" for f in sorted(listed - present)]
    if not listed:
        errors.append(f"{dev}: the bundles have no MANIFEST: run prepare.sh again")
    return {re.sub(r"[-_.]+", "_", f.split("-")[0]).lower() for f in listed if f.endswith(".whl")}, errors


def needed_modules(c):
    """The modules of NEEDS this plan imports: lm_eval only with a NIAH or quality line, mlstm_kernels only for xlstm."""
    xlstm = any("xlstm" in w for line in c["runs"] + c["speed"] for w in line)
    lm_eval = bool({"niah", "quality"} & set(c["eval"]))
    return [m for m in NEEDS if (m != "lm_eval" or lm_eval) and (m != "mlstm_kernels" or xlstm)]


def check(c, dev, dry, teacher, extra=()):
    """Every error the plan would meet on the GPU that can be seen here, as one list (empty: ready)."""
    import importlib

    errors = []
    dev = Path(dev)
    modules = needed_modules(c)
    if dry:  # the bundles are carried one per call and installed by stage.sh: here, their manifest must list them
        wheels, errors = wheel_names(dev)
        for m in modules:
            missing = [w for w in NEEDS[m] if w not in wheels]
            if wheels and missing:
                errors.append(f"the plan imports {m}, but no bundle in {dev} carries {', '.join(missing)}: "
                              f"run `bash ../shared/device/prepare.sh {' '.join(missing)}`")
    for m in modules:
        if dry and m in CUDA_ONLY:
            continue
        try:
            importlib.import_module(m)
        except Exception as err:  # noqa: BLE001 - any failure to import is the finding
            errors.append(f"{m} is not importable here ({type(err).__name__}: {err})"
                          + ("" if dry else ": did `. .dev/stage.sh` install every bundle?"))
    if teacher == "embedded" and not dry and not os.environ.get("TEACHER_GGUF"):
        errors.append("TEACHER_GGUF is not set: `. .dev/stage.sh` sets it once every bundle has arrived")
    elif teacher != "embedded" and not Path(teacher).exists():
        errors.append(f"teacher {teacher} does not exist")
    embedded = False
    for run in c["runs"]:
        try:
            cfg = run_config(run, teacher, extra)
        except ValueError as err:
            errors.append(str(err))
            continue
        embedded |= cfg.dataset == "embedded" or (cfg.chat_fraction > 0 and cfg.chat_dataset == "embedded")
        if cfg.dataset in ("long", "embedded-long"):
            from linzoo.corpus.long import bundle_dir

            try:
                bundle_dir(dev / "corpus")
            except FileNotFoundError as err:
                errors.append(f"run {run[0]} trains on the long corpus: {err}")
    from transformers import HfArgumentParser

    from linzoo.evals import niah, quality, speed
    from linzoo.evals.common import parse_list

    if "speed" in c["eval"]:  # the flags alone: its models (the teacher, the students) exist only on the GPU
        try:
            args = HfArgumentParser(speed.SpeedArguments).parse_args(c["eval"]["speed"])
            if not all(n > 0 for f in (args.lengths, args.batch_sizes) for n in parse_list(f, int) or [0]):
                raise ValueError
            if args.models or args.out:
                errors.append("eval speed: drop --models and --out: the campaign measures the teacher and every "
                              "student, into its own folder")
        except SystemExit:
            errors.append(f"eval speed: its flags do not parse (argparse's message above): {shlex.join(c['eval']['speed'])}")
        except ValueError:
            errors.append(f"eval speed: --lengths {args.lengths} --batch_sizes {args.batch_sizes}: give positive "
                          "whole numbers, comma-separated, each once")
    for kind, dataclass in (("niah", niah.NiahArguments), ("quality", quality.QualityArguments)):
        if kind not in c["eval"]:
            continue
        try:
            (args,) = HfArgumentParser(dataclass).parse_args_into_dataclasses(args=c["eval"][kind])
        except SystemExit:
            errors.append(f"eval {kind}: its flags do not parse (argparse's message above): {shlex.join(c['eval'][kind])}")
            continue
        if kind == "quality":
            embedded |= args.heldout == "embedded"
            missing = [t for t in quality.TASKS if not (dev / "eval" / f"{t}.jsonl").is_file()]
            if missing:
                errors.append(f"eval quality reads the five sets from {dev / 'eval'}, which lacks {', '.join(missing)}: "
                              "copy ../shared/data/eval there")
    if embedded and not (dev / "lzcache" / "data").is_dir():
        errors.append(f"the plan reads the embedded text, but {dev / 'lzcache'}/data is missing: copy the linzoo cache "
                      "(~/.cache/linzoo, after one run on the embedded text) there")
    return errors


# ------------------------------------------------------------------------------------------- size


def size(c, bench, seconds, mixer, extra=()):
    """Equal tokens per run that fit `seconds` of training side by side, from the speed phase's stage tokens/s:
    min(each line's TOKENS, (seconds - startup) / the slowest run's seconds per token). Returns (tokens, lines)."""
    stages = bench["rows"][mixer]["stages"]
    alone = [stages[s]["steady_tok_s"] or stages[s]["wall_tok_s"] for s in STAGES]
    n = len(c["runs"])
    shared = [r * c["side_by_side"] / n for r in alone]  # each run's share of the card
    lines, worst, per_step = [], 0.0, 1
    for run in c["runs"]:
        cfg = run_config(run, extra=extra)
        f = cfg.stage_fractions
        cost = sum(fi / sum(f) / r for fi, r in zip(f, shared))
        worst = max(worst, cost)
        per_step = max(per_step, cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps * cfg.max_seq_length)
        lines.append(f"  {run[0]:16s} {cost * 1e6:8.1f} s per million tokens side by side")
    fits = int(max(0.0, seconds - c["startup"]) / worst) // per_step * per_step
    tokens = max(per_step, min([fits] + [int(r[2]) for r in c["runs"]]))
    lines.insert(0, f"size: {mixer} alone {' / '.join(f'{r:,.0f}' for r in alone)} tokens/s in stages 1/2/3; {n} runs "
                    f"side by side at {c['side_by_side']:g}x one run's aggregate; {seconds:g} s - {c['startup']:g} s start-up")
    lines.append(f"size: {fits:,} tokens per run fit; each run gets {tokens:,} (the lines ask for at most "
                 f"{max(int(r[2]) for r in c['runs']):,})")
    return tokens, lines


# ----------------------------------------------------------------------------------------- report


def phase_times(state, c):
    out = []
    for name, planned in c["phases"]:
        began, ended = (state / f"{name}.{e}" for e in ("began", "ended"))
        b = float(began.read_text()) if began.is_file() else None
        e = float(ended.read_text()) if ended.is_file() else None
        used = None if b is None else round((e if e is not None else time.time()) - b)
        out.append({"phase": name, "planned_s": planned, "used_s": used,
                    "state": "done" if e is not None else "running" if b is not None else "not started"})
    return out


def _fmt(x, spec=".3f"):
    return "—" if x is None else format(x, spec)


def report(c, campaign, work, out, failed=""):
    """Writes OUT as results/gpu/<date>/ will hold it: README.md (the tables), speed.json, training.json, eval.json,
    card.txt, campaign.log and details.tgz (every log, record and plot); checks the device's limits on them."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from gpu_training_summary import summarize

    work, out = Path(work), Path(out)
    state = work / "campaign"
    out.mkdir(parents=True, exist_ok=True)
    card = (out / "card.txt").read_text().strip() if (out / "card.txt").is_file() else "unknown"
    times = phase_times(state, c)
    speed = {p.stem: json.loads(p.read_text()) for p in sorted((state / "speed").glob("*.json"))}
    if (state / "size.txt").is_file():
        speed["size"] = (state / "size.txt").read_text().splitlines()
    (out / "speed.json").write_text(json.dumps(speed, indent=1))
    runs = summarize(work / "runs") if (work / "runs").is_dir() else {}
    failed = [line for line in failed.splitlines() if line.strip()]  # device_jobs.sh's failures(): a line each
    done = all(t["state"] == "done" for t in times) and not failed  # a failed run or eval leaves it to be fired again
    (out / "training.json").write_text(json.dumps({"card": card, "campaign": Path(campaign).name, "complete": done,
                                                   "failed": failed, "runs": runs}, indent=1))
    evals = {}
    for f in sorted((work / "eval").glob("*/*/*.json")):  # <model>/<kind>/<kind>.json
        evals.setdefault(f.parts[-3], {})[f.stem] = json.loads(f.read_text())
    (out / "eval.json").write_text(json.dumps(evals, indent=1))
    with tarfile.open(out / "details.tgz", "w:gz") as tar:  # records and logs, never weights or tokenizers
        for pattern in ("runs/*.log", "runs/*/linzoo_training.json", "runs/*/config.json", "runs/*/stage*/stage_done.json",
                        "eval/*.log", "eval/*/*/*.json", "eval/*/*/*.png", "campaign/speed/*", "campaign/size.txt"):
            for p in sorted(work.glob(pattern)):
                tar.add(p, arcname=str(p.relative_to(work)))
    lines = [f"# GPU campaign `{Path(campaign).name}` — {time.strftime('%Y-%m-%d')}", "",
             f"Card: {card}. " + ('Complete' if done else f'Failed: {len(failed)} runs or evals (below); the queue fires '
                                   'it again' if failed else 'Partial: the campaign had not finished when this was packed')
             + ". "
             f"Made by `CAMPAIGN={os.path.relpath(campaign, ROOT)} bash scripts/device_jobs.sh campaign` (README: "
             "Firing the GPU campaign).",
             "", "## Time: planned vs used", "", "| phase | planned s | used s | state |", "|---|---|---|---|"]
    lines += [f"| {t['phase']} | {t['planned_s']:g} | {_fmt(t['used_s'], 'd')} | {t['state']} |" for t in times]
    if failed:
        lines += ["", "## Failed", ""] + [f"- {line}" for line in failed]
    lines += ["", "## Speed (`speed.json`)", "", "| mixer | fwd+bwd tok/s | stage 1 | stage 2 | stage 3 | s1/s3 | s2/s3 "
              "| s3/fwd+bwd |", "|---|---|---|---|---|---|---|---|"]
    for mixer, row in speed.get("bench_speed", {}).get("rows", {}).items():
        if "stages" in row:
            st = [row["stages"][s]["steady_tok_s"] or row["stages"][s]["wall_tok_s"] for s in STAGES]
            r12 = row["stage12_over_stage3"]
            lines.append(f"| {mixer} | {row['train_tok_s']:,.0f} | " + " | ".join(f"{x:,.0f}" for x in st)
                         + f" | {_fmt(r12[0], '.2f')} | {_fmt(r12[1], '.2f')} | {_fmt(row['stage3_over_fwd_bwd'], '.2f')} |")
    prof = speed.get("profile_train_step")
    if prof:
        lines += ["", f"KD step ({prof['mixer']}, {prof['batch']}×{prof['seq_len']}): {prof['tokens_per_second']:,.0f} "
                      "tokens/s; " + ", ".join(f"{k} {v:.1f} ms" for k, v in prof["ms"].items())]
    lines += [""] + speed.get("size", [])
    lines += ["", "## Training (`training.json`)", "", "| run | flags | stage | tokens | tok/s | first loss | final loss "
              "| stopped at deadline |", "|---|---|---|---|---|---|---|---|"]
    flags = {r[0]: " ".join(r[3:]) for r in c["runs"]}
    for name, r in runs.items():
        for s in r["stages"]:
            rate = s.get("tokens_per_second_steady") or s.get("tokens_per_second_logged_median")
            final = s.get("final_loss", s.get("last_logged_loss"))
            lines.append(f"| {name}{'' if r['finished'] else ' (unfinished)'} | `{flags.get(name, '')}` | {s['stage']} "
                         f"| {s['tokens']:,} | {_fmt(rate, ',.0f')} | {_fmt(s['first_loss'])} | {_fmt(final)} "
                         f"| {'yes' if s.get('stopped_at_deadline') else ''} |")
    scored = {model: e for model, e in evals.items() if {"quality", "niah"} & set(e)}
    timed = {name: e["speed"] for name, e in evals.items() if "speed" in e}
    if scored or not timed:  # a campaign that only times its models has no table of scores
        lines += ["", "## Evaluation (`eval.json`)", "", "| model | recovery above chance | recovery | chance recovery "
                  "| held-out ppl | teacher ppl | KL | NIAH overall | NIAH by length |", "|---|---|---|---|---|---|---|---|---|"]
    for model, e in scored.items():
        q, n = e.get("quality", {}), e.get("niah", {})
        above = (q.get("recovery_above_chance") or {}).get("average")
        rec, chance = (q.get("recovery") or {}).get("average"), (q.get("chance_recovery") or {}).get("average")
        by_length = " ".join(f"{k}:{v:.2f}" for k, v in (n.get("mean_by_length") or {}).items())
        lines.append(f"| {model} | {_fmt(above, '.1f')} | {_fmt(rec, '.1f')} | {_fmt(chance, '.1f')} "
                     f"| {_fmt(q.get('perplexity'), '.2f')} | {_fmt(q.get('teacher_perplexity'), '.2f')} "
                     f"| {_fmt(q.get('kl_to_teacher'))} | {_fmt(n.get('overall'), '.3f')} | {by_length} |")
    for name, data in timed.items():  # the speed eval's own card section: every model and context, the crossovers
        from linzoo.evals.registry import get_eval

        lines += ["", f"## Inference against the teacher (`eval.json`: `{name}`)", "",
                  get_eval("speed").card_section(data, out).strip()]
    lines += ["", "`details.tgz`: every run's log and records, every eval's JSON, plot and log, the speed phase's logs."]
    (out / "README.md").write_text("\n".join(lines) + "\n")
    if (state / "campaign.log").is_file():
        (out / "campaign.log").write_bytes((state / "campaign.log").read_bytes()[-MAX_BYTES:])
    files = sorted(p for p in out.rglob("*") if p.is_file())
    big = [f"{p.name} ({p.stat().st_size:,} bytes)" for p in files if p.stat().st_size > MAX_BYTES]
    if len(files) > MAX_FILES or big or any(p.parent != out for p in files):
        raise ValueError(f"{out} holds {len(files)} files{', over 16 MiB: ' + ', '.join(big) if big else ''}: one call "
                         f"brings back at most {MAX_FILES} files of at most 16 MiB, no folders")
    return times


def read_queue(path):
    """The campaign files of a queue file (recipes/135m/gpu-queue.txt), in order: one path a line (relative to the
    checkout), `#` comments; a missing file is a ValueError naming its line."""
    path, queue = Path(path), []
    if not path.is_file():
        raise FileNotFoundError(f"queue file {path} does not exist")
    for number, line in enumerate(path.read_text().splitlines(), 1):
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if len(words) != 1 or not (ROOT / words[0]).is_file():
            raise ValueError(f"{path}:{number}: {line.strip()!r} is not a campaign file of this checkout")
        queue.append(words[0])
    if not queue:
        raise ValueError(f"{path} lists no campaign file")
    return queue


def next_campaign(queue_file, results):
    """The first campaign of the queue that no complete results/gpu/<date>/training.json records (each campaign's
    report names its file and whether every phase finished); None when all are done."""
    done = set()
    for p in sorted(Path(results).glob("*/training.json")):
        try:
            record = json.loads(p.read_text())
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("complete"):
            done.add(record.get("campaign"))
    return next((c for c in read_queue(queue_file) if Path(c).name not in done), None)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("show")
    p.add_argument("campaign")
    p.add_argument("kind", choices=("phase", "speed", "eval", "run"))
    p = sub.add_parser("check")
    p.add_argument("campaign")
    p.add_argument("--dev", required=True, help="the folder prepare.sh filled (bundles, eval sets, corpus, cache)")
    p.add_argument("--dry", action="store_true", help="the CPU rehearsal: the bundles' manifest, not their install")
    p.add_argument("--teacher", default="embedded")
    p.add_argument("--train_args", default="", help="TRAIN_ARGS: flags device_jobs.sh adds to every run")
    p = sub.add_parser("size")
    p.add_argument("campaign")
    p.add_argument("--bench", required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--train_args", default="")
    p = sub.add_parser("report")
    p.add_argument("--campaign", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--failed", default="", help="device_jobs.sh's failed runs and evals, a line each")
    p = sub.add_parser("next")
    p.add_argument("queue")
    p.add_argument("--results", default=str(ROOT / "results" / "gpu"))
    args = ap.parse_args(argv)
    prog = f"campaign {args.cmd}"
    try:
        if args.cmd == "next":
            head = next_campaign(args.queue, args.results)
            if head is None:
                print(f"{prog}: every campaign of {args.queue} is done (results in {args.results})", file=sys.stderr)
                return 3
            print(head)
            return 0
        c = read_campaign(args.campaign)
        if args.cmd == "show":
            print("\n".join(show(c, args.kind)))
        elif args.cmd == "check":
            errors = check(c, args.dev, args.dry, args.teacher, shlex.split(args.train_args))
            for e in errors:
                print(f"{prog}: error: {e}", file=sys.stderr)
            if errors:
                return 2
            print(f"{prog}: ok: runs {', '.join(r[0] for r in c['runs']) or 'none'}; evals {', '.join(c['eval']) or 'none'}; "
                  f"imports {', '.join(needed_modules(c))}{' (CPU: ' + ', '.join(sorted(CUDA_ONLY)) + ' from the manifest only)' if args.dry else ''}")
        elif args.cmd == "size":
            bench = json.loads(Path(args.bench).read_text())
            mixer = next(m for m, r in bench["rows"].items() if "stages" in r)
            tokens, lines = size(c, bench, args.seconds, mixer, shlex.split(args.train_args))
            print("\n".join(lines))
            Path(args.out).write_text("".join(shlex.join([r[0], r[1], str(tokens), *r[3:]]) + "\n" for r in c["runs"]))
        else:
            for t in report(c, args.campaign, args.work, args.out, args.failed):
                print(f"{prog}: {t['phase']:6s} planned {t['planned_s']:6g} s  used {_fmt(t['used_s'], '>6d')} s  {t['state']}")
    except (ValueError, FileNotFoundError, KeyError, StopIteration) as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
