"""The NIAH test: the classic passkey prompt and its variants, fresh haystacks per sample, scoring and standard
errors, on a byte-level tokenizer and tiny models (the real teacher's numbers: results/niah_teacher_cpu/)."""

import json
import math
import re

import pytest
import torch
from test_evals import FILLER, bpe_tokenizer, tiny_llama
from torch import nn

from linzoo.evals import niah
from linzoo.spaces.niah import niah_space as space

NIAH_KEYS = {"schema", "model", "variant", "needle", "prompt_format", "filler", "lengths", "depths",
             "samples_per_cell", "accuracy", "accuracy_se", "mean_by_length", "mean_by_length_se", "overall",
             "overall_se", "seed", "examples"}
KEY_LOGPROB = {"key_logprob", "key_logprob_se", "key_logprob_by_length", "key_logprob_by_length_se"}
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
NOISE_SENTENCES = re.split(r"(?<=\.) ", niah.NOISE)


def build(variant="passkey", context_len=400, depth=0.5, seed=3, tok=None):
    return niah.build_haystack(tok or bpe_tokenizer(FILLER), FILLER, context_len, depth, variant, seed)


def filler_before_needle(sample) -> float:
    """Share of the haystack's filler characters that come before the needle."""
    start, end = sample.needle_span
    return start / max(len(sample.haystack) - len(sample.needle) - 1, 1)


def test_default_is_the_classic_passkey_test():
    sample = build(depth=0.25)
    key = sample.answer
    assert re.fullmatch(r"\d{5}", key)
    assert sample.needle == f"The pass key is {key}. Remember it. {key} is the pass key."
    lines = sample.prompt.split("\n")  # instruction, noise, needle, noise, question + answer prefix
    assert lines[0] == niah.INTRO == ("There is an important info hidden inside a lot of irrelevant text. Find it and "
                                      "memorize them. I will quiz you about the important information there.")
    assert lines[-1] == "What is the pass key? The pass key is" and sample.prompt.endswith("The pass key is")
    assert lines[2] == sample.needle and len(lines) == 5
    for noise in (lines[1], lines[3]):  # whole noise sentences, in their cycle
        sentences = re.split(r"(?<=\.) ", noise)
        first = NOISE_SENTENCES.index(sentences[0])
        assert sentences == [NOISE_SENTENCES[(first + i) % 5] for i in range(len(sentences))]
    assert abs(filler_before_needle(sample) - 0.25) < 0.02
    assert sample.prompt.count(key) == 2 and sample.needle_type == "passkey" and sample.prompt_format == "raw"


@pytest.mark.parametrize("variant", list(niah.VARIANTS))
@pytest.mark.parametrize("depth", [0.0, 0.3, 0.5, 1.0])
def test_every_variant_builds_to_length_and_depth(variant, depth):
    tok = bpe_tokenizer(FILLER)
    sample = build(variant, 400, depth, tok=tok)
    spec = niah.VARIANTS[variant]
    assert 400 - 24 <= sample.n_tokens <= 400  # cut at a sentence end
    assert len(tok(sample.prompt, add_special_tokens=spec.prompt_format == "raw")["input_ids"]) == sample.n_tokens
    start, end = sample.needle_span
    assert sample.haystack[start:end] == sample.needle and sample.haystack in sample.prompt
    assert abs(filler_before_needle(sample) - depth) < 0.05
    assert sample.prompt.count(sample.answer) == sample.needle.count(sample.answer) > 0  # only the needle tells
    filler = sample.haystack.replace(sample.needle, "")
    assert (niah.NOISE[:20] in filler) == (spec.haystack == "noise") and not re.search(r"\d", filler)
    word = re.fullmatch(r"What is the (pass key|value for key (\w+))\?", sample.question).group(2)
    prefix = f"The value for key {word} is" if word else "The pass key is"
    if spec.prompt_format == "chat":
        assert sample.prompt.startswith("<|user|>" + niah.INTRO)
        assert sample.prompt.endswith(f"{sample.question}\n<|assistant|>{prefix}")
    else:
        assert sample.prompt.startswith(niah.INTRO) and sample.prompt.endswith(f"\n{sample.question} {prefix}")
    assert (word in niah.KEY_WORDS and re.fullmatch(UUID, sample.answer)) if spec.needle == "uuid" else not word


def test_natural_filler_is_clean_prose():
    play = "HAMLET.\nTo be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" \
           "The slings and arrows of outrageous fortune"
    lead = "Paris is the capital of France. It had 2,102,650 residents in 2023.\nIt is on the Seine. Its mayor " \
           "is elected."
    assert niah.prose([play, lead, "Only 3 of them."]) == ["Paris is the capital of France. It is on the Seine. "
                                                           "Its mayor is elected."]
    with pytest.raises(ValueError, match="no prose left"):
        niah.prose([play])


def test_fresh_haystack_per_sample_and_the_seed_reproduces():
    tok = bpe_tokenizer(FILLER)
    seeds = [niah.sample_seed(0, 512, 0.5, i) for i in range(10)]
    assert len(set(seeds)) == 10 and niah.sample_seed(0, 512, 0.5, 0) == 1460353866473042793  # fixed across runs
    assert len({niah.sample_seed(s, l, d, 0) for s in (0, 1) for l in (256, 512) for d in (0.0, 0.5)}) == 8
    for variant in niah.VARIANTS:
        a, b, again = (niah.build_haystack(tok, FILLER, 300, 0.5, variant, s) for s in (seeds[0], seeds[1], seeds[0]))
        assert a == again  # the same seed, the same prompt
        assert a.answer != b.answer and a.prompt != b.prompt
    one, two = (niah.build_haystack(tok, FILLER, 300, 0.5, "natural", s) for s in seeds[:2])
    assert one.haystack.replace(one.needle, "") != two.haystack.replace(two.needle, "")  # the prose, reshuffled
    with pytest.raises(ValueError, match="shorter than the needle"):
        niah.build_haystack(tok, FILLER, 20, 0.5)


def test_bad_variant_names_are_one_line_errors():
    tok = bpe_tokenizer(FILLER)
    message = r"^unknown NIAH variant 'raw': pick one of passkey, natural, uuid, chat$"
    for call in (lambda: niah.get_variant("raw"), lambda: niah.build_haystack(tok, FILLER, 200, 0.5, "raw"),
                 lambda: niah.run_niah(None, tok, [200], [0.5], "raw"), lambda: niah.NiahArguments(variant="raw")):
        with pytest.raises(ValueError, match=message):
            call()
    with pytest.raises(ValueError, match="--filler is the natural variant's prose"):
        niah.NiahArguments(variant="chat", filler="embedded")
    with pytest.raises(ValueError, match="--samples_per_cell 0"):
        niah.NiahArguments(samples_per_cell=0)
    assert niah.NiahArguments().variant == "passkey" and niah.NiahArguments().samples_per_cell >= 10


def test_hits_are_whole_answers():
    assert niah.is_hit("12345", " 12345.\nThe sky") and niah.is_hit("12345", "is 12345")
    assert not niah.is_hit("12345", " 123456.") and not niah.is_hit("12345", "912345") and not niah.is_hit("1", "")


class EchoLM(nn.Module):
    """Answers with the needle's value, or a wrong one where `right(row)` says no (rows counted over all calls),
    checking that prompts come left-padded."""

    def __init__(self, tokenizer, right=lambda row: True):
        super().__init__()
        self.tok, self.right, self.rows = tokenizer, right, 0

    def generate(self, input_ids, attention_mask, max_new_tokens, **kwargs):
        assert (attention_mask[:, -1] == 1).all() and (attention_mask.diff(dim=1) >= 0).all()
        answers = []
        for text in self.tok.batch_decode(input_ids, skip_special_tokens=True):
            found = re.search(rf"pass key is (\d+)\.|value for key \w+ is ({UUID})", text)
            answers.append(found.group(1) or found.group(2) if self.right(self.rows) else "123")
            self.rows += 1
        new = [self.tok(" " + a + ".", add_special_tokens=False)["input_ids"][:max_new_tokens] for a in answers]
        width = max(map(len, new))
        new = torch.tensor([n + [self.tok.eos_token_id] * (width - len(n)) for n in new])
        return torch.cat([input_ids, new], dim=1)


@pytest.mark.parametrize("variant", list(niah.VARIANTS))
def test_needle_detection(variant):
    tok = bpe_tokenizer(FILLER)
    grid = dict(lengths=[200, 300], depths="0,0.5,1", variant=variant, samples_per_cell=2, batch_size=3,
                filler=FILLER if variant == "natural" else None)
    right = niah.run_niah(EchoLM(tok), tok, **grid)
    wrong = niah.run_niah(EchoLM(tok, right=lambda row: False), tok, **grid)
    assert set(right) == NIAH_KEYS and right["variant"] == variant and right["overall"] == 1.0
    assert right["accuracy"] == {"200": {"0": 1.0, "0.5": 1.0, "1": 1.0}, "300": {"0": 1.0, "0.5": 1.0, "1": 1.0}}
    assert right["mean_by_length"] == {"200": 1.0, "300": 1.0} and right["overall_se"] == 0.0
    assert wrong["overall"] == 0.0 and wrong["needle"] == niah.VARIANTS[variant].needle
    assert right["filler"] == (f"{len(FILLER)} texts" if variant == "natural" else "noise")
    # one example per cell, with what was generated: the echo finds the key, the wrong model says 123
    assert [(e["length"], e["depth"]) for e in wrong["examples"]] == [(l, d) for l in (200, 300) for d in (0, 0.5, 1)]
    assert all(e["hit"] and e["answer"] in e["generated"] for e in right["examples"])
    assert all(not e["hit"] and "123" in e["generated"] for e in wrong["examples"])
    sample = niah.build_haystack(tok, FILLER, 200, 0.5, variant, seed=4)
    text, correct, seconds = niah.answer_one(EchoLM(tok), tok, sample)
    assert correct and sample.answer in text and seconds >= 0
    assert not niah.answer_one(EchoLM(tok, right=lambda row: False), tok, sample)[1]


def test_standard_errors_of_a_known_hit_pattern(tmp_path):
    """Rows run in grid order (length, depth, sample); every third row is answered wrongly, so with 4 samples per
    cell the cells score 2/4, 3/4 (length 200) and 3/4, 2/4 (length 300)."""
    tok = bpe_tokenizer(FILLER)
    results = niah.run_niah(EchoLM(tok, right=lambda row: row % 3 != 0), tok, [200, 300], [0.0, 1.0],
                            samples_per_cell=4, batch_size=3)
    half, three_quarters = math.sqrt(0.5 * 0.5 / 4), math.sqrt(0.75 * 0.25 / 4)  # 0.25, 0.2165
    assert results["accuracy"] == {"200": {"0": 0.5, "1": 0.75}, "300": {"0": 0.75, "1": 0.5}}
    assert results["accuracy_se"] == {"200": {"0": half, "1": three_quarters}, "300": {"0": three_quarters, "1": half}}
    assert results["mean_by_length"] == {"200": 0.625, "300": 0.625} and results["overall"] == 0.625
    assert results["mean_by_length_se"]["200"] == pytest.approx(math.sqrt(7) / 16)  # sqrt(1/16 + 3/64) / 2
    assert results["overall_se"] == pytest.approx(math.sqrt(14) / 32)  # sqrt(2 (1/16 + 3/64)) / 4
    assert [e["hit"] for e in results["examples"]] == [False, True, True, False]  # each cell's first sample
    json_path, png_path = niah.save_niah(results, tmp_path)
    assert json.loads(json_path.read_text()) == results and png_path.read_bytes()[:4] == b"\x89PNG"
    _, gallery, *tables = space.results_view([tmp_path])  # the Space's NIAH table shows them
    rows = tables[[spec.name for spec in space.result_tables()].index("niah")]
    assert rows == [["EchoLM", "passkey", "raw", "0.625±0.117", "200: 0.62±0.17, 300: 0.62±0.17"]]
    assert gallery == [(str(png_path), "EchoLM: NIAH passkey, overall 0.62")]


def test_run_niah_tiny_llama_and_save(tmp_path):
    tok = bpe_tokenizer(FILLER)
    tok.pad_token = None  # run_niah falls back to EOS
    results = niah.run_niah(tiny_llama(tok), tok, "128,256", [0.0, 0.5, 1.0], "chat", samples_per_cell=2,
                            batch_size=4, seed=7, max_new_tokens=4, model_name="tiny")
    assert tok.padding_side == "left" and tok.pad_token == "<eos>"
    assert set(results) == NIAH_KEYS | KEY_LOGPROB and results["schema"] == "linzoo.niah/v1" and results["model"] == "tiny"
    assert results["lengths"] == [128, 256] and results["depths"] == [0.0, 0.5, 1.0]
    assert set(results["accuracy"]) == {"128", "256"} and set(results["accuracy"]["128"]) == {"0", "0.5", "1"}
    assert (results["variant"], results["needle"], results["prompt_format"]) == ("chat", "passkey", "chat")
    json_path, png_path = niah.save_niah(results, tmp_path)
    assert json.loads(json_path.read_text()) == results
    assert png_path.name == "niah_heatmap.png" and png_path.read_bytes()[:4] == b"\x89PNG"


def test_key_logprob_is_the_answers_teacher_forced_log_probability(tiny_teacher_dir):
    """Batched with left padding, the key's log-probability equals one unpadded forward's over exactly the answer's
    tokens (prompt encoded alone, then prompt + answer); the summary carries its mean and standard error."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_teacher_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_teacher_dir).eval()
    samples = [niah.build_haystack(tok, None, length, 0.5, variant, seed)
               for length, variant, seed in ((96, "passkey", 1), (160, "passkey", 2), (128, "chat", 3))]
    widths = []  # the logits formed: the answers' positions only, not [B, T, vocab]
    model.register_forward_hook(lambda module, args, out: widths.append(out.logits.shape[1]))
    for fmt in ("raw", "chat"):
        group = [s for s in samples if s.prompt_format == fmt]
        got = niah._key_logprobs(model, tok, group)
        assert widths.pop() <= 8
        for s, lp in zip(group, got):
            enc = niah._encode_kwargs(fmt)
            prompt = tok(s.prompt, **enc)["input_ids"]
            full = tok(f"{s.prompt} {s.answer}", **enc)["input_ids"]
            assert full[:len(prompt)] == prompt and tok.decode(full[len(prompt):]).strip() == s.answer
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([full])).logits[0, :-1].float(), -1)
            want = sum(float(logp[i - 1, full[i]]) for i in range(len(prompt), len(full)))
            assert lp == pytest.approx(want, abs=1e-3) and lp < 0
    summary = niah.summarize_logprobs({96: [-1.0, -3.0], 160: [-2.0]})
    assert summary["key_logprob"] == pytest.approx(-2.0) and summary["key_logprob_by_length"] == {"96": -2.0, "160": -2.0}
    assert summary["key_logprob_by_length_se"]["96"] == pytest.approx(1.0) and summary["key_logprob_by_length_se"]["160"] == 0
    assert niah.summarize_logprobs({96: [math.nan]}) == {}


# ---------------------------------------------------------------------------------------------- bounds


@pytest.mark.parametrize("student", [None, {"mixer": "gated_deltanet"}, {"mixer": "gla", "attn_layers": [1], "window_size": 8},
                                     {"mixer": "deltanet", "window_size": 8}])
def test_one_prefill_answers_and_scores_like_the_two_passes(tiny_teacher_dir, student):
    """`_answer_and_score` (one prefill, a copied cache for the key, generate on from the cache) gives `_generate`'s
    greedy text and `_key_logprobs`'s log-probabilities on left-padded batches of both prompt formats, for the teacher
    and for pure, hybrid and windowed students (their states, windows and KV caches copied and continued)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import linzoo

    tok = AutoTokenizer.from_pretrained(tiny_teacher_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_teacher_dir).eval()
    if student is not None:
        torch.manual_seed(0)
        model = linzoo.linearize(model, **student).eval()
    for variant in ("passkey", "chat"):
        samples = [niah.build_haystack(tok, None, length, depth, variant, seed)
                   for length, depth, seed in ((96, 0.5, 1), (160, 0.0, 2), (128, 1.0, 3))]
        texts, scored = niah._answer_and_score(model, tok, samples, max_new_tokens=6)
        assert texts == niah._generate(model, tok, samples, max_new_tokens=6)
        assert scored == pytest.approx(niah._key_logprobs(model, tok, samples), abs=1e-4)


def test_lengths_past_the_positions_are_refused_before_any_prompt():
    tok = bpe_tokenizer(FILLER)
    model = tiny_llama(tok)  # 1,024 positions
    with pytest.raises(ValueError, match=r"--lengths 1020,4096: tiny takes 1024 positions and the answer needs 16 "
                                         r"of them: give lengths up to 1008"):
        niah.run_niah(model, tok, [128, 1020, 4096], [0.0], model_name="tiny")
    gpt2 = {"model_type": "gpt2", "n_positions": 1024}  # under the name its config class maps it to
    assert niah.position_limit(gpt2) == 1024
    student = {"model_type": "linzoo", "max_position_embeddings": 8192, "layer_types": ["linear_attention"] * 2}
    assert niah.position_limit(student) is None  # nothing indexed by position: memory alone bounds it
    hybrid = {**student, "layer_types": ["linear_attention", "full_attention"]}
    assert niah.position_limit(hybrid) == 8192


def test_the_cli_checks_positions_from_config_json_before_loading(tiny_teacher_dir, tmp_path):
    with pytest.raises(ValueError, match=r"--lengths 600: .*tiny-llama takes 512 positions"):
        niah.NiahArguments(model=str(tiny_teacher_dir), lengths="128,600", out=str(tmp_path))
    with pytest.raises(ValueError, match=r"--lengths 500: .*tiny-llama takes 512 positions.*up to 464"):
        niah.NiahArguments(model=str(tiny_teacher_dir), teacher=str(tiny_teacher_dir), lengths="500", variant="uuid",
                           out=str(tmp_path))


def test_a_generation_that_cannot_fit_is_refused_with_its_estimate(monkeypatch):
    import psutil

    tok = bpe_tokenizer(FILLER)
    model = tiny_llama(tok)
    host, device = niah.generation_memory(model, [256], 10, 4, 16)
    assert host > 0 and device > 0
    memory = psutil.virtual_memory()._replace(available=(host + device) // 2)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: memory)
    monkeypatch.setattr(niah, "build_haystack", lambda *a, **k: pytest.fail("built a prompt first"))
    with pytest.raises(ValueError, match=r"NIAH up to 256 tokens, batch 4, needs about 0.0 GiB on cpu \(0.0 GiB "
                                         r"available\): use shorter --lengths, a smaller --batch_size"):
        niah.run_niah(model, tok, [256], [0.0], samples_per_cell=10, batch_size=4)


def test_fifty_million_tokens_are_refused():
    tok = bpe_tokenizer(FILLER)
    host, device = niah.generation_memory(tiny_llama(tok), [50_000_000], 50, 4, 16)
    assert host + device > 200 * 2**30  # beyond any machine we run on: check_memory refuses it


@pytest.mark.parametrize("command", ["niah", "quality"])
def test_out_is_checked_before_any_model_loads(command, tiny_teacher_dir, tmp_path, monkeypatch):
    from linzoo.evals import quality

    import linzoo

    monkeypatch.setattr(linzoo, "load_model", lambda *a, **k: pytest.fail("loaded a model first"), raising=False)
    main = niah.main if command == "niah" else quality.main
    common = ["--model", str(tiny_teacher_dir), "--lengths" if command == "niah" else "--tasks",
              "128" if command == "niah" else "piqa"]
    a_file = tmp_path / "a-file"
    a_file.write_text("results written before")
    for out, why in ((a_file, "a-file is not a folder"), (a_file / "sub", "a-file is not a folder")):
        with pytest.raises(ValueError, match=f"--out {re.escape(str(out))}: .*{why}"):
            main([*common, "--out", str(out)])
    assert a_file.read_text() == "results written before"
    monkeypatch.setattr(niah.os, "access", lambda path, mode: False)
    with pytest.raises(ValueError, match=f"--out {re.escape(str(tmp_path / 'new'))}: .* is not writable"):
        main([*common, "--out", str(tmp_path / "new")])
