"""Instruction answers: short questions with known answers (facts, arithmetic, one-word instructions), asked through
the chat template, scored by matching the answer, with the share of replies that stop (EOS) within the token budget.

Every question is one user turn of the tokenizer's chat template (`add_generation_prompt=True`, the template's own
system prompt where it adds one), answered greedily in batches with left padding, at most `--max_new_tokens` (64)
new tokens. A reply is a hit when one of the question's accepted answers appears as a whole word or phrase in its
answer window: the reply's first sentence, or its first 20 words where that sentence is shorter (a reply that
lists many candidates further on gets no credit). Reply and answers are compared after `normalize`: lowercase,
accents dropped, punctuation and the articles a/an/the dropped, number words up to ninety-nine written as digits
("twenty-four" == "24"), thousands separators dropped ("1,000" == "1000"). A reply stopped when the model wrote an
end-of-sequence token (the tokenizer's or the generation config's) within the budget.

Accuracy and stop rate carry binomial standard errors sqrt(p (1 - p) / n), overall and per kind. With `--teacher`
the teacher answers the same questions (its own results in `<out>/teacher`) and the student's file gains the
teacher's numbers and the ratio student / teacher, whose standard error is the delta method's
sqrt((se_s / t)^2 + (s se_t / t^2)^2) (the two taken as independent: on the same questions they are correlated, so it
overstates the error a little).

The question set (`instruct_questions.jsonl`, one JSON object a line: id, kind, question, answers) was chosen for
the teacher. A pool of 284 candidates written by hand (capitals, science, people, units, dates; sums, differences,
products, quotients and halves of small numbers; opposites, plurals, past tenses, translations and sequences with
"Answer with one word") was asked of the embedded teacher (SmolLM2-135M-Instruct, as linzoo loads it) with this
scorer and this command's defaults. It scored 156; 4 of those, whose replies are wrong on reading ("Egypt is a
continent ... in North Africa"), were dropped, and the other 152 are the set: 72 facts, 39 arithmetic, 41
instructions. The teacher's accuracy on it is therefore 1.000 by construction, in every kind (measured by
`linzoo eval instruct --model embedded`: 152 of 152; its EOS stop rate 0.862 ± 0.028, 131 replies within 64 tokens):
it is the ceiling a student is measured against, not a measure of the teacher (who answered 156 of the 284). A
question's answer may not appear in the question itself (a reply echoing it would score), which the loader checks.

    linzoo eval instruct --model runs/main --teacher embedded --out runs/main/eval
    linzoo eval instruct --model embedded --out outputs/instruct
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .common import (EVAL_DIR, EvalSpec, ModelArguments, check_out_dir, model_device, name_of, render,
                     run_on_models, write_json)

SCHEMA = "linzoo.instruct/v1"
QUESTIONS = Path(__file__).with_name("instruct_questions.jsonl")
KINDS = ("fact", "arithmetic", "instruction")
WINDOW_WORDS = 20
FIGURES = (f"{EVAL_DIR}/instruct.png", "instruct.png")  # where a checkpoint folder may hold the figure

# --- scoring ---------------------------------------------------------------------------------------------------------

_UNITS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
          "seventeen eighteen nineteen").split()
_TENS = dict(zip("twenty thirty forty fifty sixty seventy eighty ninety".split(), range(20, 100, 10)))
ARTICLES = {"a", "an", "the"}


def normalize(text: str) -> list[str]:
    """The words of `text` as the scorer compares them: lowercase, accents dropped, only letters and numbers (a
    decimal point kept inside a number), articles dropped, number words below 100 as digits."""
    text = unicodedata.normalize("NFKD", text.lower()).encode("ascii", "ignore").decode()
    text = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text)
    words = []
    for word in re.findall(r"\d+(?:\.\d+)?|[a-z]+", text):
        if word in ARTICLES:
            continue
        if word in _UNITS:
            unit = _UNITS.index(word)
            if words and words[-1] in _TENS.values() and 0 < unit < 10:  # "twenty four" -> 24
                words[-1] += unit
            else:
                words.append(unit)
        else:
            words.append(_TENS.get(word, word))
    return [str(w) for w in words]


def contains(words: list[str], phrase: list[str]) -> bool:
    """`phrase` appears in `words` as consecutive whole words."""
    n = len(phrase)
    return n > 0 and any(words[i:i + n] == phrase for i in range(len(words) - n + 1))


def answer_window(reply: str) -> str:
    """The part of the reply that is scored: its first sentence, or its first WINDOW_WORDS words where that sentence
    is shorter."""
    reply = reply.strip()
    sentence = re.split(r"(?<=[.!?])\s|\n", reply, maxsplit=1)[0]
    return " ".join(reply.split()[:max(WINDOW_WORDS, len(sentence.split()))])


def is_hit(reply: str, answers: list[str]) -> bool:
    """Any accepted answer appears, normalized, as a whole word or phrase in the reply's answer window."""
    window = normalize(answer_window(reply))
    return any(contains(window, normalize(answer)) for answer in answers)


# --- questions -------------------------------------------------------------------------------------------------------

def load_questions(path: str | Path | None = None) -> list[dict]:
    """The questions of a JSONL file (default: the shipped set), each {"id", "kind", "question", "answers"}, or a
    one-line ValueError naming the file and line."""
    path = Path(path) if path is not None else QUESTIONS
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"--questions {path}: cannot read it ({type(err).__name__}): give a JSONL file of "
                         '{"id", "kind", "question", "answers"} objects') from None
    questions, ids = [], set()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"--questions {path}, line {number}"
        try:
            q = json.loads(line)
        except ValueError:
            raise ValueError(f"{where}: not JSON") from None
        if not isinstance(q, dict) or set(q) < {"id", "kind", "question", "answers"}:
            raise ValueError(f'{where}: give an object with "id", "kind", "question" and "answers"')
        if q["kind"] not in KINDS:
            raise ValueError(f"{where}: kind {q['kind']!r}: pick one of {', '.join(KINDS)}")
        if not isinstance(q["question"], str) or not q["question"].strip():
            raise ValueError(f"{where}: the question is empty")
        answers = q["answers"]
        if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and normalize(a)
                                                                   for a in answers):
            raise ValueError(f"{where}: answers must be a list of answers with a word or number each (articles "
                             "alone do not count)")
        echoed = [a for a in answers if contains(normalize(q["question"]), normalize(a))]
        if echoed:
            raise ValueError(f"{where}: the answer {echoed[0]!r} is in the question, so a reply echoing it would "
                             "score: rephrase it")
        if str(q["id"]) in ids:
            raise ValueError(f"{where}: id {q['id']!r} given twice")
        ids.add(str(q["id"]))
        questions.append({"id": str(q["id"]), "kind": q["kind"], "question": q["question"], "answers": answers})
    if not questions:
        raise ValueError(f"--questions {path}: no questions in it")
    return questions


# --- asking ----------------------------------------------------------------------------------------------------------

def eos_ids(model, tokenizer) -> list[int]:
    """The tokens that end a reply: the tokenizer's EOS and the generation config's."""
    config = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = config if isinstance(config, (list, tuple)) else [config]
    return sorted({i for i in (*ids, tokenizer.eos_token_id) if i is not None})


@torch.inference_mode()
def answer_batch(model, tokenizer, questions: list[str], max_new_tokens: int) -> list[tuple[str, bool, int]]:
    """(reply, stopped, new tokens) per question: greedy, one batch, left padded; `stopped` when an EOS token came
    within `max_new_tokens` (the reply is the text before it; new tokens count it)."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                             add_generation_prompt=True) for q in questions]
    # the chat template writes its own special tokens
    batch = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left",
                      add_special_tokens=False).to(model_device(model))
    stops = eos_ids(model, tokenizer)
    out = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                         max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=stops)
    answers = []
    for row in out[:, batch["input_ids"].shape[1]:].tolist():
        end = next((i for i, token in enumerate(row) if token in stops), None)
        tokens = row if end is None else row[:end]
        answers.append((tokenizer.decode(tokens, skip_special_tokens=True).strip(), end is not None,
                        len(row) if end is None else end + 1))
    return answers


def rate(flags: list[bool]) -> tuple[float, float]:
    """(share of True, its binomial standard error sqrt(p (1 - p) / n))."""
    p = sum(flags) / len(flags)
    return p, math.sqrt(p * (1 - p) / len(flags))


def summarize(records: list[dict]) -> dict:
    """Accuracy and stop rate with their standard errors, overall and per kind (the kinds present)."""
    accuracy, accuracy_se = rate([r["hit"] for r in records])
    stop_rate, stop_rate_se = rate([r["stopped"] for r in records])
    by_kind = {}
    for kind in KINDS:
        hits = [r["hit"] for r in records if r["kind"] == kind]
        if hits:
            p, se = rate(hits)
            by_kind[kind] = {"n": len(hits), "accuracy": p, "accuracy_se": se}
    return {"n": len(records), "accuracy": accuracy, "accuracy_se": accuracy_se, "by_kind": by_kind,
            "stop_rate": stop_rate, "stop_rate_se": stop_rate_se}


def run_instruct(model, tokenizer, questions: list[dict], batch_size: int = 8, max_new_tokens: int = 64,
                 model_name: str | None = None, source: str | None = None) -> dict:
    """The linzoo.instruct/v1 dict of one model on `questions` (from `load_questions`)."""
    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError(f"batch_size {batch_size}, max_new_tokens {max_new_tokens}: give at least 1 each")
    start, records = time.perf_counter(), []
    for i in tqdm(range(0, len(questions), batch_size), desc="instruct", unit="batch"):
        chunk = questions[i:i + batch_size]
        replies = answer_batch(model, tokenizer, [q["question"] for q in chunk], max_new_tokens)
        for q, (reply, stopped, new_tokens) in zip(chunk, replies):
            records.append({"id": q["id"], "kind": q["kind"], "question": q["question"], "answers": q["answers"],
                            "reply": reply, "hit": is_hit(reply, q["answers"]), "stopped": stopped,
                            "new_tokens": new_tokens})
    digest = hashlib.sha256(json.dumps(questions, sort_keys=True).encode()).hexdigest()  # which set, wherever it lay
    return {"schema": SCHEMA, "model": model_name or name_of(model), "questions": source or QUESTIONS.name,
            "questions_sha256": digest, "max_new_tokens": max_new_tokens, "batch_size": batch_size,
            **summarize(records), "teacher": None, "ratio": None, "seconds": time.perf_counter() - start,
            "records": records}


def ratio(s: float, s_se: float, t: float, t_se: float) -> dict:
    """s / t with the delta method's standard error sqrt((se_s / t)^2 + (s se_t / t^2)^2), s and t taken as
    independent; None where the teacher scored 0."""
    if t == 0:
        return {"value": None, "se": None}
    return {"value": s / t, "se": math.sqrt((s_se / t) ** 2 + (s * t_se / t ** 2) ** 2)}


def with_teacher(student: dict, teacher: dict) -> dict:
    """The student's results with the teacher's numbers (same questions) and the ratios student / teacher."""
    if student.get("questions_sha256") != teacher.get("questions_sha256"):
        raise ValueError("the student and the teacher answered different question sets: compare them on one")
    keys = ("model", "weights_sha256", "n", "accuracy", "accuracy_se", "by_kind", "stop_rate", "stop_rate_se")
    ratios = {"accuracy": ratio(student["accuracy"], student["accuracy_se"], teacher["accuracy"],
                                teacher["accuracy_se"]),
              "stop_rate": ratio(student["stop_rate"], student["stop_rate_se"], teacher["stop_rate"],
                                 teacher["stop_rate_se"]),
              "by_kind": {k: ratio(v["accuracy"], v["accuracy_se"], teacher["by_kind"][k]["accuracy"],
                                   teacher["by_kind"][k]["accuracy_se"])
                          for k, v in student["by_kind"].items() if k in teacher["by_kind"]}}
    return {**student, "teacher": {k: teacher.get(k) for k in keys}, "ratio": ratios}


def save_instruct(results: dict, out_dir) -> tuple[Path, Path]:
    """Writes instruct.json and instruct.png: accuracy per kind, overall and the stop rate, with standard-error bars,
    beside the teacher's where the results have them."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(out_dir)
    json_path, png_path = out / "instruct.json", out / "instruct.png"
    write_json(results, json_path)

    groups = [*results["by_kind"], "overall", "EOS stop"]

    def bars(r):
        kinds = [(r["by_kind"][k]["accuracy"], r["by_kind"][k]["accuracy_se"]) if k in r["by_kind"] else (0, 0)
                 for k in results["by_kind"]]
        return kinds + [(r["accuracy"], r["accuracy_se"]), (r["stop_rate"], r["stop_rate_se"])]

    series = [(results["model"], bars(results))] + ([(f"teacher: {results['teacher']['model']}",
                                                      bars(results["teacher"]))] if results["teacher"] else [])
    fig = Figure(figsize=(1.4 * len(groups) + 2, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [v for v, _ in values], width, yerr=[se for _, se in values], capsize=3, label=label)
    ax.set_xticks(range(len(groups)), [f"{g}\n(n={results['by_kind'][g]['n']})" if g in results["by_kind"] else g
                                       for g in groups])
    ax.set_ylim(0, 1.2)  # room above the bars for the legend
    ax.set_ylabel("accuracy (EOS stop: share of replies)")
    ax.set_title(f"instruction answers, {results['n']} questions, ≤ {results['max_new_tokens']} new tokens",
                 fontsize=10)
    ax.legend(fontsize=8, loc="upper right", ncol=2)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    return json_path, png_path


# --- the command -----------------------------------------------------------------------------------------------------

@dataclass
class InstructArguments(ModelArguments):
    batch_size: int = field(default=8, metadata={"help": "questions per generate call (left padded)"})
    out: str = field(default="outputs/instruct", metadata={"help": "output folder (teacher results go in "
                                                                    "<out>/teacher)"})
    questions: str | None = field(default=None, metadata={
        "help": "a JSONL file of {id, kind, question, answers} (default: the shipped set)"})
    max_new_tokens: int = field(default=64, metadata={"help": "the most tokens a reply may take (its EOS included)"})
    LIMITS = {"max_new_tokens": {"min": 1}}

    def __post_init__(self):
        super().__post_init__()
        load_questions(self.questions)  # before any model loads
        check_out_dir(self.out)


def describe(r: dict) -> str:
    kinds = ", ".join(f"{k} {v['accuracy']:.3f}±{v['accuracy_se']:.3f}" for k, v in r["by_kind"].items())
    return (f"accuracy {r['accuracy']:.3f}±{r['accuracy_se']:.3f} ({kinds}); EOS stop {r['stop_rate']:.3f}"
            f"±{r['stop_rate_se']:.3f}; n {r['n']}")


def main(argv: list[str] | None = None) -> dict:
    from linzoo.arguments import parse_arguments

    (args,) = parse_arguments(InstructArguments, argv)
    questions = load_questions(args.questions)
    source = args.questions or QUESTIONS.name

    def evaluate(spec, out, model, tokenizer):
        r = run_instruct(model, tokenizer, questions, args.batch_size, args.max_new_tokens, spec, source)
        print(f"{spec}: {describe(r)}; {r['seconds']:.0f} s -> {save_instruct(r, out)[0]}")
        return r

    results = run_on_models(args, evaluate)
    if len(results) == 2:  # the student's file gains the teacher's numbers beside its own
        student = with_teacher(*results)
        a = student["ratio"]["accuracy"]
        print(f"{args.model} / {args.teacher}: accuracy ratio " + ("n/a (teacher 0)" if a["value"] is None else
                                                                  f"{a['value']:.3f}±{a['se']:.3f}"))
        save_instruct(student, args.out)
        return student
    return results[0]


def card_results(r: dict) -> list:
    """The model-index entries: accuracy overall and per kind, and the EOS stop rate."""
    from huggingface_hub import EvalResult

    where = dict(task_type="text-generation", dataset_type="linzoo-instruct",
                 dataset_name=f"instruction answers ({r['n']} short questions)")
    return [EvalResult(**where, metric_type="accuracy", metric_name="accuracy", metric_value=r["accuracy"]),
            *(EvalResult(**where, metric_type="accuracy", metric_name=f"accuracy ({kind})", metric_config=kind,
                         metric_value=v["accuracy"]) for kind, v in r["by_kind"].items()),
            EvalResult(**where, metric_type="eos_stop_rate", metric_name=f"stops within {r['max_new_tokens']} tokens",
                       metric_value=r["stop_rate"])]


CARD_SECTION = """### Instruction answers

{{ r.n }} short questions with known answers, each a user turn of the chat template, answered greedily in at most {{ r.max_new_tokens }} new tokens; a hit when an accepted answer is in the reply's first sentence (or first 20 words). Accuracy **{{ acc }}**{% if r.teacher %} against the teacher's {{ teacher_acc }} (ratio {{ acc_ratio }}){% endif %}; replies that stop (EOS) within the budget: {{ stop }}{% if r.teacher %} (teacher {{ teacher_stop }}){% endif %}. Standard errors after ±.

| questions | n | accuracy |{% if r.teacher %} teacher |{% endif %}
|---|---|---|{% if r.teacher %}---|{% endif %}
{% for row in rows %}| {{ row | join(" | ") }} |
{% endfor %}{% if figure %}
![Instruction answers: accuracy per kind and EOS stop rate]({{ figure }})
{% endif %}
"""


def _pm(value: float | None, se: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f} ± {se:.3f}"


def card_section(r: dict | None, folder: Path, sub: str = "") -> str:
    if r is None:  # optional: a card without it says nothing
        return ""
    t = r["teacher"]
    rows = [[kind, v["n"], _pm(v["accuracy"], v["accuracy_se"])]
            + ([_pm(t["by_kind"][kind]["accuracy"], t["by_kind"][kind]["accuracy_se"])] if t else [])
            for kind, v in r["by_kind"].items()]
    rows.append(["**all**", r["n"], f"**{_pm(r['accuracy'], r['accuracy_se'])}**"]
                + ([_pm(t["accuracy"], t["accuracy_se"])] if t else []))
    return render(CARD_SECTION, r=r, rows=rows, acc=_pm(r["accuracy"], r["accuracy_se"]),
                  stop=_pm(r["stop_rate"], r["stop_rate_se"]),
                  teacher_acc=t and _pm(t["accuracy"], t["accuracy_se"]),
                  teacher_stop=t and _pm(t["stop_rate"], t["stop_rate_se"]),
                  acc_ratio=t and _pm(r["ratio"]["accuracy"]["value"], r["ratio"]["accuracy"]["se"]),
                  figure=next((f for f in ((f"{EVAL_DIR}/{sub}/instruct.png",) if sub else FIGURES)
                               if (folder / f).is_file()), None))


def space_row(r: dict) -> list:
    kinds = ", ".join(f"{k}: {v['accuracy']:.2f}±{v['accuracy_se']:.2f}" for k, v in r["by_kind"].items())
    a = r["ratio"]["accuracy"] if r["teacher"] else None
    return [r["model"], f"{r['accuracy']:.3f}±{r['accuracy_se']:.3f}", kinds,
            f"{r['stop_rate']:.3f}±{r['stop_rate_se']:.3f}",
            "" if a is None else f"{r['teacher']['model']}: {_pm(a['value'], a['se']).replace(' ', '')}"]


EVAL = EvalSpec(
    arguments=InstructArguments,
    title="instruction answers", name="instruct", schema=SCHEMA, result_file="instruct.json", figures=("instruct.png",),
    help="short questions through the chat template: accuracy per kind and EOS stop rate, beside the teacher's "
         "(JSON + bars)",
    main=main, card_results=card_results, card_section=card_section,
    space_headers=("model", "accuracy", "accuracy by kind", "EOS stop rate", "ratio to teacher"), space_row=space_row,
    space_caption=lambda r: f"{r['model']}: instruction answers, accuracy {r['accuracy']:.2f}")


if __name__ == "__main__":
    main()
