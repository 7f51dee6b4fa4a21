"""The zoo's report (`linzoo zoo`; `report` of the zoo package: imports its model and plan): one row per step with each eval's headline numbers and its variant's targets,
as `<out>/zoo.json`, the table `zoo.md` (with the paper's claims, read off the rows that measure them) and the figure
`zoo.png`. Written after every step of a build, and on its own by `linzoo zoo --report-only`."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

from linzoo.formatting import format_bytes
from linzoo.integrity import read_json, write_json

from .model import Zoo
from .plan import Step, ZooState, duration, trained_tokens

def niah_headline(r: dict) -> dict:
    out = {"by_length": {n: [a, r["mean_by_length_se"][n]] for n, a in r["mean_by_length"].items()},
           "overall": [r["overall"], r["overall_se"]]}
    if "key_logprob" in r:  # the key's teacher-forced log-probability (nats): how near a miss came
        out["key_logprob"] = [r["key_logprob"], r["key_logprob_se"]]
    return out


def quality_headline(r: dict) -> dict:
    above = r.get("recovery_above_chance") or {}
    keys = ("perplexity", "teacher_perplexity", "kl_to_teacher", "chat_perplexity", "chat_teacher_perplexity",
            "chat_kl_to_teacher")
    return {"recovery_above_chance": [above.get("average"), (above.get("stderr") or {}).get("average")],
            **{k: r.get(k) for k in keys}}


def instruct_headline(r: dict) -> dict:
    return {"accuracy": [r["accuracy"], r["accuracy_se"]], "stop_rate": [r["stop_rate"], r["stop_rate_se"]]}


def speed_headline(r: dict) -> dict:
    """The student's figures at the longest context measured at the smallest batch, with their ratios to the teacher
    measured in the same run."""
    batch = min(r["batch_sizes"])
    rows = [x for x in r["rows"] if x["batch"] == batch and x["model"] != r["teacher"]]
    if not rows:
        return {}
    x = max(rows, key=lambda x: x["length"])
    return {"length": x["length"], "batch": batch, "state_bytes": x["state_bytes_per_sequence"],
            "decode_ms_per_token": x["decode_ms_per_token"], **{f"{k}_ratio": v for k, v in x["ratios"].items()}}


# eval -> its headline numbers in the zoo's report; an eval not listed is reported as measured or not
HEADLINES = {"niah": niah_headline, "quality": quality_headline, "instruct": instruct_headline,
             "speed": speed_headline}


def machine() -> str:
    """This machine's GPU (nvidia-smi's name: asking torch would give the zoo's own long-lived process a CUDA context
    on the card its commands share), else its CPU."""
    import shutil
    import subprocess

    if shutil.which("nvidia-smi"):
        run = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True)
        if run.returncode == 0 and run.stdout.strip():
            return run.stdout.splitlines()[0].strip()
    import torch

    from linzoo.evals.speed import device_name

    return device_name(torch.device("cpu"))


def training_headline(lineage: Path) -> dict | None:
    """A training's record (linzoo_training.json): tokens trained, their tokens/s (the stages' own seconds, or the
    command's), the last loss, and whether a deadline (`train_seconds`) stopped it before its budget. None where
    there is no readable record."""
    tokens = trained_tokens(lineage)
    if tokens is None:
        return None
    record = read_json(lineage)
    stages = record.get("stages") or []
    seconds = sum(s.get("seconds") or 0 for s in stages) or record.get("seconds")
    loss = stages[-1].get("final_loss") if stages else record.get("final_loss")
    return {"tokens": tokens, "tokens_per_second": tokens / seconds if seconds else None, "final_loss": loss,
            "stopped_at_deadline": any(s.get("stopped_at_deadline") for s in stages)}


def report_rows(zoo: Zoo, steps: list[Step], state: ZooState | dict, status_of=None) -> list[dict]:
    """One dict per step: what it is, its state, its seconds, and each eval's headline numbers (None: not measured)."""
    from linzoo.evals.registry import get_eval

    rows, state = [], state if isinstance(state, ZooState) else ZooState(state)
    for s in steps:
        records = state["steps"].get(s.name, {})
        row = {"step": s.name, "mixer": s.mixer, "variant": s.variant,
               "parent": s.parent or ("teacher" if s.train else None), "folder": str(s.folder),
               "seconds": round(sum(r.get("seconds", 0) for r in records.values())),
               "state": status_of(s) if status_of else "done" if all(state.is_done(s, c) for c in s.commands)
               else "to do", "evals": {}}
        row["training"] = training_headline(s.train.output) if s.train else None
        commands = {c.label: c for c in s.evals}  # a row runs the evals its variant gets (`variants`): by label
        for e in zoo.evals:
            cmd = commands.get(f"eval {e.label}")
            data = None if cmd is None else get_eval(e.eval).read(cmd.output)
            row["evals"][e.label] = None if data is None else HEADLINES.get(e.eval, lambda r: {})(data)
        rows.append(row)
    teacher = rows[0]["evals"]  # perplexity against the teacher row's own, where measured
    for row in rows:
        for label, h in row["evals"].items():
            if h and "perplexity" in h:
                base = (teacher.get(label) or {}).get("perplexity") or h.get("teacher_perplexity")
                h["perplexity_ratio"] = h["perplexity"] / base if h["perplexity"] and base else None
            if h and "accuracy" in h and label in teacher and teacher[label]:
                t = teacher[label]["accuracy"][0]
                h["of_teacher"] = h["accuracy"][0] / t if t else None
        row["targets"] = check_targets(zoo.targets.get(row["variant"], {}), row["evals"], teacher)
    return rows


def check_targets(targets: dict, evals: dict, teacher: dict) -> list[dict]:
    """Each target of a row's variant against its numbers: {"target", "value", "held"} (held None: not measured)."""
    out = []
    for label, t in targets.items():
        h, th = evals.get(label), teacher.get(label)
        for measure, want in t.items():
            if measure == "at":
                continue
            if measure == "of_teacher" and "at" in t:  # NIAH: each length against the teacher's at that length
                for n in map(str, t["at"]):
                    got = h and h["by_length"].get(n, [None])[0]
                    ref = th and th["by_length"].get(n, [None])[0]
                    need = None if ref is None else want * ref
                    out.append({"target": f"{label} at {n} >= {want:g} x teacher ({_num(ref)})",
                                "value": got, "held": None if got is None or need is None else got >= need - 1e-9})
            elif measure == "of_teacher":
                got = h and h.get("of_teacher")
                out.append({"target": f"{label} >= {want:g} x teacher", "value": got,
                            "held": None if got is None else got >= want - 1e-9})
            elif measure == "perplexity_ratio":
                got = h and h.get("perplexity_ratio")
                out.append({"target": f"{label} perplexity <= {want:g} x teacher", "value": got,
                            "held": None if got is None else got <= want + 1e-9})
            elif measure == "stop_rate":
                got = h and h["stop_rate"][0]
                out.append({"target": f"{label} EOS stop >= {want:g}", "value": got,
                            "held": None if got is None else got >= want - 1e-9})
    return out


def training_cell(t: dict | None) -> str:
    if not t:
        return "—"
    rate = f" ({t['tokens_per_second']:,.0f})" if t["tokens_per_second"] else ""
    loss = f", {t['final_loss']:.3f}" if t["final_loss"] is not None else ""
    return f"{t['tokens']:,}{rate}{loss}" + (", **stopped by the deadline**" if t["stopped_at_deadline"] else "")


def _num(x) -> str:
    return "—" if x is None else f"{x:.2f}"


def _pm(pair, spec=".2f") -> str:
    value, se = pair
    return "—" if value is None else format(value, spec) + ("" if se is None else f"±{se:{spec}}")


def write_report(zoo: Zoo, steps: list[Step], out, state: ZooState | dict, status_of=None) -> list[dict]:
    """<out>/zoo.json (the rows), zoo.md (the table) and zoo.png (the figure)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = report_rows(zoo, steps, state, status_of)
    device = state.get("device") or machine()  # the build's, as its state recorded it
    report = {"schema": "linzoo.zoo/v1", "zoo_file": zoo.path, "teacher": zoo.teacher, "mixers": zoo.mixers,
              "device": device,
              "written": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows, "claims": claims(rows)}
    write_json(out / "zoo.json", report)
    (out / "zoo.md").write_text(markdown(zoo, rows, device))  # the table of zoo.json: written again after every step
    (out / "zoo-summary.md").write_text(summary(rows, [e.label for e in zoo.evals]))  # the README's short table
    figure(rows, out / "zoo.png")
    return rows


def summary(rows: list[dict], labels: list[str]) -> str:
    """The short table of zoo.json's rows (the README's): per eval label one cell of its headline numbers without
    their errors (zoo.md has them): NIAH accuracy by length, recovery above chance and perplexity × teacher,
    instruction accuracy and EOS stop, state bytes and decode time × teacher."""
    def cell(h) -> str:
        if h is None:
            return "—"
        if "by_length" in h:
            return " / ".join(f"{v[0]:.2f}" for v in h["by_length"].values())
        if "recovery_above_chance" in h:
            rec, ratio = h["recovery_above_chance"][0], h.get("perplexity_ratio")
            return f"{'—' if rec is None else f'{rec:.0f} %'}, {'—' if ratio is None else f'{ratio:.2f}x'}"
        if "stop_rate" in h:
            return f"{h['accuracy'][0]:.2f}, {h['stop_rate'][0]:.2f}"
        if "state_bytes" in h:
            return f"{format_bytes(h['state_bytes'])}, {h['decode_ms_per_token_ratio']:.2f}x"
        return "measured"

    names = {"quality": "quality: above chance, ppl × teacher", "instruct": "instruction answers, EOS stop",
             "speed": "speed: state, decode × teacher"}
    rows = [row for row in rows if row["state"] == "done"]
    heads = []
    for label in labels:
        lengths = list(dict.fromkeys(n for row in rows if (h := row["evals"].get(label)) and "by_length" in h
                                     for n in h["by_length"]))
        heads.append(names.get(label, f"{label} ({' / '.join(lengths)})" if lengths else label))
    lines = ["| row | " + " | ".join(heads) + " |", "|---" * (1 + len(heads)) + "|"]
    for row in rows:
        lines.append(f"| {'teacher' if row['step'] == 'teacher' else row['step']} | "
                     + " | ".join(cell(row["evals"].get(label)) for label in labels) + " |")
    return "\n".join(lines) + "\n"


def markdown(zoo: Zoo, rows: list[dict], device: str = "") -> str:
    heads, cells = [], [[] for _ in rows]
    for e in zoo.evals:  # by what its headline holds (HEADLINES)
        kind = [row["evals"].get(e.label) for row in rows]
        shape = next((h for h in kind if h), {})
        if "by_length" in shape:
            lengths = list(dict.fromkeys(n for h in kind if h for n in h["by_length"]))
            heads.append(f"{e.label} by length ({' / '.join(lengths) or 'lengths'})")
            for c, h in zip(cells, kind):
                c.append(" / ".join(_pm(h["by_length"].get(n, (None, None))) for n in lengths) if h else "—")
            if "key_logprob" in shape:
                heads.append(f"{e.label}: key log-prob (nats)")
                for c, h in zip(cells, kind):
                    c.append(_pm(h["key_logprob"], ".1f") if h and "key_logprob" in h else "—")
        elif "recovery_above_chance" in shape:
            heads += [f"{e.label}: recovery above chance %", f"{e.label}: perplexity × teacher", f"{e.label}: KL"]
            chats = any(h and h.get("chat_perplexity") for h in kind)
            if chats:
                heads += [f"{e.label}: chat perplexity (answers)", f"{e.label}: chat KL"]
            for c, h, row in zip(cells, kind, rows):
                teacher = row["step"] == "teacher"
                c.append("(the reference)" if teacher and h else _pm(h["recovery_above_chance"], ".1f") if h else "—")
                ratio = h and h.get("perplexity_ratio")
                c.append(f"{ratio:.2f} ({h['perplexity']:.1f})" if ratio else "—")
                c.append(f"{h['kl_to_teacher']:.3f}" if h and h.get("kl_to_teacher") is not None else "—")
                if chats:
                    c.append(f"{h['chat_perplexity']:.2f}" if h and h.get("chat_perplexity") else "—")
                    c.append(f"{h['chat_kl_to_teacher']:.3f}" if h and h.get("chat_kl_to_teacher") is not None else "—")
        elif "stop_rate" in shape:
            heads += [f"{e.label}: accuracy (× teacher)", f"{e.label}: EOS stop"]
            for c, h in zip(cells, kind):
                ratio = h and h.get("of_teacher")
                c.append(_pm(h["accuracy"]) + (f" ({ratio:.2f})" if ratio is not None else "") if h else "—")
                c.append(_pm(h["stop_rate"]) if h else "—")
        elif "state_bytes" in shape:
            at = f"{shape['length']} tokens" + (f" x {shape['batch']}" if shape["batch"] > 1 else "")
            heads += [f"{e.label}: state per sequence at {at} (× teacher)", f"{e.label}: decode ms/token (× teacher)",
                      f"{e.label}: prefill × teacher"]
            for c, h in zip(cells, kind):
                c.append(f"{format_bytes(h['state_bytes'])} ({h['state_bytes_per_sequence_ratio']:.2f})" if h else "—")
                c.append(f"{h['decode_ms_per_token']:.1f} ({h['decode_ms_per_token_ratio']:.2f})" if h else "—")
                c.append(f"{h['prefill_s_ratio']:.2f}" if h else "—")
        else:
            heads.append(e.label)
            for c, h in zip(cells, kind):
                c.append("measured" if h is not None else "—")
    done = sum(r["state"] == "done" for r in rows)
    lines = [f"# The zoo of `{zoo.path}`", "",
             f"Teacher `{zoo.teacher}`; {done} of {len(rows)} steps done ({time.strftime('%Y-%m-%d %H:%M')}"
             f"{', on ' + device if device else ''}). "
             "NIAH: accuracy ± binomial standard error; recovery above chance: (s − c) / (t − c) over the tasks "
             "where the teacher is clearly above chance, ± its standard error; perplexity on held-out text over "
             "the teacher's (the student's own in brackets).", "",
             "| model | parent | state | time | trained: tokens (tok/s), last loss | " + " | ".join(heads)
             + " | targets |", "|---" * (6 + len(heads)) + "|"]
    for row, c in zip(rows, cells):
        name = f"teacher `{zoo.teacher}`" if row["step"] == "teacher" else row["step"]
        took = duration(row["seconds"]) if row["seconds"] else "—"
        lines.append(f"| {name} | {row['parent'] or ''} | {row['state']} | {took} | {training_cell(row.get('training'))} | "
                     + " | ".join(c)
                     + f" | {targets_cell(row.get('targets') or [])} |")
    if zoo.targets:
        lines += ["", "Targets (the zoo file's `targets`, per variant): "
                  + "; ".join(f"{v}: " + ", ".join(f"{label} {', '.join(f'{k} {w}' for k, w in t.items())}"
                                                  for label, t in checks.items()) for v, checks in zoo.targets.items())]
    lines += ["", "## The paper's claims at this budget", "",
              f"Each read off the rows that measure it; a difference counts beyond {Z:g} standard errors.", ""]
    lines += [f"- **{c['claim']}**: {c['verdict']} ({c['numbers']})" for c in claims(rows)]
    return "\n".join(lines) + "\n"


def targets_cell(targets: list[dict]) -> str:
    if not targets:
        return ""
    missed = [f"{t['target']}: {_num(t['value'])}" for t in targets if t["held"] is False]
    unknown = sum(t["held"] is None for t in targets)
    if missed:
        return "**missed** " + "; ".join(missed) + (f" ({unknown} not measured)" if unknown else "")
    return "all held" if not unknown else f"{len(targets) - unknown} held, {unknown} not measured"


def figure(rows: list[dict], path: Path):
    """Per mixer (groups) × variant (bars): each NIAH eval's overall accuracy and each quality eval's recovery above
    chance, with error bars; the teacher as a dashed line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    teacher, students = rows[0], [r for r in rows if r["mixer"]]
    panels = []  # (label, key, what, teacher's value)
    for label in dict.fromkeys(label for r in students for label in r["evals"]):
        th = teacher["evals"].get(label)
        kind = next((x["evals"][label] for x in rows if x["evals"].get(label)), None) or {}
        if "overall" in kind:
            panels.append((label, "overall", f"{label}: overall accuracy", th and th["overall"][0]))
        elif "recovery_above_chance" in kind:
            panels.append((label, "recovery_above_chance", f"{label}: recovery above chance %", 100.0))
        elif "accuracy" in kind:
            panels.append((label, "accuracy", f"{label}: accuracy", th and th["accuracy"][0]))
    mixers = list(dict.fromkeys(r["mixer"] for r in students))
    variants = list(dict.fromkeys(r["variant"] for r in students))
    fig = Figure(figsize=(max(6.0, 1.1 * len(mixers) + 3), 2.8 * max(1, len(panels))))
    FigureCanvasAgg(fig)
    width = 0.8 / max(1, len(variants))
    for k, (label, key, title, line) in enumerate(panels):
        ax = fig.add_subplot(len(panels), 1, k + 1)
        for j, variant in enumerate(variants):
            xs, ys, es = [], [], []
            for i, mixer in enumerate(mixers):
                h = next((r["evals"].get(label) for r in students if (r["mixer"], r["variant"]) == (mixer, variant)),
                         None)
                measured = h and h[key][0] is not None  # NaN: no bar, but the legend keeps the variant's colour
                xs.append(i + (j - (len(variants) - 1) / 2) * width)
                ys.append(h[key][0] if measured else math.nan)
                es.append((h[key][1] or 0.0) if measured else 0.0)
            ax.bar(xs, ys, width, yerr=es, capsize=2, label=variant, color=f"C{j}")
        if line is not None:
            ax.axhline(line, color="black", linestyle="--", linewidth=1, label="teacher")
        ax.set_xticks(range(len(mixers)), mixers, fontsize=8)
        ax.set_xlim(-0.5, len(mixers) - 0.5)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if not panels:
        fig.text(0.5, 0.5, "nothing measured yet", ha="center")
    fig.tight_layout()
    fig.savefig(path, dpi=110)




# ------------------------------------------------------------------------------------------------ claims

def _gated() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The registry's mixers whose state decays by a gate computed from the input, and the others (`gated`)."""
    from linzoo.modeling.mixers import MIXER_CLASSES

    return (tuple(n for n, c in MIXER_CLASSES.items() if c.gated),
            tuple(n for n, c in MIXER_CLASSES.items() if not c.gated))


Z = 2.0  # a difference counts when it exceeds twice its standard error


def _verdict(diff: float, se: float) -> str:
    return "holds" if diff > Z * se else "does not hold" if diff < -Z * se else UNKNOWN


UNKNOWN = "cannot tell at this budget"


def _claim(claim: str, verdict: str, numbers: str) -> dict:
    return {"claim": claim, "verdict": verdict, "numbers": numbers}


def _value(row: dict, label_kind: str, key: str):
    """(value, se) of the first eval of `row` whose headline has `key` and whose label starts with `label_kind`."""
    for label, h in row["evals"].items():
        if h and label.split("/")[0] == label_kind and key in h and h[key][0] is not None:
            return h[key][0], h[key][1] or 0.0
    return None


def _mean(pairs):
    return sum(v for v, _ in pairs) / len(pairs), math.sqrt(sum(s * s for _, s in pairs)) / len(pairs)


@dataclass(frozen=True)
class Claim:
    """One of the paper's claims as the report reads it: the rows it reads (`variants`, every mixer's), the headline
    each row gives (`eval`, `key`: an eval's headline number, e.g. quality's recovery above chance) and the statistic
    that compares them (a name of STATISTICS: (the claim, {variant: {mixer: (value, se)}}, the rows) -> (verdict,
    numbers))."""
    text: str
    statistic: str
    variants: tuple[str, ...]
    eval: str
    key: str
    fallback_key: str | None = None  # read where every row's `key` is 0 (NIAH at chance: the key's log-probability)


CLAIMS = (
    Claim("Gated mixers beat non-gated ones (pure base rows, recovery above chance)", "gated_vs_not",
          ("base-pure",), "quality", "recovery_above_chance"),
    Claim("{best} retrieves best (pure base rows: NIAH, the key's log-probability where all are at 0)", "best_mixer",
          ("base-pure",), "niah", "overall", "key_logprob"),
    Claim("Instruction tuning widens the gaps (hybrid rows: spread of recovery above chance across mixers)",
          "spread_grows", ("base", "instruct"), "quality", "recovery_above_chance"),
    Claim("Instruction-aware distillation gives no consistent gain and can hurt retrieval (instruct vs distilled)",
          "no_consistent_gain", ("instruct", "instruct-distilled"), "instruct", "accuracy"),
)


def _gated_vs_not(claim: Claim, measured: dict, by: dict) -> tuple[str, str]:
    rec = measured[claim.variants[0]]
    gated_names, plain_names = _gated()
    gated, plain = [rec[m] for m in gated_names if m in rec], [rec[m] for m in plain_names if m in rec]
    if not (gated and plain):
        return UNKNOWN, f"pure base rows measured: {', '.join(rec) or 'none'}; the claim needs a gated and a non-gated one"
    (g, gse), (p, pse) = _mean(gated), _mean(plain)
    return _verdict(g - p, math.hypot(gse, pse)), (
        f"gated ({', '.join(m for m in gated_names if m in rec)}) {g:.1f}±{gse:.1f} % vs not gated "
        f"({', '.join(m for m in plain_names if m in rec)}) {p:.1f}±{pse:.1f} %")


def _best_mixer(claim: Claim, measured: dict, by: dict) -> tuple[str, str]:
    key, what = measured[claim.variants[0]], "NIAH overall accuracy"
    if not any(v for v, _ in key.values()):
        key, what = _measured(by, claim.variants[0], claim.eval, claim.fallback_key), \
            "key log-probability (nats; NIAH is 0 for all)"
    best = _best()
    if not (best in key and len(key) > 1):
        return UNKNOWN, f"pure base rows measured: {', '.join(key) or 'none'}; the claim needs {best}'s and another"
    other = max((m for m in key if m != best), key=lambda m: key[m][0])
    (a, ase), (b, bse) = key[best], key[other]
    return _verdict(a - b, math.hypot(ase, bse)), (
        f"{what}: {best} {a:.2f}±{ase:.2f}, the best of the {len(key) - 1} other pure rows ({other}) {b:.2f}±{bse:.2f}")


def _spread_grows(claim: Claim, measured: dict, by: dict) -> tuple[str, str]:
    spreads = {}
    for variant in claim.variants:
        vals = measured[variant]
        if len(vals) >= 2:
            hi, lo = max(vals.values()), min(vals.values())
            spreads[variant] = (hi[0] - lo[0], math.hypot(hi[1], lo[1]), len(vals))
    if len(spreads) < 2:
        return UNKNOWN, "fewer than two mixers measured as base and as instruct"
    (b, bse, nb), (i, ise, ni) = (spreads[v] for v in claim.variants)
    return _verdict(i - b, math.hypot(bse, ise)), (
        f"spread (best - worst mixer) base {b:.1f}±{bse:.1f} points over {nb} mixers, instruct {i:.1f}±{ise:.1f} "
        f"over {ni}")


def _no_consistent_gain(claim: Claim, measured: dict, by: dict) -> tuple[str, str]:
    before, after = claim.variants
    gains, hurt = [], []
    for m in sorted(set(measured[before]) & set(measured[after])):
        (x, xse), (y, yse) = measured[before][m], measured[after][m]
        gains.append((m, y - x, math.hypot(xse, yse)))
    for m in sorted({m for m, v in by if v == before} & {m for m, v in by if v == after}):
        a, b = by[(m, before)], by[(m, after)]
        for label in a["evals"]:
            x, y = a["evals"].get(label), b["evals"].get(label)
            if x and y and "overall" in x and "overall" in y:
                d, se = y["overall"][0] - x["overall"][0], math.hypot(x["overall"][1] or 0, y["overall"][1] or 0)
                if d < -Z * se:
                    hurt.append(f"{m} {label} {x['overall'][0]:.2f} -> {y['overall'][0]:.2f}")
    if not gains:
        return UNKNOWN, "no mixer measured as both instruct and instruct-distilled"
    verdict = "does not hold" if all(d > Z * se for _, d, se in gains) else "holds" if hurt else UNKNOWN
    return verdict, ("instruction-answer accuracy, distilled - instruct: "
                     + ", ".join(f"{m} {d:+.2f}±{se:.2f}" for m, d, se in gains)
                     + ("; retrieval lost: " + "; ".join(hurt) if hurt else "; no NIAH fell beyond 2 SE"))


STATISTICS = {"gated_vs_not": _gated_vs_not, "best_mixer": _best_mixer, "spread_grows": _spread_grows,
              "no_consistent_gain": _no_consistent_gain}


def _best() -> str:
    from linzoo.modeling.mixers import DEFAULT_MIXER  # the paper's best at retrieval

    return DEFAULT_MIXER


def _measured(by: dict, variant: str, kind: str, key: str) -> dict:
    """{mixer: (value, se)} of the rows of `variant` that measure `key` in their `kind` eval."""
    return {m: v for (m, var), r in by.items() if var == variant and (v := _value(r, kind, key)) is not None}


def claims(rows: list[dict], table: tuple[Claim, ...] = CLAIMS) -> list[dict]:
    """The paper's claims at this budget (`table`: claim -> rows -> statistic), each read off the rows that measure
    it: {"claim", "verdict", "numbers"}. A difference holds or fails beyond twice its standard error; otherwise, or
    with rows missing, "cannot tell at this budget"."""
    from linzoo.modeling.mixers import MIXER_CLASSES

    by = {(r["mixer"], r["variant"]): r for r in rows if r["mixer"]}
    out = []
    for claim in table:
        measured = {v: _measured(by, v, claim.eval, claim.key) for v in claim.variants}
        verdict, numbers = STATISTICS[claim.statistic](claim, measured, by)
        out.append(_claim(claim.text.format(best=MIXER_CLASSES[_best()].title), verdict, numbers))
    return out
