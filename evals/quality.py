"""Zero-shot quality and teacher recovery: lambada_openai, winogrande, arc_easy, arc_challenge and piqa
scored as lm-eval-harness does, plus held-out perplexity and KL(teacher || student).

    linzoo eval quality --model runs/gdn --teacher embedded --data_dir ../shared/data/eval --limit 500

Recovery per task = student score / teacher score x 100, where the score is acc_norm for the tasks
that have it (arc_easy, arc_challenge, piqa) and acc otherwise; "average" is the mean over tasks.
Each task also reports `chance`, the expected score of a uniform random guess (1 / number of choices,
averaged over its documents; 0 for LAMBADA), and `chance_recovery` is the recovery such a guesser gets
(about 65 % against SmolLM2-135M): a student near it has learnt nothing the tasks can see.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .niah import ModelArguments, load_for_eval, load_texts, model_device, name_of, parse_list

SCHEMA = "linzoo.quality/v1"
TASKS = ("lambada_openai", "winogrande", "arc_easy", "arc_challenge", "piqa")
NORMED = ("arc_easy", "arc_challenge", "piqa")  # tasks reporting acc_norm, which their recovery uses
# task -> (Hub dataset, config, split) of lm-eval-harness's versions. Best effort: written against the
# datasets' documented columns but never run here (no Hub access). piqa: baber/piqa, the parquet copy that
# lm-eval-harness itself reads (the original ybisk/piqa is a loading script that `datasets` 4 refuses).
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


def _from_hub_row(task: str, row: dict) -> dict:
    """A Hub row in the local JSONL format (the one /work/shared/data/eval documents)."""
    if task == "lambada_openai":
        context, _, word = row["text"].rpartition(" ")
        return {"context": context, "continuation": word}
    if task == "winogrande":
        blank = row["sentence"].index("_")
        return {"context_options": [row["sentence"][:blank] + row[o] for o in ("option1", "option2")],
                "continuation": row["sentence"][blank + 1:].strip(), "gold": int(row["answer"]) - 1}
    if task in ("arc_easy", "arc_challenge"):
        return {"query": f"Question: {row['question']}", "choices": row["choices"]["text"],
                "gold": row["choices"]["label"].index(row["answerKey"])}
    return {"query": f"Question: {row['goal']}", "choices": [row["sol1"], row["sol2"]], "gold": int(row["label"])}


def load_task_docs(task: str, data_dir: str | None = None, limit: int | None = None) -> list[dict]:
    """The first `limit` docs of a task from `<data_dir>/<task>.jsonl`, or from the Hub without data_dir."""
    _check_task(task)
    if data_dir is not None:
        with open(Path(data_dir) / f"{task}.jsonl", encoding="utf-8") as f:
            docs = [json.loads(line) for line in f if line.strip()]
    else:
        from datasets import load_dataset

        path, config, split = HUB[task]
        docs = [_from_hub_row(task, row) for row in load_dataset(path, config, split=split)]
    if not docs[:limit]:
        where = f"{Path(data_dir) / f'{task}.jsonl'}" if data_dir is not None else f"the Hub dataset {HUB[task][0]}"
        raise ValueError(f"{task}: no documents in {where}{f' (limit {limit})' if limit is not None else ''}: "
                         "check the file, or leave the task out with --tasks")
    return docs[:limit]


def task_requests(task: str, doc: dict) -> list[tuple[str, str]]:
    """(context, continuation) pairs, one per choice, as lm-eval builds them (target_delimiter " ")."""
    _check_task(task)
    if task == "lambada_openai":
        return [(doc["context"], " " + doc["continuation"])]
    if task == "winogrande":  # lm-eval's partial scoring: the option ends the context
        return [(option, " " + doc["continuation"].strip()) for option in doc["context_options"]]
    context = doc["query"].rstrip() + "\nAnswer:"  # lm-eval's "Question: ...\nAnswer:"
    return [(context, " " + choice) for choice in doc["choices"]]


def chance_score(task: str, docs: list[dict]) -> float:
    """The expected accuracy of a uniform random choice (the same for acc and acc_norm): the mean over docs
    of 1 / number of choices (one request per choice); 0 for lambada_openai, whose answer is generated."""
    if task == "lambada_openai":
        return 0.0
    return sum(1 / len(task_requests(task, doc)) for doc in docs) / len(docs)


def max_length(model, tokenizer) -> int:
    n = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return n or (tokenizer.model_max_length if tokenizer.model_max_length < 1_000_000 else 2048)


def _encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    spaces = len(context) - len(context.rstrip())  # trailing context whitespace belongs to the continuation
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    ctx = tokenizer(context, add_special_tokens=False)["input_ids"]
    cont = tokenizer(continuation, add_special_tokens=False)["input_ids"]
    if not ctx:  # an empty context is conditioned on the end-of-text token, as lm-eval does
        ctx = [tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id]
    return ctx, cont


def _pad_id(tokenizer) -> int:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return pad if pad is not None else 0


@torch.inference_mode()
def loglikelihoods(model, tokenizer, requests: list[tuple[str, str]], batch_size: int = 8,
                   desc: str = "loglikelihood") -> list[tuple[float, bool]]:
    """(sum of log p(continuation tokens | context), whether greedy decoding yields them) per request.
    Only the continuation tokens are scored; long inputs lose tokens on the left."""
    pairs = [_encode_pair(tokenizer, c, x) for c, x in requests]
    limit, device, pad = max_length(model, tokenizer), model_device(model), _pad_id(tokenizer)
    order = sorted(range(len(pairs)), key=lambda i: -len(pairs[i][0]) - len(pairs[i][1]))
    results: list[tuple[float, bool] | None] = [None] * len(pairs)
    for start in tqdm(range(0, len(order), batch_size), desc=desc, unit="batch", leave=False):
        idx = order[start:start + batch_size]
        rows = [(ctx + cont)[-(limit + 1):][:-1] for ctx, cont in (pairs[i] for i in idx)]
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for b, row in enumerate(rows):  # right padding keeps every row's positions from 0
            input_ids[b, :len(row)] = torch.tensor(row)
            attention_mask[b, :len(row)] = 1
        logits = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)).logits
        for b, i in enumerate(idx):
            cont = torch.tensor(pairs[i][1], device=logits.device)
            n = len(rows[b])
            logprobs = torch.log_softmax(logits[b, n - len(cont):n].float(), dim=-1)
            results[i] = (logprobs.gather(-1, cont[:, None]).sum().item(), bool((logprobs.argmax(-1) == cont).all()))
    return results


def score_task(model, tokenizer, task: str, docs: list[dict], batch_size: int = 8) -> dict:
    """{"acc", "acc_norm" (arc/piqa only), "n", "chance"}. acc_norm divides each choice's log-likelihood by the
    choice's length in characters (lm-eval's completion_len, delimiter excluded)."""
    per_doc = [task_requests(task, doc) for doc in docs]
    flat = loglikelihoods(model, tokenizer, [r for reqs in per_doc for r in reqs], batch_size, desc=task)
    acc, acc_norm, pos = 0.0, 0.0, 0
    for doc, reqs in zip(docs, per_doc):
        scored, pos = flat[pos:pos + len(reqs)], pos + len(reqs)
        if task == "lambada_openai":
            acc += scored[0][1]
            continue
        lls = [ll for ll, _ in scored]
        acc += max(range(len(lls)), key=lls.__getitem__) == doc["gold"]
        if task in NORMED:
            normed = [ll / len(choice) for ll, choice in zip(lls, doc["choices"])]
            acc_norm += max(range(len(normed)), key=normed.__getitem__) == doc["gold"]
    n = len(docs)
    return {"acc": acc / n, **({"acc_norm": acc_norm / n} if task in NORMED else {}), "n": n,
            "chance": chance_score(task, docs)}


@torch.inference_mode()
def heldout_metrics(model, tokenizer, texts: list[str], max_tokens: int = 16384, teacher=None,
                    block_size: int = 1024, batch_size: int = 4, token_chunk: int = 2048) -> dict:
    """Perplexity over the first `max_tokens` predicted tokens of `texts` (documents joined by EOS, cut
    into blocks), and with a teacher its perplexity and the mean per-token KL(teacher || student) on
    the same token ids (the student's tokenizer serves both, so the vocabularies must match). Memory: each
    model's logits for `batch_size` blocks (batch x block x vocab, in the model's dtype), then fp32 log-probs
    `token_chunk` tokens at a time (~4 x token_chunk x vocab floats)."""
    stream: list[int] = []
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    for text in texts:
        stream += tokenizer(text, add_special_tokens=False)["input_ids"] + eos
        if len(stream) > max_tokens:
            break
    stream = stream[:max_tokens + 1]
    block = min(block_size, max_length(model, tokenizer))
    blocks = [stream[i:i + block + 1] for i in range(0, len(stream) - 1, block)]
    if teacher is not None:  # probe with token 0, which every vocabulary has, before feeding real ids
        probe = [lm(input_ids=torch.zeros((1, 1), dtype=torch.long, device=model_device(lm))).logits.shape[-1]
                 for lm in (model, teacher)]
        if probe[0] != probe[1]:
            raise ValueError(f"KL(teacher || student) needs one vocabulary: the student has {probe[0]} logits, "
                             f"the teacher {probe[1]}")
    nll = {"student": 0.0, "teacher": 0.0}
    kl, count, device = 0.0, 0, model_device(model)
    for start in range(0, len(blocks), batch_size):
        chunk = blocks[start:start + batch_size]
        width = max(len(b) for b in chunk)
        ids = torch.tensor([b + [_pad_id(tokenizer)] * (width - len(b)) for b in chunk])
        mask = torch.tensor([[1] * len(b) + [0] * (width - len(b)) for b in chunk])
        valid = mask[:, 1:].bool()
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


def evaluate_quality(model, tokenizer, tasks=TASKS, data_dir: str | None = None, limit: int | None = None,
                     batch_size: int = 8, teacher=None, teacher_tokenizer=None, heldout=None,
                     heldout_tokens: int = 16384, model_name: str | None = None,
                     teacher_name: str | None = None, teacher_results: dict | None = None) -> dict:
    """The linzoo.quality/v1 dict. `heldout`: texts for perplexity (None = linzoo.data's "embedded" test
    split, or a .txt path / spec / list); heldout_tokens=0 skips perplexity and KL. `teacher_results`: the
    teacher's own quality dict on the same documents; its task scores are reused (recovery needs no teacher
    model then; a `teacher` model still gives the held-out KL)."""
    tasks = parse_list(tasks, str)
    for task in tasks:
        _check_task(task)
    held = {"perplexity": None, "teacher_perplexity": None, "kl_to_teacher": None, "heldout_tokens": 0}
    if heldout_tokens > 0:  # first, so a vocabulary mismatch fails before the long task runs
        texts = load_texts("embedded" if heldout is None else heldout, split="test")
        # at most 4 blocks of 1,024 tokens at once: the task batch (64 on a GPU) would hold 16 blocks' logits
        held = heldout_metrics(model, tokenizer, texts, heldout_tokens, teacher, batch_size=min(batch_size, 4))
    docs = {task: load_task_docs(task, data_dir, limit) for task in tasks}
    scores = {task: score_task(model, tokenizer, task, docs[task], batch_size) for task in tasks}
    metric = {task: "acc_norm" if task in NORMED else "acc" for task in tasks}
    teacher_scores = recovery = chance_recovery = None
    if teacher_results is not None:
        teacher_scores = reuse_teacher_scores(teacher_results, tasks, docs, limit)
        teacher_name = teacher_name or teacher_results.get("model")
    elif teacher is not None:
        teacher_tokenizer = teacher_tokenizer or tokenizer
        teacher_scores = {task: score_task(teacher, teacher_tokenizer, task, docs[task], batch_size) for task in tasks}
    if teacher_scores is not None:
        def percent_of_teacher(key) -> dict:  # key(task) -> the score to compare; tasks the teacher scored 0: None
            table = {task: key(task) / teacher_scores[task][metric[task]] * 100
                     if teacher_scores[task][metric[task]] else None for task in tasks}
            defined = [r for r in table.values() if r is not None]
            return {**table, "average": sum(defined) / len(defined) if defined else None}

        recovery = percent_of_teacher(lambda task: scores[task][metric[task]])
        chance_recovery = percent_of_teacher(lambda task: scores[task]["chance"])
    return {
        "schema": SCHEMA,
        "model": model_name or name_of(model),
        "teacher": (teacher_name or name_of(teacher)) if teacher_scores is not None else None,
        "limit": limit,
        "tasks": scores,
        "teacher_tasks": teacher_scores,
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
    json_path.write_text(json.dumps(results, indent=2) + "\n")

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
    if results["recovery"] and results["recovery"]["average"] is not None:
        title += f" - recovery {results['recovery']['average']:.1f}% of {results['teacher']}"
        if (results.get("chance_recovery") or {}).get("average") is not None:
            title += f" (chance: {results['chance_recovery']['average']:.1f}%)"
    if results["perplexity"] is not None:
        title += f"\nheld-out perplexity {results['perplexity']:.2f}"
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    return json_path, png_path


@dataclass
class QualityArguments(ModelArguments):
    out: str = field(default="outputs/quality", metadata={"help": "output folder"})
    tasks: str = field(default=",".join(TASKS), metadata={"help": "comma-separated task names"})
    data_dir: str | None = field(default=None, metadata={"help": "folder of <task>.jsonl; default: the Hub"})
    limit: int | None = field(default=None, metadata={"help": "first N docs per task (default: all)"})
    heldout: str = field(default="embedded", metadata={"help": "held-out texts: linzoo.data spec or .txt path"})
    heldout_tokens: int = field(default=16384, metadata={"help": "perplexity token budget (0 = skip)"})
    teacher_results: str | None = field(default=None, metadata={
        "help": "the teacher's quality.json on the same tasks/--limit: its scores are reused, not recomputed "
                "(--teacher is then needed only for the held-out KL)"})

    def __post_init__(self):
        for task in parse_list(self.tasks, str):
            _check_task(task)


def main(argv: list[str] | None = None) -> dict:
    from transformers import HfArgumentParser

    (args,) = HfArgumentParser(QualityArguments).parse_args_into_dataclasses(args=argv)
    teacher_results = json.loads(Path(args.teacher_results).read_text()) if args.teacher_results else None
    model, tokenizer = load_for_eval(args.model, args.device, args.dtype)
    teacher, teacher_tokenizer = (load_for_eval(args.teacher, args.device, args.dtype, teacher=True)
                                  if args.teacher else (None, None))
    results = evaluate_quality(model, tokenizer, args.tasks, args.data_dir, args.limit, args.batch_size, teacher,
                               teacher_tokenizer, args.heldout, args.heldout_tokens, args.model, args.teacher,
                               teacher_results)
    json_path, _ = save_quality(results, args.out)
    summary = {t: round(s[results["recovery_metric"][t]], 4) for t, s in results["tasks"].items()}
    chance = results["chance_recovery"] and results["chance_recovery"]["average"]
    print(f"{args.model}: {summary} recovery={results['recovery'] and results['recovery']['average']} "
          f"(a uniform guess: {chance}) -> {json_path}")
    return results


if __name__ == "__main__":
    main()
