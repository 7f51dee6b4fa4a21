"""The instruction-answers eval: the scorer, the question file's checks, the results' numbers and standard errors on a
scripted model, the EOS bookkeeping, the card and Space, one-line errors before any model loads, and one run end to
end on the tiny student and teacher."""

import json
import math
import re
from pathlib import Path

import pytest
import torch

from linzoo.evals import instruct

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------------- scoring

@pytest.mark.parametrize("reply, answers, hit", [
    ("The capital of France is Paris.", ["Paris"], True),
    ("Parisian food is famous.", ["Paris"], False),  # inside a longer word
    ("PARIS!!!", ["paris"], True),
    ("\n\nParis", ["Paris"], True),
    ("The answer is four.", ["4"], True),  # number words are digits
    ("Twenty-four hours.", ["24"], True),
    ("There are twenty hours.", ["24"], False),
    ("7 + 5 = 12", ["12"], True),
    ("It is 112.", ["12"], False),  # inside a longer number
    ("It is 4.5 metres.", ["4"], False),  # a decimal is one number
    ("About 1,000 people.", ["1000"], True),
    ("Brasília, of course.", ["Brasilia"], True),  # accents dropped
    ("It is the Blue Whale.", ["blue whale"], True),  # a phrase, articles dropped
    ("A whale that is blue.", ["blue whale"], False),  # the words, not the phrase
    ("It's Rome.", ["Paris", "Rome"], True),  # any accepted answer
    ("H2O", ["H2O"], True),
])
def test_scorer(reply, answers, hit):
    assert instruct.is_hit(reply, answers) is hit


def test_only_the_first_sentence_or_twenty_words_are_scored():
    filler = " ".join(["word"] * 25)
    assert not instruct.is_hit(f"I am not sure. {filler} Paris.", ["Paris"])  # past both
    assert instruct.is_hit(f"I am not sure, maybe Paris. {filler}", ["Paris"])  # within 20 words
    assert instruct.is_hit(f"{filler}, and then Paris. Or Lyon.", ["Paris"])  # a long first sentence counts whole
    assert instruct.answer_window("Rome. Then Paris.\nAnd more") == "Rome. Then Paris. And more"


def test_the_shipped_questions_load_and_ship():
    questions = instruct.load_questions()
    kinds = {kind: sum(q["kind"] == kind for q in questions) for kind in instruct.KINDS}
    assert len(questions) >= 100 and all(n >= 20 for n in kinds.values()), kinds
    assert len({q["id"] for q in questions}) == len(questions)
    assert '"instruct_questions.jsonl"' in (ROOT / "pyproject.toml").read_text()  # package data: in the wheel


@pytest.mark.parametrize("line, message", [
    ("not json", "line 1: not JSON"),
    ('{"id": 1, "kind": "fact", "question": "Capital of Italy?"}', 'give an object with "id"'),
    ('{"id": 1, "kind": "trivia", "question": "Capital of Italy?", "answers": ["Rome"]}', "kind 'trivia': pick one"),
    ('{"id": 1, "kind": "fact", "question": "Capital of Italy?", "answers": ["the"]}', "a word or number each"),
    ('{"id": 1, "kind": "fact", "question": "Capital of Italy?", "answers": []}', "a word or number each"),
    ('{"id": 1, "kind": "arithmetic", "question": "What is 10 / 1?", "answers": ["ten"]}', "'ten' is in the question"),
])
def test_bad_question_files_are_one_line_errors(tmp_path, line, message):
    path = tmp_path / "q.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        instruct.load_questions(path)
    assert "\n" not in str(err.value)


def test_repeated_ids_and_empty_files_are_refused(tmp_path):
    path = tmp_path / "q.jsonl"
    row = {"id": "x", "kind": "fact", "question": "Capital of Italy?", "answers": ["Rome"]}
    path.write_text(json.dumps(row) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match="line 2: id 'x' given twice"):
        instruct.load_questions(path)
    path.write_text("\n")
    with pytest.raises(ValueError, match="no questions in it"):
        instruct.load_questions(path)


@pytest.mark.parametrize("flags, message", [
    (["--batch_size", "0"], "--batch_size 0: give at least 1"),
    (["--max_new_tokens", "0"], "--max_new_tokens 0: give at least 1"),
    (["--questions", "/no/such/questions.jsonl"], "--questions /no/such/questions.jsonl: cannot read it"),
])
def test_bad_values_fail_in_one_line_before_any_model_loads(flags, message, tmp_path, monkeypatch):
    import linzoo

    for loader in ("load_model", "load_teacher"):
        monkeypatch.setattr(linzoo, loader, lambda *a, **k: pytest.fail("loaded a model first"), raising=False)
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        instruct.main(["--model", "embedded", "--out", str(tmp_path), *flags])
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------------- a scripted model

class ScriptedLM:
    """A stand-in for a causal LM whose `generate` writes the next scripted (reply, ends with EOS) for each row."""

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script, self.calls = tokenizer, list(script), []

    def generate(self, input_ids, attention_mask, max_new_tokens, eos_token_id, pad_token_id, do_sample):
        assert not do_sample and bool(attention_mask[:, -1].all())  # greedy, left padded: every row ends in a token
        self.calls.append(len(input_ids))
        rows = []
        for _ in input_ids:
            text, stops = self.script.pop(0)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + ([eos_token_id[0]] if stops else [])
            rows.append(ids[:max_new_tokens])
        width = max(map(len, rows))
        new = torch.tensor([r + [pad_token_id] * (width - len(r)) for r in rows])
        return torch.cat([input_ids, new], dim=1)


QUESTIONS = [
    {"id": "f1", "kind": "fact", "question": "What is the capital of France?", "answers": ["Paris"]},
    {"id": "f2", "kind": "fact", "question": "What is the capital of Italy?", "answers": ["Rome"]},
    {"id": "a1", "kind": "arithmetic", "question": "What is 2 + 2?", "answers": ["4"]},
    {"id": "a2", "kind": "arithmetic", "question": "What is 3 + 4?", "answers": ["7"]},
    {"id": "i1", "kind": "instruction", "question": "Opposite of hot? One word.", "answers": ["cold"]},
]
SCRIPT = [("Paris.", True), ("Milan is the capital.", True), ("four", True), ("It is 8 or 7", False),
          ("cold " * 40, False)]  # 3 of 5 right; 3 of 5 stopped; the last runs past the budget


def test_results_numbers_and_standard_errors(tiny_teacher_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_teacher_dir)
    model = ScriptedLM(tok, SCRIPT)
    r = instruct.run_instruct(model, tok, QUESTIONS, batch_size=2, max_new_tokens=30, model_name="scripted")
    assert model.calls == [2, 2, 1]
    assert r["schema"] == "linzoo.instruct/v1" and r["model"] == "scripted" and r["n"] == 5
    assert [q["hit"] for q in r["records"]] == [True, False, True, True, True]
    assert [q["stopped"] for q in r["records"]] == [True, True, True, False, False]
    assert r["records"][0]["reply"] == "Paris." and r["records"][0]["new_tokens"] == len(tok("Paris.")["input_ids"]) + 1
    assert r["records"][4]["new_tokens"] == 30  # the budget, no EOS
    assert r["accuracy"] == 0.8 and r["accuracy_se"] == pytest.approx(math.sqrt(0.8 * 0.2 / 5))
    assert r["stop_rate"] == 0.6 and r["stop_rate_se"] == pytest.approx(math.sqrt(0.6 * 0.4 / 5))
    assert r["by_kind"] == {"fact": {"n": 2, "accuracy": 0.5, "accuracy_se": 0.5 * math.sqrt(0.5)},
                            "arithmetic": {"n": 2, "accuracy": 1.0, "accuracy_se": 0.0},
                            "instruction": {"n": 1, "accuracy": 1.0, "accuracy_se": 0.0}}
    assert r["teacher"] is None and r["ratio"] is None and tok.padding_side == "right"  # padding asked per call


def test_an_eos_on_the_last_allowed_token_is_a_stop(tiny_teacher_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_teacher_dir)
    budget = len(tok("Paris.")["input_ids"]) + 1
    for max_new_tokens, stopped in ((budget, True), (budget - 1, False)):
        r = instruct.run_instruct(ScriptedLM(tok, [("Paris.", True)]), tok, QUESTIONS[:1],
                                  max_new_tokens=max_new_tokens)
        assert r["records"][0]["stopped"] is stopped and r["records"][0]["hit"]


def scored(accuracy_hits, stops, model):
    records = [{"kind": "fact", "hit": h, "stopped": s} for h, s in zip(accuracy_hits, stops)]
    return {"schema": instruct.SCHEMA, "model": model, "questions": "q.jsonl", "max_new_tokens": 64,
            "batch_size": 8, **instruct.summarize(records), "teacher": None, "ratio": None, "seconds": 1.0,
            "records": records}


def test_teacher_beside_the_student_with_the_ratio():
    student = scored([1, 1, 0, 0], [1, 1, 1, 0], "student")
    teacher = scored([1, 1, 1, 1], [1, 1, 1, 1], "teacher")
    r = instruct.with_teacher(student, teacher)
    assert r["teacher"]["model"] == "teacher" and r["teacher"]["accuracy"] == 1.0
    assert r["ratio"]["accuracy"] == {"value": 0.5, "se": pytest.approx(0.25)}  # se_s / t, the teacher's se 0
    assert r["ratio"]["stop_rate"]["value"] == 0.75 and r["ratio"]["by_kind"]["fact"]["value"] == 0.5
    half = scored([1, 0], [1, 1], "teacher")  # s 0.5 ± 0.25 over t 0.5 ± 0.354: delta method
    assert instruct.with_teacher(student, half)["ratio"]["accuracy"]["se"] == pytest.approx(
        math.sqrt((0.25 / 0.5) ** 2 + (0.5 * math.sqrt(0.125) / 0.25) ** 2))
    assert instruct.with_teacher(student, scored([0, 0], [1, 1], "t"))["ratio"]["accuracy"] == {"value": None,
                                                                                                "se": None}
    with pytest.raises(ValueError, match="different question sets"):
        instruct.with_teacher(student, {**teacher, "questions_sha256": "another"})


def test_card_section_space_row_and_figure(tmp_path):
    from linzoo.spaces.niah import niah_space

    r = instruct.with_teacher(scored([1, 1, 0, 0], [1, 1, 1, 0], "student"), scored([1, 1, 1, 1], [1] * 4, "teacher"))
    json_path, png_path = instruct.save_instruct(r, tmp_path / "eval")
    assert json.loads(json_path.read_text())["ratio"]["accuracy"]["value"] == 0.5
    assert png_path.read_bytes()[:4] == b"\x89PNG"
    text = instruct.card_section(r, tmp_path)
    assert "Accuracy **0.500 ± 0.250** against the teacher's 1.000 ± 0.000 (ratio 0.500 ± 0.250)" in text
    assert "| fact | 4 | 0.500 ± 0.250 | 1.000 ± 0.000 |" in text
    assert "(EOS) within the budget: 0.750 ± 0.217 (teacher 1.000 ± 0.000)" in text
    assert "![Instruction answers: accuracy per kind and EOS stop rate](eval/instruct.png)" in text
    alone = instruct.card_section(scored([1, 0], [1, 1], "student"), tmp_path / "none")
    assert "| fact | 2 | 0.500 ± 0.354 |\n" in alone and "teacher" not in alone and "![" not in alone
    assert instruct.card_section(None, tmp_path) == ""
    names = [e.metric_name for e in instruct.card_results(r)]
    assert names == ["accuracy", "accuracy (fact)", "stops within 64 tokens"]
    _, gallery, *tables = niah_space.results_view([tmp_path])
    from linzoo.evals.registry import EVAL_MODULES

    rows = tables[list(EVAL_MODULES).index("instruct")]
    assert rows == [["student", "0.500±0.250", "fact: 0.50±0.25", "0.750±0.217", "teacher: 0.500±0.250"]]
    assert gallery == [(str(png_path), "student: instruction answers, accuracy 0.50")]


# ---------------------------------------------------------------------------------------------- end to end

def test_tiny_student_and_teacher_end_to_end(tiny_student_dir, tiny_teacher_dir, tmp_path):
    questions = tmp_path / "three.jsonl"
    questions.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS[:3]))
    out = tmp_path / "out"
    r = instruct.main(["--model", str(tiny_student_dir), "--teacher", str(tiny_teacher_dir), "--questions",
                       str(questions), "--out", str(out), "--max_new_tokens", "4", "--batch_size", "2",
                       "--device", "cpu"])
    assert r["n"] == 3 and r["questions"] == str(questions) and r["max_new_tokens"] == 4
    assert all(1 <= q["new_tokens"] <= 4 for q in r["records"]) and r["weights_sha256"]
    assert r["teacher"]["model"] == str(tiny_teacher_dir) and r["teacher"]["n"] == 3
    assert json.loads((out / "instruct.json").read_text()) == r and (out / "instruct.png").is_file()
    teacher = json.loads((out / "teacher" / "instruct.json").read_text())
    assert teacher["teacher"] is None and teacher["accuracy"] == r["teacher"]["accuracy"]
