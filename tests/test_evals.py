"""Proofs of what linzoo adds to lm-eval's zero-shot scores, on hand-made examples, tiny models and crafted logits
(that lm-eval scores as linzoo did before it: tests/test_lm_eval.py), and the eval CLIs writing their results (the
NIAH's own tests: tests/test_niah.py)."""

import json
import math
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from linzoo.evals import niah, quality

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
NOUNS = ["river", "garden", "teacher", "window", "mountain", "letter", "kitchen", "harbour"]
VERBS = ["watched", "painted", "crossed", "opened", "followed", "described"]
FILLER = [f"The {a} {v} the {b} before the {c} was quiet again." for a in NOUNS for v in VERBS
          for b, c in [(NOUNS[(len(a) + len(v)) % 8], NOUNS[len(v) % 8])]]
QUALITY_KEYS = {"schema", "model", "teacher", "limit", "tasks", "teacher_tasks", "recovery", "recovery_metric",
                "chance_recovery", "recovery_above_chance", "docs_sha256", "perplexity", "teacher_perplexity",
                "kl_to_teacher", "heldout_tokens"}


def word_tokenizer(text: str) -> PreTrainedTokenizerFast:
    """One token per word/punctuation mark, so crafted logits address exact words."""
    words = ["<pad>", "<eos>", "<unk>", *dict.fromkeys(re.findall(r"\w+|[^\w\s]", text))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def bpe_tokenizer(corpus: list[str]) -> PreTrainedTokenizerFast:
    """Byte-level BPE: encodes any text, like the real SmolLM2 tokenizer (it also learns the NIAH prompt)."""
    corpus = [*corpus, niah.INTRO, "Question: What is the pass key?\nAnswer: What is the value for key"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<pad>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_llama(tokenizer, seed=0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    return LlamaForCausalLM(config).eval()


class UniformLM(nn.Module):
    """Zero logits: every next token equally likely (perplexity = vocabulary size)."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, input_ids, attention_mask=None, **kwargs):
        return SimpleNamespace(logits=torch.zeros(*input_ids.shape, self.vocab_size))


def bigram_llama(tokenizer, prefer: dict[tuple[str, str], float]) -> LlamaForCausalLM:
    """A Llama without layers (a model lm-eval's HFLM takes) whose logits depend only on the previous token: after
    `a`, `prefer[(a, b)]` for `b` (else 0). Its one-hot embedding leaves the final norm as sqrt(vocab) x one-hot,
    which lm_head maps to that token's row of the table."""
    n = len(tokenizer)
    config = LlamaConfig(vocab_size=n, hidden_size=n, intermediate_size=4, num_hidden_layers=0, num_attention_heads=1,
                         num_key_value_heads=1, head_dim=2, max_position_embeddings=64, rms_norm_eps=1e-9,
                         tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    model = LlamaForCausalLM(config).eval()
    table = torch.zeros(n, n)
    for (a, b), logit in prefer.items():
        table[tokenizer.convert_tokens_to_ids(a), tokenizer.convert_tokens_to_ids(b)] = logit
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.eye(n))
        model.lm_head.weight.copy_(table.T / n ** 0.5)
    return model


def write_jsonl(folder: Path, task: str, docs: list[dict]) -> None:
    folder.mkdir(exist_ok=True)
    (folder / f"{task}.jsonl").write_text("".join(json.dumps(doc) + "\n" for doc in docs))


# ---------------------------------------------------------------- quality: what linzoo adds to lm-eval


def test_data_dir_must_hold_each_tasks_file(tmp_path):
    names = [f"{task}.jsonl" for task in quality.TASKS]
    with pytest.raises(ValueError) as empty:
        quality.load_tasks(quality.TASKS, tmp_path)
    message = str(empty.value)
    assert "\n" not in message and f"--data_dir {tmp_path} lacks {', '.join(names)}: it must hold" in message
    write_jsonl(tmp_path, "piqa", [{"query": "Question: How?", "choices": ["a", "b"], "gold": 0}])
    with pytest.raises(ValueError, match=f"lacks {', '.join(names[:-1])}: it must hold {', '.join(names)} "):
        quality.QualityArguments(data_dir=str(tmp_path))  # the CLI's check, before any model loads
    quality.QualityArguments(data_dir=str(tmp_path), tasks="piqa")
    (tmp_path / "arc_challenge.jsonl").write_text("\n")
    with pytest.raises(ValueError, match=f"--data_dir {tmp_path}: no documents in arc_challenge.jsonl"):
        quality.load_task_docs("arc_challenge", str(tmp_path))
    with pytest.raises(ValueError, match="piqa: no documents in .*piqa.jsonl \\(limit 0\\)"):
        quality.load_task_docs("piqa", str(tmp_path), limit=0)
    with pytest.raises(ValueError, match="unknown task 'hellaswag'"):
        quality.load_tasks("piqa,hellaswag", tmp_path)


def test_chance_is_the_mean_of_one_over_lm_evals_number_of_choices(tmp_path):
    write_jsonl(tmp_path, "arc_easy", [{"query": "Question: Q", "choices": ["a", "b"], "gold": 0},
                                       {"query": "Question: Q", "choices": ["a", "b", "c", "d"], "gold": 0}])
    write_jsonl(tmp_path, "winogrande", [{"context_options": ["A so B", "A so C"], "continuation": "won.", "gold": 0}])
    write_jsonl(tmp_path, "lambada_openai", [{"context": "I saw", "continuation": "it"}])
    tasks = quality.load_tasks("arc_easy,winogrande,lambada_openai", tmp_path)
    chance = {task: quality.chance_score(obj, quality.task_docs(task, obj)) for task, obj in tasks.items()}
    assert chance == {"arc_easy": pytest.approx((1 / 2 + 1 / 4) / 2),  # not 1 / mean(3)
                      "winogrande": 0.5, "lambada_openai": 0.0}  # LAMBADA's answer is generated, not chosen


def test_lambada_is_greedy_exact_match(tmp_path):
    tok = word_tokenizer("I do not care about signs dogs today")
    model = bigram_llama(tok, {("about", "signs"): 5.0})
    write_jsonl(tmp_path, "lambada_openai", [
        {"context": "I do not care about", "continuation": "signs"},  # argmax: hit
        {"context": "I do not care about", "continuation": "dogs"},  # not the argmax
        {"context": "I do not care about", "continuation": "signs today"}])  # 2nd token not greedy
    results = quality.evaluate_quality(model, tok, "lambada_openai", str(tmp_path), batch_size=2, heldout_tokens=0)
    assert results["tasks"]["lambada_openai"] == {"acc": pytest.approx(1 / 3), "acc_stderr": pytest.approx(1 / 3),
                                                  "n": 3, "chance": 0.0}


def test_heldout_perplexity_and_kl():
    tok = bpe_tokenizer(FILLER)
    uniform, student = UniformLM(len(tok)), tiny_llama(tok)
    assert quality.heldout_metrics(uniform, tok, FILLER, 200)["perplexity"] == pytest.approx(len(tok))
    same = quality.heldout_metrics(student, tok, FILLER, 300, teacher=student, block_size=64)
    assert same["heldout_tokens"] == 300 and same["kl_to_teacher"] == pytest.approx(0.0, abs=1e-5)
    assert same["perplexity"] == pytest.approx(same["teacher_perplexity"])
    apart = quality.heldout_metrics(student, tok, FILLER, 300, teacher=uniform)
    assert apart["kl_to_teacher"] > 0
    # log-probs a few tokens at a time (bounded memory) give the same numbers as all at once
    sliced = quality.heldout_metrics(student, tok, FILLER, 300, teacher=uniform, token_chunk=7)
    assert sliced == pytest.approx(apart, rel=1e-5) and sliced["heldout_tokens"] == 300
    # blocks of 64 (the last one padded), 3 to a batch: slices cross rows and skip the padding
    blocks = quality.heldout_metrics(student, tok, FILLER, 300, teacher=uniform, block_size=64, batch_size=3)
    sliced = quality.heldout_metrics(student, tok, FILLER, 300, teacher=uniform, block_size=64, batch_size=3,
                                     token_chunk=7)
    assert sliced == pytest.approx(blocks, rel=1e-5)
    with pytest.raises(ValueError, match="vocabulary"):
        quality.heldout_metrics(student, tok, FILLER, 100, teacher=UniformLM(len(tok) + 7))


def test_heldout_chats_score_the_last_assistant_turn_only(tiny_teacher_dir):
    """Held-out chats: only the last assistant turn's tokens (its end-of-turn included) count; the numbers equal a
    hand computation over exactly those tokens, and a uniform model's perplexity is the vocabulary size."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_teacher_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_teacher_dir).eval()
    chats = [[{"role": "user", "content": f"What is {i} plus {i}?"}, {"role": "assistant", "content": f"It is {2 * i}."},
              {"role": "user", "content": "And doubled?"}, {"role": "assistant", "content": f"It is {4 * i}."}]
             for i in range(1, 6)]
    rows = quality.chat_rows(tok, chats, 10**6, 1024)
    assert len(rows) == 5
    for (ids, scored), chat in zip(rows, chats):
        answer = [t for t, keep in zip(ids[1:], scored) if keep]
        content = tok(chat[-1]["content"], add_special_tokens=False)["input_ids"]
        assert tok.decode(answer).startswith(chat[-1]["content"]) and len(answer) > len(content)  # + end of turn
        assert chat[1]["content"] not in tok.decode(answer)  # the earlier assistant turn is context, not scored
    got = quality.heldout_metrics(model, tok, None, 10**6, teacher=model, chats=chats, batch_size=2)
    nll, n = 0.0, 0
    with torch.no_grad():
        for ids, scored in rows:
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].float(), -1)
            for i, keep in enumerate(scored):
                nll, n = (nll - float(logp[i, ids[i + 1]]), n + 1) if keep else (nll, n)
    assert got["heldout_tokens"] == n and got["perplexity"] == pytest.approx(math.exp(nll / n), rel=1e-4)
    assert got["kl_to_teacher"] == pytest.approx(0.0, abs=1e-5)
    uniform = quality.heldout_metrics(UniformLM(len(tok)), tok, None, 10**6, chats=chats)
    assert uniform["perplexity"] == pytest.approx(len(tok), rel=1e-4)
    assert sum(map(sum, (s for _, s in quality.chat_rows(tok, chats, 12, 1024)))) < sum(sum(s) for _, s in rows)


def test_heldout_metrics_build_no_autograd_graph():
    """The held-out forwards run without gradients: with them (the decorator sat on token_stream), 4,096 tokens of
    the main job's student and its teacher held 24 GB and were killed on a 24 GB machine."""
    tok = bpe_tokenizer(FILLER)
    student = tiny_llama(tok)
    seen = []
    student.register_forward_hook(lambda module, args, out: seen.append(out.logits.requires_grad))
    quality.heldout_metrics(student, tok, FILLER, 200, teacher=student, block_size=64)
    assert seen and not any(seen)


def test_recovery_uses_acc_norm_where_defined_and_schema(tmp_path):
    tok = word_tokenizer("Question : Q Answer : a elephant Sarah so B C won .")
    # the teacher: "a" likelier than "elephant" (acc picks it), "elephant" likelier per character (acc_norm picks it)
    teacher = bigram_llama(tok, {(":", "a"): 1.0, (":", "elephant"): 0.5, ("C", "won"): 5.0})
    student = bigram_llama(tok, {(":", "a"): 5.0, ("B", "won"): 5.0})
    data = tmp_path / "data"
    write_jsonl(data, "arc_easy", [{"query": "Question: Q", "choices": ["a", "elephant"], "gold": 1}])
    write_jsonl(data, "winogrande", [  # the student gets the 2nd right only by a tie (index 0)
        {"context_options": [f"Sarah so {x}", f"Sarah so {y}"], "continuation": "won.", "gold": gold}
        for x, y, gold in [("B", "C", 1), ("C", "Q", 0)]])
    results = quality.evaluate_quality(student, tok, "arc_easy,winogrande", str(data), None, 4, teacher,
                                       heldout=["Question : B C won ."], heldout_tokens=4, model_name="s",
                                       teacher_name="t")
    assert set(results) == QUALITY_KEYS and results["schema"] == "linzoo.quality/v1"
    assert results["recovery_metric"] == {"arc_easy": "acc_norm", "winogrande": "acc"}
    one_doc = {"acc_stderr": None, "acc_norm_stderr": None, "n": 1, "chance": 0.5}  # lm-eval: no stderr of 1 doc
    assert results["tasks"]["arc_easy"] == {"acc": 0.0, "acc_norm": 0.0, **one_doc}
    assert results["teacher_tasks"]["arc_easy"] == {"acc": 0.0, "acc_norm": 1.0, **one_doc}
    assert results["tasks"]["winogrande"] == {"acc": 0.5, "acc_stderr": pytest.approx(0.5), "n": 2, "chance": 0.5}
    assert results["teacher_tasks"]["winogrande"] == {"acc": 1.0, "acc_stderr": 0.0, "n": 2, "chance": 0.5}
    assert results["recovery"] == {"arc_easy": 0.0, "winogrande": 50.0, "average": 25.0}
    # a uniform guess: 0.5 on both, against the teacher's 1.0 and 1.0
    assert results["chance_recovery"] == {"arc_easy": 50.0, "winogrande": 50.0, "average": 50.0}
    above = results["recovery_above_chance"]  # (s - c) / (t - c); the teacher (n = 2) is 0 standard errors wide
    assert above["tasks"] == ["arc_easy", "winogrande"] and above["winogrande"] == pytest.approx(0.0)
    assert results["heldout_tokens"] == 4 and results["kl_to_teacher"] > 0
    json_path, png_path = quality.save_quality(results, tmp_path / "out")
    assert json.loads(json_path.read_text()) == results and png_path.read_bytes()[:4] == b"\x89PNG"
    # The teacher's own results, reused for a student: the same recovery, no teacher model needed.
    alone = quality.evaluate_quality(teacher, tok, "arc_easy,winogrande", str(data), None, 4, heldout_tokens=0,
                                     model_name="t")
    reused = quality.evaluate_quality(student, tok, "arc_easy,winogrande", str(data), None, 4, heldout_tokens=0,
                                      teacher_results=alone)
    older = {k: v for k, v in alone.items() if k != "docs_sha256"}  # a file from before fingerprints: counts only
    assert quality.evaluate_quality(student, tok, "arc_easy,winogrande", str(data), None, 4, heldout_tokens=0,
                                    teacher_results=older)["recovery"] == results["recovery"]
    assert reused["teacher_tasks"] == results["teacher_tasks"] and reused["recovery"] == results["recovery"]
    assert reused["teacher"] == "t" and reused["kl_to_teacher"] is None
    write_jsonl(data, "piqa", [{"query": "Question: Q", "choices": ["a", "B"], "gold": 0}])
    with pytest.raises(ValueError, match="no scores for \\['piqa'\\]"):
        quality.evaluate_quality(student, tok, "piqa", str(data), None, 4, heldout_tokens=0, teacher_results=alone)
    with pytest.raises(ValueError, match="a student's"):  # scored against a teacher: not the teacher's own results
        quality.evaluate_quality(student, tok, "arc_easy", str(data), None, 4, heldout_tokens=0, teacher_results=results)
    with pytest.raises(ValueError, match="other documents"):  # 1 winogrande doc here, 2 in the teacher's results
        quality.evaluate_quality(student, tok, "winogrande", str(data), 1, 4, heldout_tokens=0, teacher_results=alone)
    # same counts, other contents: caught by the documents' fingerprints
    write_jsonl(data, "winogrande", [
        {"context_options": [f"Sarah so {x}", f"Sarah so {y}"], "continuation": "won.", "gold": gold}
        for x, y, gold in [("C", "B", 0), ("C", "Q", 0)]])
    with pytest.raises(ValueError, match="different contents"):
        quality.evaluate_quality(student, tok, "winogrande", str(data), None, 4, heldout_tokens=0, teacher_results=alone)


# sha256 of the first 20 documents of each task in ../shared/data/eval, as the code before lm-eval loaded them:
# teacher results written then (--teacher_results) still match the documents lm-eval scores now.
EVAL_DATA_SHA256_20 = {
    "lambada_openai": "a2fbf0abbee7d38e6c13e1dab2e178a456d45e3a59564c439a21d7b55e37591e",
    "winogrande": "557448de28146441b8e6d6da70e215f9442ec916ae7577f22feaf280819ccdca",
    "arc_easy": "b0fb8082ceca05d77bde4b5aee2f091b7833f9c84d19001e652fa2a28c05231d",
    "arc_challenge": "8fa1501a88c05e5db46eea2b1483b57987b961dc3f7d4b8b2974857aa58eb847",
    "piqa": "1ac29787755981f60b372bde30aac36fc85fabe9153000c2650b5ac83a0d3f2f",
}


def test_real_tasks_end_to_end_with_tiny_llama(tmp_path, eval_data_dir):
    tok = bpe_tokenizer(FILLER)
    student, teacher = tiny_llama(tok, seed=0), tiny_llama(tok, seed=1)
    results = quality.evaluate_quality(student, tok, quality.TASKS, str(eval_data_dir), 20, 8, teacher, tok,
                                       heldout=FILLER, heldout_tokens=256)
    assert set(results) == QUALITY_KEYS and results["limit"] == 20
    assert results["docs_sha256"] == EVAL_DATA_SHA256_20
    for task, scores in results["tasks"].items():
        metrics = ("acc", "acc_norm") if task in quality.NORMED else ("acc",)
        assert set(scores) == {*metrics, *(f"{m}_stderr" for m in metrics), "n", "chance"}
        assert scores["n"] == 20 and 0 <= scores["acc"] <= 1 and scores["acc_stderr"] >= 0
    # chance: 0 for LAMBADA (generated), 1/2 for the two-way tasks, 1/4 for ARC (this copy: 4 choices each)
    chance = {t: s["chance"] for t, s in results["tasks"].items()}
    assert chance["lambada_openai"] == 0 and chance["winogrande"] == chance["piqa"] == 0.5
    assert chance["arc_easy"] == chance["arc_challenge"] == 0.25
    assert set(results["recovery"]) == set(results["chance_recovery"]) == {*quality.TASKS, "average"}
    assert results["perplexity"] > 1 and results["heldout_tokens"] == 256
    assert all(p.stat().st_size > 0 for p in quality.save_quality(results, tmp_path))


def test_mains_write_results(tmp_path, monkeypatch):
    import linzoo
    from linzoo import loading

    tok = bpe_tokenizer(FILLER)
    monkeypatch.setattr(linzoo, "load_model", lambda spec: (tiny_llama(tok), tok), raising=False)
    monkeypatch.setattr(linzoo, "load_teacher", lambda spec: (tiny_llama(tok, seed=1), tok), raising=False)
    monkeypatch.setattr(loading, "read_config", lambda spec: {})  # "m" and "t" name no folder
    filler = tmp_path / "filler.txt"
    filler.write_text("\n\n".join(FILLER))
    results = niah.main(["--model", "m", "--teacher", "t", "--lengths", "128", "--depths", "0,1", "--variant",
                         "natural", "--filler", str(filler), "--samples_per_cell", "1", "--max_new_tokens", "2",
                         "--out", str(tmp_path / "n"), "--device", "cpu", "--dtype", "float32"])
    assert results["model"] == "m" and (tmp_path / "n" / "teacher" / "niah_heatmap.png").exists()
    data = tmp_path / "data"
    data.mkdir()
    (data / "piqa.jsonl").write_text(json.dumps({"query": "Question: How?\n", "choices": ["a", "b"], "gold": 0}))
    results = quality.main(["--model", "m", "--teacher", "t", "--tasks", "piqa", "--data_dir", str(data), "--limit",
                            "5", "--heldout", str(filler), "--heldout_tokens", "64", "--out", str(tmp_path / "q")])
    assert results["teacher"] == "t" and results["tasks"]["piqa"]["n"] == 1 and results["limit"] == 5
    assert json.loads((tmp_path / "q" / "quality.json").read_text()) == results
    assert math.isfinite(results["kl_to_teacher"])
    common = ["--tasks", "piqa", "--data_dir", str(data), "--heldout", str(filler), "--heldout_tokens", "64"]
    quality.main(["--model", "t", *common, "--out", str(tmp_path / "tq")])  # the teacher alone, once
    reused = quality.main(["--model", "m", *common, "--teacher_results", str(tmp_path / "tq" / "quality.json"),
                           "--out", str(tmp_path / "q2")])
    assert reused["teacher_tasks"] == results["teacher_tasks"] and reused["recovery"] == results["recovery"]
    assert reused["teacher"] == "t" and reused["kl_to_teacher"] is None


def test_offline_without_data_dir_says_what_to_pass():
    """lm-eval's own tasks need the Hub: offline, `linzoo eval quality` ended in "unexpected ConnectionError:
    Couldn't reach 'baber/piqa'" (after ~40 s of retries without HF_HUB_OFFLINE)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "EVAL_DATA"} | {"HF_HUB_OFFLINE": "1"}
    code = "from linzoo.evals import quality; quality.load_tasks(['piqa'])"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 1 and "ValueError: lm-eval's own tasks (piqa) read their Hub datasets" in run.stderr
    assert "pass --data_dir" in run.stderr.splitlines()[-1]
