"""Zero-shot quality and teacher recovery: lambada_openai, winogrande, arc_easy, arc_challenge and piqa scored by
lm-eval-harness, plus held-out perplexity and KL(teacher || student).

    linzoo eval quality --model runs/gdn --teacher embedded --data_dir ../shared/data/eval --limit 500

With --data_dir the tasks are lm-eval's prompts and metrics on `<data_dir>/<task>.jsonl` (the YAMLs in
lm_eval_tasks/), without it lm-eval's own tasks on their Hub datasets. linzoo adds what lm-eval lacks: recovery per
task = student score / teacher score x 100, where the score is acc_norm for the tasks that have it (arc_easy,
arc_challenge, piqa) and acc otherwise, "average" the mean over tasks; `chance`, the expected score of a uniform
random guess (1 / number of choices, averaged over the documents; 0 for LAMBADA), and `chance_recovery`, the
recovery such a guesser gets (about 65 % against SmolLM2-135M): a student near it has learnt nothing the tasks see.
The headline is therefore `recovery_above_chance`: (s - c) / (t - c) x 100, the share of the teacher's skill above
chance that the student keeps, averaged over the tasks where the teacher is >= 3 standard errors above chance, with
its standard error.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .common import (NOT_MEASURED, EvalSpec, ModelArguments, check_out_dir, check_quantize, load_for_eval, load_texts,
                     measured, model_device, name_of, parse_list, quantize_field, render, weights_sha256, write_json)

SCHEMA = "linzoo.quality/v1"
TASKS = ("lambada_openai", "winogrande", "arc_easy", "arc_challenge", "piqa")
NORMED = ("arc_easy", "arc_challenge", "piqa")  # tasks whose recovery uses acc_norm
TASKS_DIR = Path(__file__).resolve().parent / "lm_eval_tasks"
# task -> (dataset, config, split) that lm-eval's own task reads, for the model-index of model cards
# (hub_cards/card.py); tests/test_lm_eval.py checks it against lm-eval's task configs.
HUB = {
    "lambada_openai": ("EleutherAI/lambada_openai", "default", "test"),
    "winogrande": ("allenai/winogrande", "winogrande_xl", "validation"),
    "arc_easy": ("allenai/ai2_arc", "ARC-Easy", "test"),
    "arc_challenge": ("allenai/ai2_arc", "ARC-Challenge", "test"),
    "piqa": ("baber/piqa", None, "validation"),
}


def _check_task(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; known: {TASKS}")


def local_task(task: str) -> str:
    """The name of our lm-eval task (lm_eval_tasks/) that reads <data_dir>/<task>.jsonl."""
    return f"linzoo_{task}_local"


def check_data_dir(data_dir: str | os.PathLike, tasks) -> None:
    """A one-line error, before any model loads, for a missing or empty `<data_dir>/<task>.jsonl`."""
    expected = [f"{task}.jsonl" for task in tasks]
    missing = [name for name in expected if not (Path(data_dir) / name).is_file()]
    if missing:
        raise ValueError(f"--data_dir {data_dir} lacks {', '.join(missing)}: it must hold {', '.join(expected)} "
                         "(llm-foundry JSONL, see evals/LM_EVAL.md), or leave tasks out with --tasks")
    from .lm_eval_tasks.utils import read_rows

    empty = [name for name in expected if not read_rows(Path(data_dir) / name)]  # every row checked: file and line
    if empty:
        raise ValueError(f"--data_dir {data_dir}: no documents in {', '.join(empty)} (one JSON object a line), "
                         "or leave the task out with --tasks")


@functools.lru_cache(maxsize=4)
def task_manager(data_dir: str | None = None):
    """lm-eval's TaskManager: our YAMLs reading `data_dir`, or with None lm-eval's own tasks (indexing all of them
    takes most of a minute on a small CPU, hence the cache)."""
    from lm_eval.tasks import TaskManager

    if data_dir is None:
        return TaskManager()
    return TaskManager(include_path=str(TASKS_DIR), include_defaults=False, metadata={"data_dir": data_dir})


def load_tasks(tasks, data_dir: str | os.PathLike | None = None) -> dict:
    """{task: lm-eval Task}: ours on `<data_dir>/<task>.jsonl`, or lm-eval's own (Hub datasets) without data_dir."""
    tasks = parse_list(tasks, str)
    for task in tasks:
        _check_task(task)
    if data_dir is not None:
        data_dir = str(data_dir)
        check_data_dir(data_dir, tasks)
    names = {task: local_task(task) if data_dir is not None else task for task in tasks}
    try:
        loaded = task_manager(data_dir).load(list(names.values()))["tasks"]
    except OSError as err:  # lm-eval's own tasks download their datasets (datasets' ConnectionError, offline mode)
        if data_dir is not None:
            raise
        raise ValueError(f"lm-eval's own tasks ({', '.join(tasks)}) read their Hub datasets, which could not be reached "
                         f"({err}): pass --data_dir, a folder of the five .jsonl sets (evals/LM_EVAL.md), or set "
                         "$EVAL_DATA") from None
    return {task: loaded[name] for task, name in names.items()}


def task_docs(task: str, task_obj, limit: int | None = None) -> list[dict]:
    """The first `limit` documents lm-eval scores for a task (all without limit)."""
    docs = [dict(doc) for doc in itertools.islice(task_obj.eval_docs, limit)]
    if not docs:
        data_dir = (task_obj.config.metadata or {}).get("data_dir")
        where = Path(data_dir) / f"{task}.jsonl" if data_dir else f"lm-eval's task {task_obj.task_name}"
        raise ValueError(f"{task}: no documents in {where}{f' (limit {limit})' if limit is not None else ''}: "
                         "check the file, or leave the task out with --tasks")
    return docs


def load_task_docs(task: str, data_dir: str | None = None, limit: int | None = None) -> list[dict]:
    """The first `limit` docs of a task from `<data_dir>/<task>.jsonl`, or from lm-eval's Hub task without data_dir."""
    return task_docs(task, load_tasks([task], data_dir)[task], limit)


def chance_score(task_obj, docs: list[dict]) -> float:
    """The expected accuracy of a uniform random choice (the same for acc and acc_norm): the mean over docs of
    1 / number of choices; 0 for a task whose answer is generated (lambada_openai)."""
    if task_obj.OUTPUT_TYPE != "multiple_choice":
        return 0.0
    return sum(1 / len(task_obj.doc_to_choice(doc)) for doc in docs) / len(docs)


def run_lm_eval(model, tokenizer, task_objs: dict, limit: int | None = None, batch_size: int = 8,
                log_samples: bool = False) -> dict:
    """lm-eval's `simple_evaluate` output for a loaded model on lm-eval Task objects (from `load_tasks`).
    Log-softmax in fp32 whatever the model's dtype; bootstrap_iters only sets the resampling behind LAMBADA's
    perplexity stderr (acc's stderr has a closed form). The tasks come built, so the TaskManager indexes nothing."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    lm = HFLM(pretrained=model, tokenizer=tokenizer, backend="causal", batch_size=batch_size,
              softmax_dtype=torch.float32)
    return lm_eval.simple_evaluate(model=lm, tasks=list(task_objs.values()), limit=limit, log_samples=log_samples,
                                   bootstrap_iters=100, task_manager=TaskManager(include_defaults=False))


def task_scores(output: dict, task_obj, docs: list[dict]) -> dict:
    """{"acc", "acc_stderr", "acc_norm", "acc_norm_stderr" (the tasks lm-eval gives acc_norm), "n", "chance"} of
    one task from lm-eval's output; a stderr is None where lm-eval has none (a single document)."""
    row, scores = output["results"][task_obj.task_name], {}
    for metric in ("acc", "acc_norm"):
        if f"{metric},none" in row:
            stderr = row[f"{metric}_stderr,none"]
            scores |= {metric: row[f"{metric},none"], f"{metric}_stderr": stderr if isinstance(stderr, float) else None}
    return {**scores, "n": len(docs), "chance": chance_score(task_obj, docs)}


def score_tasks(model, tokenizer, task_objs: dict, docs: dict, limit: int | None = None, batch_size: int = 8) -> dict:
    output = run_lm_eval(model, tokenizer, task_objs, limit, batch_size)
    return {task: task_scores(output, obj, docs[task]) for task, obj in task_objs.items()}


def max_length(model, tokenizer) -> int:
    n = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return n or (tokenizer.model_max_length if tokenizer.model_max_length < 1_000_000 else 2048)


def _pad_id(tokenizer) -> int:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return pad if pad is not None else 0


def token_stream(tokenizer, texts: list[str], max_tokens: int) -> list[int]:
    """The first `max_tokens` + 1 token ids of `texts`, documents joined by EOS (`max_tokens` predicted tokens)."""
    stream: list[int] = []
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    for text in texts:
        stream += tokenizer(text, add_special_tokens=False)["input_ids"] + eos
        if len(stream) > max_tokens:
            break
    return stream[:max_tokens + 1]


def chat_rows(tokenizer, chats: list[list[dict]], max_tokens: int, block: int) -> list[tuple[list[int], list[bool]]]:
    """Held-out chats as rows to score: each chat through the chat template, cut to `block` + 1 tokens, with only its
    last assistant turn's tokens (the end-of-turn included) scored, until `max_tokens` are scored. The turn's tokens
    are those after the prompt as `add_generation_prompt` renders it (the template's system prompt included)."""
    rows, count = [], 0
    for messages in chats:
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
        if last is None:
            continue
        prompt = tokenizer.apply_chat_template(messages[:last], add_generation_prompt=True, tokenize=False)
        full = tokenizer.apply_chat_template(messages[:last + 1], tokenize=False)
        if not full.startswith(prompt):
            raise ValueError("the chat template renders a prompt that is not the start of the whole chat: assistant "
                             "tokens cannot be told apart")
        n = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        ids = tokenizer(full, add_special_tokens=False)["input_ids"][:block + 1]
        scored = [i + 1 >= n for i in range(len(ids) - 1)]  # target i + 1 is scored when it is the answer's
        if any(scored):
            rows.append((ids, scored))
            count += sum(scored)
        if count >= max_tokens:
            break
    return rows


@torch.inference_mode()
def heldout_metrics(model, tokenizer, texts: list[str], max_tokens: int = 16384, teacher=None,
                    block_size: int = 1024, batch_size: int = 4, token_chunk: int = 2048, chats=None) -> dict:
    """Perplexity over the first `max_tokens` predicted tokens of `texts` (documents joined by EOS, cut
    into blocks), and with a teacher its perplexity and the mean per-token KL(teacher || student) on
    the same token ids (the student's tokenizer serves both, so the vocabularies must match). With `chats` (lists of
    messages) instead of texts: the same on their last assistant turns only (`chat_rows`). Memory: each
    model's logits for `batch_size` blocks (batch x block x vocab, in the model's dtype), then fp32 log-probs
    `token_chunk` tokens at a time (~4 x token_chunk x vocab floats)."""
    block = min(block_size, max_length(model, tokenizer))
    if chats is not None:
        rows = chat_rows(tokenizer, chats, max_tokens, block)
    else:
        stream = token_stream(tokenizer, texts, max_tokens)
        rows = [(b, [True] * (len(b) - 1)) for b in (stream[i:i + block + 1] for i in range(0, len(stream) - 1, block))]
    if teacher is not None:  # probe with token 0, which every vocabulary has, before feeding real ids
        probe = [lm(input_ids=torch.zeros((1, 1), dtype=torch.long, device=model_device(lm))).logits.shape[-1]
                 for lm in (model, teacher)]
        if probe[0] != probe[1]:
            raise ValueError(f"KL(teacher || student) needs one vocabulary: the student has {probe[0]} logits, "
                             f"the teacher {probe[1]}")
    nll = {"student": 0.0, "teacher": 0.0}
    kl, count, device = 0.0, 0, model_device(model)
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        width = max(len(b) for b, _ in chunk)
        ids = torch.tensor([b + [_pad_id(tokenizer)] * (width - len(b)) for b, _ in chunk])
        mask = torch.tensor([[1] * len(b) + [0] * (width - len(b)) for b, _ in chunk])
        valid = torch.tensor([scored + [False] * (width - 1 - len(scored)) for _, scored in chunk])
        targets = ids[:, 1:][valid].to(device)
        logits = {}
        for role, lm in (("student", model), ("teacher", teacher)):
            if lm is not None:
                dev = model_device(lm)
                logits[role] = lm(input_ids=ids.to(dev), attention_mask=mask.to(dev)).logits[:, :-1][valid.to(dev)]
        for at in range(0, targets.numel(), token_chunk):  # fp32 log-probs of a slice of tokens at a time
            target = targets[at:at + token_chunk, None]
            logp = {role: torch.log_softmax(x[at:at + token_chunk].float(), dim=-1).to(device)
                    for role, x in logits.items()}
            for role, lp in logp.items():
                nll[role] -= lp.gather(-1, target).sum().item()
            if teacher is not None:
                kl += (logp["teacher"].exp() * (logp["teacher"] - logp["student"])).sum().item()
        count += int(targets.numel())
    return {"perplexity": math.exp(nll["student"] / count),
            "teacher_perplexity": math.exp(nll["teacher"] / count) if teacher is not None else None,
            "kl_to_teacher": kl / count if teacher is not None else None,
            "heldout_tokens": count}


def docs_fingerprint(docs: list[dict]) -> str:
    """sha256 of a task's documents (as loaded, in order): two results files with the same fingerprint were
    scored on the same documents."""
    return hashlib.sha256(json.dumps(docs, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def reuse_teacher_scores(teacher_results: dict, tasks: list[str], docs: dict, limit: int | None) -> dict:
    """The task scores of an earlier `quality.json` of the teacher, checked to cover the same tasks and
    documents (their fingerprints; counts only, for files written before fingerprints were recorded), so
    several students are compared without re-scoring the teacher for each."""
    if teacher_results.get("schema") != SCHEMA:
        raise ValueError(f"teacher results must be a {SCHEMA} quality.json, got schema {teacher_results.get('schema')!r}")
    if teacher_results.get("teacher") is not None:
        raise ValueError(f"these results are a student's ({teacher_results.get('model')!r}, scored against "
                         f"{teacher_results['teacher']!r}): pass the teacher's own quality.json, made without --teacher")
    have = teacher_results.get("tasks") or {}
    missing = [t for t in tasks if t not in have]
    if missing:
        raise ValueError(f"the teacher results have no scores for {missing} (they hold {sorted(have)}): run "
                         "`linzoo eval quality --model <teacher>` with these tasks, or pass --teacher instead")
    if any(have[t]["n"] != len(docs[t]) for t in tasks):
        raise ValueError(
            f"the teacher results were scored on other documents (n {[have[t]['n'] for t in tasks]}, limit "
            f"{teacher_results.get('limit')}) than this run (n {[len(docs[t]) for t in tasks]}, limit {limit}): "
            "use the same --data_dir and --limit for both")
    prints = teacher_results.get("docs_sha256") or {}
    differ = [t for t in tasks if t in prints and prints[t] != docs_fingerprint(docs[t])]
    if differ:
        raise ValueError(f"the teacher results were scored on other documents for {differ} (same counts, different "
                         "contents): use the same --data_dir and --limit for both")
    return {t: have[t] for t in tasks}


CHANCE_SE = 3.0  # a task counts when the teacher is at least this many standard errors above chance


def above_chance_recovery(scores: dict, teacher_scores: dict, metric: dict) -> dict:
    """The headline: the share of the teacher's skill above chance that the student keeps, (s - c) / (t - c) x 100
    per task, averaged over the tasks where the teacher is >= CHANCE_SE binomial standard errors
    (sqrt(t (1 - t) / n)) above chance c; other tasks are None (a teacher at chance leaves nothing to recover).
    "stderr": each counted task's standard error, the student's and the teacher's binomial errors carried through
    (s - c) / (t - c) as if independent (first order), and the average's, sqrt(sum of squares) / number of tasks."""
    table, counted, stderr = {}, [], {}
    for task, r in scores.items():
        s, t, c = r[metric[task]], teacher_scores[task][metric[task]], r["chance"]
        n = teacher_scores[task].get("n", r["n"])
        se_t = math.sqrt(t * (1 - t) / n) if n else float("inf")
        if t - c >= CHANCE_SE * se_t and t > c:
            table[task] = (s - c) / (t - c) * 100
            counted.append(task)
            se_s = math.sqrt(s * (1 - s) / r["n"])
            stderr[task] = math.hypot(se_s / (t - c), (s - c) * se_t / (t - c) ** 2) * 100
        else:
            table[task] = stderr[task] = None
    stderr["average"] = math.sqrt(sum(stderr[t] ** 2 for t in counted)) / len(counted) if counted else None
    return {**table, "average": sum(table[t] for t in counted) / len(counted) if counted else None,
            "tasks": counted, "min_teacher_se_above_chance": CHANCE_SE, "stderr": stderr}


def with_stderr(value: float | None, stderr: float | None) -> str:
    """'41.5% ± 3.2' (or '41.5%' for results made before the standard error was kept); NOT_MEASURED for None."""
    return measured(value, "{:.1f}%") + ("" if value is None or stderr is None else f" ± {stderr:.1f}")


def evaluate_quality(model, tokenizer, tasks=TASKS, data_dir: str | None = None, limit: int | None = None,
                     batch_size: int = 8, teacher=None, teacher_tokenizer=None, heldout=None,
                     heldout_tokens: int = 16384, model_name: str | None = None,
                     teacher_name: str | None = None, teacher_results: dict | None = None,
                     heldout_chats: str = "embedded", heldout_chat_tokens: int = 0) -> dict:
    """The linzoo.quality/v1 dict. `heldout`: texts for perplexity (None = linzoo.data's "embedded" test
    split, or a .txt path / spec / list); heldout_tokens=0 skips perplexity and KL. `teacher_results`: the
    teacher's own quality dict on the same documents; its task scores are reused (recovery needs no teacher
    model then; a `teacher` model still gives the held-out KL). `heldout_chat_tokens` > 0: the same held-out numbers
    on the test chats of `heldout_chats`, their last assistant turns only (the `chat_` keys)."""
    task_objs = load_tasks(tasks, data_dir)  # first: a missing file or unknown task fails before any model runs
    tasks = list(task_objs)
    docs = {task: task_docs(task, obj, limit) for task, obj in task_objs.items()}
    metric = {task: "acc_norm" if task in NORMED else "acc" for task in tasks}
    teacher_scores = recovery = chance_recovery = above_chance = None
    if teacher_results is not None:
        teacher_scores = reuse_teacher_scores(teacher_results, tasks, docs, limit)
        teacher_name = teacher_name or teacher_results.get("model")
    held = {"perplexity": None, "teacher_perplexity": None, "kl_to_teacher": None, "heldout_tokens": 0}
    if heldout_tokens > 0:  # before the tasks, so a vocabulary mismatch fails before the long task runs
        texts = load_texts("embedded" if heldout is None else heldout, split="test")
        # at most 4 blocks of 1,024 tokens at once: the task batch (64 on a GPU) would hold 16 blocks' logits
        held = heldout_metrics(model, tokenizer, texts, heldout_tokens, teacher, batch_size=min(batch_size, 4))
    if heldout_chat_tokens > 0:  # the same on held-out chats, their last assistant turns only
        from linzoo.data import load_chat_dataset

        chats = load_chat_dataset(heldout_chats, split="test")["messages"]
        chat = heldout_metrics(model, tokenizer, None, heldout_chat_tokens, teacher, batch_size=min(batch_size, 4),
                               chats=chats)
        held |= {f"chat_{k}": v for k, v in chat.items()}
    scores = score_tasks(model, tokenizer, task_objs, docs, limit, batch_size)
    if teacher_results is None and teacher is not None:
        teacher_scores = score_tasks(teacher, teacher_tokenizer or tokenizer, task_objs, docs, limit, batch_size)
    if teacher_scores is not None:
        def percent_of_teacher(key) -> dict:  # key(task) -> the score to compare; tasks the teacher scored 0: None
            table = {task: key(task) / teacher_scores[task][metric[task]] * 100
                     if teacher_scores[task][metric[task]] else None for task in tasks}
            defined = [r for r in table.values() if r is not None]
            return {**table, "average": sum(defined) / len(defined) if defined else None}

        recovery = percent_of_teacher(lambda task: scores[task][metric[task]])
        chance_recovery = percent_of_teacher(lambda task: scores[task]["chance"])
        above_chance = above_chance_recovery(scores, teacher_scores, metric)
    return {
        "schema": SCHEMA,
        "model": model_name or name_of(model),
        "teacher": (teacher_name or name_of(teacher)) if teacher_scores is not None else None,
        "limit": limit,
        "tasks": scores,
        "teacher_tasks": teacher_scores,
        "recovery_above_chance": above_chance,
        "recovery": recovery,
        "recovery_metric": metric,
        "chance_recovery": chance_recovery,
        "docs_sha256": {task: docs_fingerprint(docs[task]) for task in tasks},
        **held,
    }


def save_quality(results: dict, out_dir: str | os.PathLike) -> tuple[Path, Path]:
    """Writes quality.json and quality.png (student vs teacher per task, recovery % above each pair)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / "quality.json", out / "quality.png"
    write_json(results, json_path)

    tasks, metric = list(results["tasks"]), results["recovery_metric"]
    bars = [(f"student: {results['model']}", results["tasks"])]
    if results["teacher_tasks"]:
        bars.append((f"teacher: {results['teacher']}", results["teacher_tasks"]))
    width = 0.8 / len(bars)
    fig = Figure(figsize=(1.6 * len(tasks) + 2, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for k, (label, scores) in enumerate(bars):
        xs = [i + (k - (len(bars) - 1) / 2) * width for i in range(len(tasks))]
        ax.bar(xs, [scores[t][metric[t]] for t in tasks], width, label=label)
    chance = [results["tasks"][t].get("chance") for t in tasks]  # absent in results made before it was added
    if all(c is not None for c in chance):
        ax.hlines(chance, [i - 0.45 for i in range(len(tasks))], [i + 0.45 for i in range(len(tasks))],
                  colors="black", linestyles="dashed", linewidth=1, zorder=3, label="chance (uniform guess)")
    for i, task in enumerate(tasks):
        if results["recovery"] and results["recovery"][task] is not None:
            top = max(scores[task][metric[task]] for _, scores in bars)
            ax.text(i, top + 0.02, f"{results['recovery'][task]:.0f}%", ha="center", fontsize=9)
    ax.set_xticks(range(len(tasks)), [f"{t}\n({metric[t]})" for t in tasks], fontsize=8)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("accuracy")
    title = f"{results['model']}"
    above = _average_and_stderr(results.get("recovery_above_chance"))  # absent in results made before it was added
    if above[0] is not None:
        title += f" - keeps {with_stderr(*above)} of {results['teacher']}'s skill above chance"
    if results["recovery"] and results["recovery"]["average"] is not None:
        title += f"\nrecovery {results['recovery']['average']:.1f}%"
        if (results.get("chance_recovery") or {}).get("average") is not None:
            title += f" (a uniform guess: {results['chance_recovery']['average']:.1f}%)"
    if results["perplexity"] is not None:
        title += f", held-out perplexity {results['perplexity']:.2f}"
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    return json_path, png_path


def check_teacher_results(path, model: str) -> None:
    """A ValueError unless the quality.json at `path` is another model's than `model`: the results of the student
    itself would make its recovery 100 %."""
    from linzoo.integrity import read_json

    data = read_json(path)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"--teacher_results {path} is not a quality.json (schema {SCHEMA}): pass the file that "
                         "`linzoo eval quality --model <teacher>` wrote")
    theirs, ours = data.get("weights_sha256"), weights_sha256(model)
    same = data.get("model") == model or (theirs is not None and theirs == ours)
    if same:
        raise ValueError(f"--teacher_results {path} holds the results of --model {model} itself (the same "
                         f"{'weights' if theirs == ours else 'model'}): pass the teacher's quality.json")


@dataclass
class QualityArguments(ModelArguments):
    out: str = field(default="outputs/quality", metadata={"help": "output folder"})
    tasks: str = field(default=",".join(TASKS), metadata={"help": "comma-separated task names"})
    data_dir: str | None = field(default=None, metadata={
        "help": "folder of <task>.jsonl; default: $EVAL_DATA, else lm-eval's own tasks on the Hub datasets"})
    limit: int | None = field(default=None, metadata={"help": "first N docs per task (default: all)"})
    heldout: str = field(default="embedded", metadata={"help": "held-out texts: linzoo.data spec or .txt path"})
    heldout_tokens: int = field(default=16384, metadata={"help": "perplexity token budget (0 = skip)"})
    heldout_chats: str = field(default="embedded", metadata={
        "help": "held-out chats (the test split of a linzoo.data chat spec) for --heldout_chat_tokens"})
    heldout_chat_tokens: int = field(default=0, metadata={
        "help": "perplexity and KL on held-out chats, their last assistant turns only: the assistant tokens to score "
                "(0 = skip)"})
    teacher_results: str | None = field(default=None, metadata={
        "help": "the teacher's quality.json on the same tasks/--limit: its scores are reused, not recomputed "
                "(--teacher is then needed only for the held-out KL)"})
    quantize: str = quantize_field("the student's (the teacher stays the reference): what quantization costs")

    LIMITS = {"limit": {"min": 1}, "heldout_tokens": {"min": 0}, "heldout_chat_tokens": {"min": 0}}

    def __post_init__(self):  # checked here, before any model loads
        super().__post_init__()
        check_quantize(self.quantize, self.device, self.dtype)
        for task in parse_list(self.tasks, str):
            _check_task(task)
        if self.teacher_results is not None and not Path(self.teacher_results).is_file():
            raise ValueError(f"--teacher_results {self.teacher_results} is not a file: pass the quality.json that "
                             "`linzoo eval quality --model <teacher>` wrote")
        if self.teacher_results is not None:
            check_teacher_results(self.teacher_results, self.model)
        self.data_dir = self.data_dir or os.environ.get("EVAL_DATA") or None
        if self.data_dir is not None:
            check_data_dir(self.data_dir, parse_list(self.tasks, str))
        check_out_dir(self.out)


def main(argv: list[str] | None = None) -> dict:
    from linzoo.arguments import parse_arguments

    (args,) = parse_arguments(QualityArguments, argv)
    teacher_results = json.loads(Path(args.teacher_results).read_text()) if args.teacher_results else None
    model, tokenizer = load_for_eval(args.model, args.device, args.dtype, trust_remote_code=args.trust_remote_code,
                                    quantize=args.quantize)
    teacher, teacher_tokenizer = (load_for_eval(args.teacher, args.device, args.dtype, teacher=True,
                                                trust_remote_code=args.trust_remote_code)
                                  if args.teacher else (None, None))
    results = evaluate_quality(model, tokenizer, args.tasks, args.data_dir, args.limit, args.batch_size, teacher,
                               teacher_tokenizer, args.heldout, args.heldout_tokens, args.model, args.teacher,
                               teacher_results, args.heldout_chats, args.heldout_chat_tokens)
    if args.quantize != "none":
        results["quantize"] = args.quantize  # the card leaves these out: not the weights as they are
    json_path, _ = save_quality(results, args.out)
    summary = {t: round(s[results["recovery_metric"][t]], 4) for t, s in results["tasks"].items()}
    if results["teacher_tasks"] is None:
        versus = "(no --teacher or --teacher_results: no recovery)"
    else:
        chance, recovery = results["chance_recovery"]["average"], results["recovery"]["average"]
        above = _average_and_stderr(results["recovery_above_chance"])
        above = with_stderr(*above) if above[0] is not None else "n/a (the teacher is near chance on every task)"
        versus = (f"recovery above chance={above} "
                  f"recovery={measured(recovery, '{:.1f}%')} (a uniform guess: {measured(chance, '{:.1f}%')})")
    print(f"{args.model}: {summary} {versus} -> {json_path}")
    return results


def card_results(q: dict) -> list:
    """The model-index entries of a quality.json: per task acc/acc_norm and the recoveries, the suite's averages,
    held-out perplexity and KL (the student's own numbers; teacher scores stay in the card's body)."""
    from huggingface_hub import EvalResult

    out = []
    for task, scores in q["tasks"].items():
        hub, config, split = HUB[task]
        where = dict(task_type="text-generation", dataset_type=hub, dataset_name=task, dataset_config=config,
                     dataset_split=split, dataset_args={"limit": q["limit"]} if q["limit"] else None)
        out += [EvalResult(**where, metric_type=m, metric_name=m, metric_value=scores[m])
                for m in ("acc", "acc_norm") if m in scores]
        if (q["recovery"] or {}).get(task) is not None:
            out.append(EvalResult(**where, metric_type="teacher_recovery", metric_value=q["recovery"][task],
                                  metric_name=f"teacher recovery % ({q['recovery_metric'][task]})"))
        if (q.get("recovery_above_chance") or {}).get(task) is not None:
            out.append(EvalResult(**where, metric_type="teacher_recovery_above_chance",
                                  metric_value=q["recovery_above_chance"][task],
                                  metric_name=f"teacher recovery above chance % ({q['recovery_metric'][task]})"))
    suite = dict(task_type="text-generation", dataset_type="linzoo-zero-shot", dataset_name="zero-shot average")
    above = q.get("recovery_above_chance") or {}
    if above.get("average") is not None:
        out.append(EvalResult(**suite, metric_type="teacher_recovery_above_chance", metric_value=above["average"],
                              metric_name=f"teacher recovery above chance % over {len(above['tasks'])} tasks"))
    if (q["recovery"] or {}).get("average") is not None:
        out.append(EvalResult(**suite, metric_type="teacher_recovery", metric_value=q["recovery"]["average"],
                              metric_name=f"teacher recovery % over {len(q['tasks'])} tasks"))
    heldout = dict(task_type="text-generation", dataset_type="linzoo-heldout",
                   dataset_name=f"held-out text ({q['heldout_tokens']} tokens)")
    for metric in ("perplexity", "kl_to_teacher"):
        if q.get(metric) is not None:
            out.append(EvalResult(**heldout, metric_type=metric, metric_name=metric, metric_value=q[metric]))
    return out


CARD_SECTION = """Zero-shot, scored by lm-eval-harness{% if quality and quality.limit %} (first {{ quality.limit }} examples per task){% endif %}.
{% if above_measured %}**This model keeps {{ above_chance }} of its teacher's skill above chance**{% else %}**Recovery above chance: {{ above_chance }}**{% if quality and quality.teacher_tasks %} (the teacher is within 3 standard errors of chance on every task scored){% endif %}{% endif %}: (s − c) / (t − c) × 100 for its score s,
the teacher's t and chance c, averaged over the tasks where the teacher is at least 3 standard errors above chance{% if quality and quality.teacher %} (teacher: {{ quality.teacher }}){% endif %};
± is one standard error (both models' binomial errors over the task's documents).
Recovery = s / t × 100, the ratio often quoted, counts chance as skill.

| task | metric | this model | teacher | chance | above chance | recovery |
|---|---|---|---|---|---|---|
{% for row in rows %}| {{ row | join(" | ") }} |
{% endfor %}| **average** | | | | | **{{ above_chance }}** | {{ average_recovery }} |

Chance is what a uniform random guess scores (0 on LAMBADA, whose answer is generated){% if quality and quality.chance_recovery %}; such a guess would
recover {{ chance_recovery }} of the teacher, so recovery means something only well above that{% endif %}.

- Held-out perplexity: {{ perplexity }}
- KL(teacher ‖ student) per token: {{ kl }}

"""


def _card_rows(q: dict | None) -> list[list[str]]:
    """task, metric, this model, teacher, chance (a uniform guess's score), recovery above chance, recovery."""
    if q is None:
        return [[task, "acc_norm" if task in NORMED else "acc", *[NOT_MEASURED] * 5] for task in TASKS]
    rows = []
    for task, scores in q["tasks"].items():
        metric = q["recovery_metric"][task]
        teacher = (q["teacher_tasks"] or {}).get(task, {}).get(metric)
        recovery = measured((q["recovery"] or {}).get(task), "{:.1f}%")
        above = q.get("recovery_above_chance")
        above = (with_stderr(above.get(task), (above.get("stderr") or {}).get(task)) if task in above["tasks"]
                 else "(teacher near chance)") if above else NOT_MEASURED
        rows.append([task, metric, measured(scores[metric]), measured(teacher), measured(scores.get("chance")),
                     above, recovery])
    return rows


def _average_and_stderr(above: dict | None) -> tuple:
    above = above or {}
    return above.get("average"), (above.get("stderr") or {}).get("average")


def card_section(q: dict | None, folder: Path, sub: str = "") -> str:  # no figure: `sub` is not needed
    return render(CARD_SECTION, quality=q, rows=_card_rows(q),
                  average_recovery=measured((q["recovery"] or {}).get("average") if q else None, "{:.1f}%"),
                  above_chance=with_stderr(*_average_and_stderr((q or {}).get("recovery_above_chance"))),
                  above_measured=_average_and_stderr((q or {}).get("recovery_above_chance"))[0] is not None,
                  chance_recovery=measured(((q or {}).get("chance_recovery") or {}).get("average"), "{:.1f}%"),
                  perplexity=measured(q and q.get("perplexity"), "{:.2f}"),
                  kl=measured(q and q.get("kl_to_teacher"), "{:.4f}"))


def space_row(data: dict) -> list:
    rec = data.get("recovery") or {}
    return [data["model"], data.get("teacher") or NOT_MEASURED, *(measured(rec.get(task), "{:.1f}%") for task in TASKS),
            with_stderr(*_average_and_stderr(data.get("recovery_above_chance"))),
            measured(rec.get("average"), "{:.1f}%"),
            measured((data.get("chance_recovery") or {}).get("average"), "{:.1f}%"),
            measured(data.get("perplexity"), "{:.2f}")]


EVAL = EvalSpec(
    arguments=QualityArguments,
    title="teacher recovery", name="quality", help="zero-shot tasks, perplexity, KL and teacher recovery (JSON + bars)", schema=SCHEMA,
    result_file="quality.json", figures=("quality.png",), main=main, card_results=card_results,
    card_section=card_section, space_row=space_row,
    space_headers=("model", "teacher", *TASKS, "above chance (average)", "average", "a uniform guess's average",
                   "perplexity"))


if __name__ == "__main__":
    main()
