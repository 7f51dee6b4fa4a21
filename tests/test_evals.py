"""Proofs of the NIAH and quality scoring on hand-made examples, tiny models and crafted logits."""

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from linzoo.evals import niah, quality

EVAL_DATA = Path("/work/shared/data/eval")
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
NOUNS = ["river", "garden", "teacher", "window", "mountain", "letter", "kitchen", "harbour"]
VERBS = ["watched", "painted", "crossed", "opened", "followed", "described"]
FILLER = [f"The {a} {v} the {b} before the {c} was quiet again." for a in NOUNS for v in VERBS
          for b, c in [(NOUNS[(len(a) + len(v)) % 8], NOUNS[len(v) % 8])]]
NIAH_KEYS = {"schema", "model", "needle", "prompt_format", "lengths", "depths", "samples_per_cell", "accuracy",
             "mean_by_length", "overall", "seed", "examples"}
QUALITY_KEYS = {"schema", "model", "teacher", "limit", "tasks", "teacher_tasks", "recovery", "recovery_metric",
                "chance_recovery", "docs_sha256", "perplexity", "teacher_perplexity", "kl_to_teacher", "heldout_tokens"}


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


class BigramLM(nn.Module):
    """Logits depend only on the previous token: table[prev] (zeros = uniform); `noisy` positions get noise."""

    def __init__(self, tokenizer, vocab_size=None):
        super().__init__()
        self.tok = tokenizer
        self.table = nn.Parameter(torch.zeros(vocab_size or len(tokenizer), vocab_size or len(tokenizer)),
                                  requires_grad=False)
        self.noisy = range(0)

    def prefer(self, prev: str, nxt: str, logit: float = 5.0):
        self.table[self.tok.convert_tokens_to_ids(prev), self.tok.convert_tokens_to_ids(nxt)] = logit
        return self

    def forward(self, input_ids, attention_mask=None, **kwargs):
        logits = self.table[input_ids].clone()
        generator = torch.Generator().manual_seed(1)
        for t in self.noisy:
            logits[:, t] += 10 * torch.randn(logits.shape[-1], generator=generator)
        return SimpleNamespace(logits=logits)


# ---------------------------------------------------------------- quality: scoring proofs


@pytest.mark.parametrize("task", ["arc_easy", "piqa", "winogrande"])
def test_preferred_choice_scores_one_and_flipped_gold_zero(task):
    if task == "winogrande":
        doc = {"context_options": ["Sarah helped Maria so Sarah", "Sarah helped Maria so Maria"],
               "continuation": "was thanked.", "gold": 1}
        text, prefer = "Sarah helped Maria so was thanked .", ("Maria", "was")
    else:
        doc = {"query": "Question: Is the sky blue?" + ("\n" if task == "piqa" else ""), "choices": ["yes", "no"],
               "gold": 0}
        text, prefer = "Question : Is the sky blue ? Answer yes no", (":", "yes")
    model = BigramLM(word_tokenizer(text)).prefer(*prefer)
    scores = quality.score_task(model, model.tok, task, [doc], batch_size=2)
    flipped = quality.score_task(model, model.tok, task, [{**doc, "gold": 1 - doc["gold"]}])
    assert scores["acc"] == 1.0 and flipped["acc"] == 0.0 and scores["n"] == 1
    assert ("acc_norm" in scores) == (task != "winogrande")
    if task != "winogrande":
        assert scores["acc_norm"] == 1.0 and flipped["acc_norm"] == 0.0


def test_length_normalisation_flips_the_decision():
    # "a" is likelier than "elephant" (acc picks it), but per character "elephant" wins (acc_norm picks it).
    model = BigramLM(word_tokenizer("Question : pick Answer a elephant"))
    model.prefer(":", "a", 1.0).prefer(":", "elephant", 0.5)
    doc = {"query": "Question: pick", "choices": ["a", "elephant"], "gold": 1}
    (ll_a, _), (ll_e, _) = quality.loglikelihoods(model, model.tok, quality.task_requests("arc_easy", doc))
    assert ll_a > ll_e and ll_e / len("elephant") > ll_a / len("a")
    assert quality.score_task(model, model.tok, "arc_easy", [doc]) == {"acc": 0.0, "acc_norm": 1.0, "n": 1, "chance": 0.5}


def test_requests_follow_lm_eval_formats():
    arc = {"query": "Question: Why?", "choices": ["x", "y"], "gold": 0}
    piqa = {"query": "Question: How?\n", "choices": ["x", "y"], "gold": 0}
    wino = {"context_options": ["A so B", "A so C"], "continuation": "won.", "gold": 0}
    assert quality.task_requests("arc_easy", arc) == [("Question: Why?\nAnswer:", " x"), ("Question: Why?\nAnswer:", " y")]
    assert quality.task_requests("piqa", piqa)[1] == ("Question: How?\nAnswer:", " y")
    assert quality.task_requests("winogrande", wino) == [("A so B", " won."), ("A so C", " won.")]
    assert quality.task_requests("lambada_openai", {"context": "I saw", "continuation": "it"}) == [("I saw", " it")]
    with pytest.raises(ValueError):
        quality.task_requests("hellaswag", {})


def test_continuation_tokens_are_the_tail_and_trailing_space_moves():
    tok = bpe_tokenizer(FILLER)
    ctx, cont = quality._encode_pair(tok, "The river watched ", "the garden")
    assert tok.decode(ctx) == "The river watched" and tok.decode(cont) == " the garden"
    assert cont == tok(" the garden", add_special_tokens=False)["input_ids"]


def test_only_continuation_tokens_are_scored():
    model = BigramLM(word_tokenizer("a b c d e f")).prefer("d", "e").prefer("e", "f", 2.0)
    request = [("a b c d", " e f")]  # 4 context tokens: positions 0-2 predict context, 3 predicts "e"
    (clean, greedy), = quality.loglikelihoods(model, model.tok, request)
    model.noisy = range(0, 3)
    assert quality.loglikelihoods(model, model.tok, request)[0] == pytest.approx((clean, greedy))
    model.noisy = range(0, 4)
    assert quality.loglikelihoods(model, model.tok, request)[0][0] != pytest.approx(clean)
    expected = torch.log_softmax(model.table[model.tok.convert_tokens_to_ids(["d", "e"])], -1)
    assert clean == pytest.approx(expected[0, model.tok.convert_tokens_to_ids("e")].item()
                                  + expected[1, model.tok.convert_tokens_to_ids("f")].item())


def test_lambada_is_greedy_exact_match():
    model = BigramLM(word_tokenizer("I do not care about signs dogs today")).prefer("about", "signs")
    docs = [{"context": "I do not care about", "continuation": "signs"},  # argmax: hit
            {"context": "I do not care about", "continuation": "dogs"},  # not the argmax
            {"context": "I do not care about", "continuation": "signs today"}]  # 2nd token not greedy
    assert [quality.score_task(model, model.tok, "lambada_openai", [d])["acc"] for d in docs] == [1.0, 0.0, 0.0]
    assert quality.score_task(model, model.tok, "lambada_openai", docs, batch_size=2) == {"acc": 1 / 3, "n": 3, "chance": 0.0}


def test_left_truncation_keeps_the_continuation():
    model = BigramLM(word_tokenizer("a b c d e f")).prefer("e", "f")
    model.config = SimpleNamespace(max_position_embeddings=3)
    long, short = quality.loglikelihoods(model, model.tok, [("a b c d e", " f"), ("e", " f")])
    assert long == pytest.approx(short)


def test_chance_is_the_mean_of_one_over_the_number_of_choices():
    docs = [{"query": "Q", "choices": ["a", "b"], "gold": 0}, {"query": "Q", "choices": ["a", "b", "c", "d"], "gold": 0}]
    assert quality.chance_score("arc_easy", docs) == pytest.approx((1 / 2 + 1 / 4) / 2)  # not 1 / mean(3)
    assert quality.chance_score("lambada_openai", [{"context": "a", "continuation": "b"}]) == 0


def test_heldout_perplexity_and_kl():
    tok = bpe_tokenizer(FILLER)
    uniform, student = BigramLM(tok), tiny_llama(tok)
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
        quality.heldout_metrics(student, tok, FILLER, 100, teacher=BigramLM(tok, vocab_size=len(tok) + 7))


def test_recovery_uses_acc_norm_where_defined_and_schema(tmp_path):
    tok = word_tokenizer("Question : Q Answer : a elephant Sarah so B C won .")
    teacher = BigramLM(tok).prefer(":", "a", 1.0).prefer(":", "elephant", 0.5).prefer("C", "won")
    student = BigramLM(tok).prefer(":", "a").prefer("B", "won")
    data = tmp_path / "data"
    data.mkdir()
    (data / "arc_easy.jsonl").write_text(json.dumps({"query": "Question: Q", "choices": ["a", "elephant"], "gold": 1}))
    (data / "winogrande.jsonl").write_text("\n".join(  # the student gets the 2nd right only by a tie (index 0)
        json.dumps({"context_options": [f"Sarah so {x}", f"Sarah so {y}"], "continuation": "won.", "gold": gold})
        for x, y, gold in [("B", "C", 1), ("C", "Q", 0)]))
    results = quality.evaluate_quality(student, tok, "arc_easy,winogrande", str(data), None, 4, teacher,
                                       heldout=["Question : B C won ."], heldout_tokens=4, model_name="s",
                                       teacher_name="t")
    assert set(results) == QUALITY_KEYS and results["schema"] == "linzoo.quality/v1"
    assert results["recovery_metric"] == {"arc_easy": "acc_norm", "winogrande": "acc"}
    assert results["tasks"]["arc_easy"] == {"acc": 0.0, "acc_norm": 0.0, "n": 1, "chance": 0.5}
    assert results["teacher_tasks"]["arc_easy"] == {"acc": 0.0, "acc_norm": 1.0, "n": 1, "chance": 0.5}
    assert results["tasks"]["winogrande"] == {"acc": 0.5, "n": 2, "chance": 0.5}
    assert results["teacher_tasks"]["winogrande"]["acc"] == 1
    assert results["recovery"] == {"arc_easy": 0.0, "winogrande": 50.0, "average": 25.0}
    # a uniform guess: 0.5 on both, against the teacher's 1.0 and 1.0
    assert results["chance_recovery"] == {"arc_easy": 50.0, "winogrande": 50.0, "average": 50.0}
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
    (data / "piqa.jsonl").write_text(json.dumps({"query": "Question: Q", "choices": ["a", "B"], "gold": 0}))
    with pytest.raises(ValueError, match="no scores for \\['piqa'\\]"):
        quality.evaluate_quality(student, tok, "piqa", str(data), None, 4, heldout_tokens=0, teacher_results=alone)
    with pytest.raises(ValueError, match="a student's"):  # scored against a teacher: not the teacher's own results
        quality.evaluate_quality(student, tok, "arc_easy", str(data), None, 4, heldout_tokens=0, teacher_results=results)
    with pytest.raises(ValueError, match="other documents"):  # 1 winogrande doc here, 2 in the teacher's results
        quality.evaluate_quality(student, tok, "winogrande", str(data), 1, 4, heldout_tokens=0, teacher_results=alone)
    # same counts, other contents: caught by the documents' fingerprints
    (data / "winogrande.jsonl").write_text("\n".join(
        json.dumps({"context_options": [f"Sarah so {x}", f"Sarah so {y}"], "continuation": "won.", "gold": gold})
        for x, y, gold in [("C", "B", 0), ("C", "Q", 0)]))
    with pytest.raises(ValueError, match="different contents"):
        quality.evaluate_quality(student, tok, "winogrande", str(data), None, 4, heldout_tokens=0, teacher_results=alone)
    (data / "arc_challenge.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="arc_challenge: no documents in .*arc_challenge.jsonl"):
        quality.evaluate_quality(student, tok, "arc_challenge", str(data), None, 4, heldout_tokens=0)


@pytest.mark.skipif(not EVAL_DATA.is_dir(), reason="shared eval data missing")
def test_real_tasks_end_to_end_with_tiny_llama(tmp_path):
    docs = {t: quality.load_task_docs(t, str(EVAL_DATA), limit=20) for t in quality.TASKS}
    assert all(len(d) == 20 for d in docs.values())
    tok = bpe_tokenizer([r[0] + r[1] for t, ds in docs.items() for d in ds for r in quality.task_requests(t, d)])
    student, teacher = tiny_llama(tok, seed=0), tiny_llama(tok, seed=1)
    results = quality.evaluate_quality(student, tok, quality.TASKS, str(EVAL_DATA), 20, 8, teacher, tok,
                                       heldout=FILLER, heldout_tokens=256)
    assert set(results) == QUALITY_KEYS and results["limit"] == 20
    for task, scores in results["tasks"].items():
        assert set(scores) == ({"acc", "acc_norm", "n", "chance"} if task in quality.NORMED else {"acc", "n", "chance"})
        assert scores["n"] == 20 and 0 <= scores["acc"] <= 1
    # chance: 0 for LAMBADA (generated), 1/2 for the two-way tasks, 1/4 for ARC (this copy: 4 choices each)
    chance = {t: s["chance"] for t, s in results["tasks"].items()}
    assert chance["lambada_openai"] == 0 and chance["winogrande"] == chance["piqa"] == 0.5
    assert chance["arc_easy"] == chance["arc_challenge"] == 0.25
    assert set(results["recovery"]) == set(results["chance_recovery"]) == {*quality.TASKS, "average"}
    assert results["perplexity"] > 1 and results["heldout_tokens"] == 256
    assert all(p.stat().st_size > 0 for p in quality.save_quality(results, tmp_path))


# ---------------------------------------------------------------- NIAH


@pytest.mark.parametrize("needle", ["passkey", "uuid"])
@pytest.mark.parametrize("prompt_format", ["raw", "chat"])
@pytest.mark.parametrize("depth", [0.0, 0.3, 0.5, 1.0])
def test_haystack_length_and_depth(needle, prompt_format, depth):
    tok = bpe_tokenizer(FILLER)
    sample = niah.build_haystack(tok, FILLER, 400, depth, needle, seed=3, prompt_format=prompt_format)
    assert 400 - 8 <= sample.n_tokens <= 400
    kwargs = {"add_special_tokens": prompt_format == "raw"}
    assert len(tok(sample.prompt, **kwargs)["input_ids"]) == sample.n_tokens
    start, end = sample.needle_span
    assert sample.haystack[start:end] == sample.needle and sample.haystack in sample.prompt
    assert abs(start / (len(sample.haystack) - len(sample.needle)) - depth) < 0.03  # share of filler before it
    assert sample.prompt.count(sample.answer) == sample.needle.count(sample.answer) > 0  # only the needle tells
    assert sample.prompt.startswith("<|user|>") == (prompt_format == "chat")
    assert sample.prompt.endswith("<|assistant|>" if prompt_format == "chat" else "Answer:")


def test_needles_are_seeded():
    tok = bpe_tokenizer(FILLER)
    a, b, c = (niah.build_haystack(tok, FILLER, 200, 0.5, "passkey", seed=s) for s in (1, 1, 2))
    assert a == b and a.answer != c.answer
    assert re.fullmatch(r"\d{5,7}", a.answer) and "What is the pass key?" in a.prompt
    u = niah.build_haystack(tok, FILLER, 300, 0.5, "uuid", seed=1)
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", u.answer)
    with pytest.raises(ValueError):
        niah.build_haystack(tok, FILLER, 20, 0.5, "passkey")


class EchoLM(nn.Module):
    """Answers with the needle's value (or a wrong one), checking that prompts come left-padded."""

    def __init__(self, tokenizer, wrong=False):
        super().__init__()
        self.tok, self.wrong = tokenizer, wrong

    def generate(self, input_ids, attention_mask, max_new_tokens, **kwargs):
        assert (attention_mask[:, -1] == 1).all() and (attention_mask.diff(dim=1) >= 0).all()
        answers = []
        for text in self.tok.batch_decode(input_ids, skip_special_tokens=True):
            found = re.search(r"pass key is (\d+)|value for key \S+ is ([0-9a-f-]{36})", text)
            answers.append("123" if self.wrong else found.group(1) or found.group(2))
        new = [self.tok(" " + a + ".", add_special_tokens=False)["input_ids"][:max_new_tokens] for a in answers]
        width = max(map(len, new))
        new = torch.tensor([n + [self.tok.eos_token_id] * (width - len(n)) for n in new])
        return torch.cat([input_ids, new], dim=1)


@pytest.mark.parametrize("needle", ["passkey", "uuid"])
def test_needle_detection(needle, tmp_path):
    tok = bpe_tokenizer(FILLER)
    grid = dict(lengths=[200, 300], depths="0,0.5,1", needle=needle, samples_per_cell=2, batch_size=3, filler=FILLER)
    right = niah.run_niah(EchoLM(tok), tok, **grid)
    wrong = niah.run_niah(EchoLM(tok, wrong=True), tok, **grid)
    assert right["overall"] == 1.0 and wrong["overall"] == 0.0
    assert right["accuracy"] == {"200": {"0": 1.0, "0.5": 1.0, "1": 1.0}, "300": {"0": 1.0, "0.5": 1.0, "1": 1.0}}
    assert set(right) == NIAH_KEYS and right["mean_by_length"] == {"200": 1.0, "300": 1.0}
    # one example per cell, with what was generated: the echo finds the key, the wrong model says 123
    assert [(e["length"], e["depth"]) for e in wrong["examples"]] == [(l, d) for l in (200, 300) for d in (0, 0.5, 1)]
    assert all(e["hit"] and e["answer"] in e["generated"] for e in right["examples"])
    assert all(not e["hit"] and "123" in e["generated"] for e in wrong["examples"])
    sample = niah.build_haystack(tok, FILLER, 200, 0.5, needle, seed=4)
    text, correct, seconds = niah.answer_one(EchoLM(tok), tok, sample)
    assert correct and sample.answer in text and seconds >= 0
    assert not niah.answer_one(EchoLM(tok, wrong=True), tok, sample)[1]


def test_run_niah_tiny_llama_and_save(tmp_path):
    tok = bpe_tokenizer(FILLER)
    tok.pad_token = None  # run_niah falls back to EOS
    results = niah.run_niah(tiny_llama(tok), tok, "128,256", [0.0, 0.5, 1.0], "passkey", "chat", samples_per_cell=2,
                            batch_size=4, filler=FILLER, seed=7, max_new_tokens=4, model_name="tiny")
    assert tok.padding_side == "left" and tok.pad_token == "<eos>"
    assert set(results) == NIAH_KEYS and results["schema"] == "linzoo.niah/v1" and results["model"] == "tiny"
    assert results["lengths"] == [128, 256] and results["depths"] == [0.0, 0.5, 1.0]
    assert set(results["accuracy"]) == {"128", "256"} and set(results["accuracy"]["128"]) == {"0", "0.5", "1"}
    json_path, png_path = niah.save_niah(results, tmp_path)
    assert json.loads(json_path.read_text()) == results
    assert png_path.name == "niah_heatmap.png" and png_path.read_bytes()[:4] == b"\x89PNG"


def test_mains_write_results(tmp_path, monkeypatch):
    import linzoo

    tok = bpe_tokenizer(FILLER)
    monkeypatch.setattr(linzoo, "load_model", lambda spec: (tiny_llama(tok), tok), raising=False)
    monkeypatch.setattr(linzoo, "load_teacher", lambda spec: (tiny_llama(tok, seed=1), tok), raising=False)
    filler = tmp_path / "filler.txt"
    filler.write_text("\n\n".join(FILLER))
    results = niah.main(["--model", "m", "--teacher", "t", "--lengths", "128", "--depths", "0,1", "--filler",
                         str(filler), "--samples_per_cell", "1", "--max_new_tokens", "2", "--out", str(tmp_path / "n"),
                         "--device", "cpu", "--dtype", "float32"])
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
