"""`linzoo eval speed` on tiny models: rows and ratios to the teacher, skipped lengths, the roofline's arithmetic, the
measured state against the config's, the card section, the Space row, the plot and one-line errors."""

import json

import pytest
import torch

from linzoo.evals import speed


@pytest.fixture(autouse=True)
def small_bandwidth_copy(monkeypatch):
    monkeypatch.setattr(speed, "BANDWIDTH_BYTES", {"cpu": 8 * 2**20, "cuda": 8 * 2**20})


@pytest.fixture(scope="module")
def tiny_pair():
    """(teacher, pure student, hybrid student with a window) in memory: a 3-layer Llama and two linearizations."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import linzoo

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    teacher = LlamaForCausalLM(config).eval()
    return (teacher, linzoo.linearize(teacher, "gated_deltanet").eval(),
            linzoo.linearize(teacher, "gated_deltanet", attn_layers=[1], window_size=4).eval())


@pytest.fixture(scope="module")
def cli_run(tiny_teacher_dir, tiny_student_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("speed")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(speed, "BANDWIDTH_BYTES", {"cpu": 8 * 2**20, "cuda": 8 * 2**20})
        results = speed.main(["--models", str(tiny_teacher_dir), str(tiny_student_dir), "--lengths", "32,16",
                              "--batch_sizes", "1,2", "--decode_tokens", "2", "--repeats", "1", "--threads", "1",
                              "--device", "cpu", "--out", str(out)])
    return results, out


def test_rows_and_ratios(cli_run, tiny_teacher_dir, tiny_student_dir):
    results, out = cli_run
    saved = json.loads((out / "speed.json").read_text())
    assert saved == json.loads(json.dumps(results)) and speed.EVAL.read(out / "speed.json") == saved
    teacher, student = str(tiny_teacher_dir), str(tiny_student_dir)
    assert saved["schema"] == speed.SCHEMA and saved["models"] == [teacher, student] and saved["teacher"] == teacher
    assert saved["lengths"] == [16, 32] and saved["batch_sizes"] == [1, 2] and saved["skipped"] == []
    from linzoo.evals.common import weights_sha256

    # what it measured: each model's weights, and as its own the first student's (the zoo and the cards read that)
    assert saved["weights_sha256_by_model"] == {m: weights_sha256(m) for m in (teacher, student)}
    assert saved["weights_sha256"] == weights_sha256(student) is not None
    rows = {(r["model"], r["length"], r["batch"]): r for r in saved["rows"]}
    assert set(rows) == {(m, l, b) for m in (teacher, student) for l in (16, 32) for b in (1, 2)}
    for (model, length, batch), row in rows.items():
        ref = rows[teacher, length, batch]
        for figure in speed.FIGURES:
            want = None if not ref[figure] else row[figure] / ref[figure]
            assert row["ratios"][figure] == pytest.approx(want) if want is not None else row["ratios"][figure] is None
        assert row["prefill_s"] > 0 and row["decode_ms_per_token"] > 0
        assert row["state_bytes_per_sequence"] == row["cache_bytes"] // batch
    for figure in ("prefill_s", "decode_ms_per_token", "state_bytes_per_sequence"):
        assert all(rows[teacher, l, b]["ratios"][figure] == 1.0 for l in (16, 32) for b in (1, 2))
    # the teacher's KV cache grows with the context; the all-linear student's state does not
    assert rows[teacher, 32, 1]["state_bytes_per_sequence"] > rows[teacher, 16, 1]["state_bytes_per_sequence"]
    assert rows[student, 32, 1]["state_bytes_per_sequence"] == rows[student, 16, 1]["state_bytes_per_sequence"]
    assert [(c["model"], c["batch"]) for c in saved["crossover"]] == [(student, 1), (student, 2)]
    assert (out / "speed.png").stat().st_size > 1000


def test_default_out_is_the_first_students_eval_folder(tiny_teacher_dir, tiny_student_dir):
    args = speed.SpeedArguments(models=[str(tiny_teacher_dir), str(tiny_student_dir)])
    assert args.out == str(tiny_student_dir / "eval")
    assert speed.SpeedArguments(models=[str(tiny_teacher_dir), "embedded"], out=None).out == speed.DEFAULT_OUT


def test_card_section_and_space_row(cli_run, tiny_student_dir):
    results, out = cli_run
    section = speed.card_section(results, out)
    assert section.startswith("### Speed") and "| context (tokens) | batch | model |" in section
    table = [line for line in section.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(table) == len(results["rows"]) and all(line.count("|") == 9 for line in table)
    assert "1.00×" in table[0] and "prefill faster" in section and "Skipped" not in section
    assert speed.card_section(None, out) == ""
    row = speed.EVAL.space_row(results)
    assert len(row) == len(speed.EVAL.space_headers) and row[2] == "32 x 1" and str(tiny_student_dir) in row[3]
    assert str(tiny_student_dir) in speed.EVAL.space_caption(results)


def test_skipped_lengths_are_reported(tiny_pair, tmp_path):
    teacher, student, _ = tiny_pair
    lines = []
    results = speed.run_speed({"teacher": teacher, "student": student}, "8,16,32", "1", decode_tokens=1, repeats=1,
                              threads=1, max_seconds_per_cell=1e-9, progress=lines.append)
    assert {r["length"] for r in results["rows"]} == {8}  # the first length is always measured
    assert [(s["length"], s["batch"]) for s in results["skipped"]] == [(16, 1), (32, 1)]
    assert all(s["predicted_seconds"] >= 0 for s in results["skipped"])
    assert sum("skip" in line for line in lines) == 2
    speed.save_speed(results, tmp_path)
    assert "Skipped" in speed.card_section(results, tmp_path) and "16 x 1" in speed.describe_skipped(results)


def test_roofline_and_state_bytes(tiny_pair):
    from linzoo.modeling.configuration_linzoo import state_sizes

    assert speed.roofline_ms(10**9, 1e10) == pytest.approx(100.0)  # 1 GB at 10 GB/s
    teacher, student, hybrid = tiny_pair
    results = speed.run_speed({"teacher": teacher, "student": student, "hybrid": hybrid}, "24", "2", decode_tokens=1,
                              repeats=1, threads=1)
    rows = {r["model"]: r for r in results["rows"]}
    config = teacher.config
    kv = 2 * config.num_hidden_layers * config.num_key_value_heads * (config.hidden_size // 4) * 24 * 4
    assert rows["teacher"]["state_bytes_per_sequence"] == kv == state_sizes(config, 24).teacher_kv
    for name, model in (("student", student), ("hybrid", hybrid)):
        size = state_sizes(model.config, 24)  # plus a token counter per linear layer
        assert 0 <= rows[name]["state_bytes_per_sequence"] - size.total <= 16 * config.num_hidden_layers
    for name, model in (("teacher", teacher), ("student", student), ("hybrid", hybrid)):
        row = rows[name]
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        assert results["parameter_bytes"][name] == params
        assert row["roofline_bytes_per_token"] == params + row["cache_bytes"]
        assert row["roofline_ms_per_token"] == pytest.approx(
            1e3 * row["roofline_bytes_per_token"] / results["bandwidth_bytes_per_s"])
        assert row["roofline_fraction"] == pytest.approx(row["roofline_ms_per_token"] / row["decode_ms_per_token"])


def test_prediction_and_crossover():
    assert speed.predict_seconds([(256, 1.0)], 512) == pytest.approx(4.0)  # one point: quadratic
    assert speed.predict_seconds([(256, 1.0), (512, 2.0)], 2048) == pytest.approx(8.0)  # linear, fitted
    assert speed.predict_seconds([(256, 1.0), (512, 1.1)], 1024) == pytest.approx(2.2)  # at least linear
    assert speed.predict_seconds([(256, 1.0), (512, 9.0)], 1024) == pytest.approx(36.0)  # at most quadratic

    def rows(ratios):
        return [{"model": "s", "batch": 1, "length": 256 * 2**i, "ratios": {"prefill_s": r}}
                for i, r in enumerate(ratios)]

    assert speed.crossover(rows([1.2, 0.9, 0.7]), "s", 1, "prefill_s") == 512
    assert speed.crossover(rows([0.9, 1.1, 0.8, 0.6]), "s", 1, "prefill_s") == 1024  # from which on it stays faster
    assert speed.crossover(rows([0.9, 1.1]), "s", 1, "prefill_s") is None


@pytest.mark.parametrize("flags, words", [
    (["--lengths", "0,256"], "--lengths"),
    (["--lengths", "abc"], "--lengths"),
    (["--batch_sizes", "0"], "--batch_sizes"),
    (["--device", "tpu"], "--device"),
    (["--repeats", "0"], "--repeats"),
    (["--dtype", "float8"], "--dtype"),
])
def test_bad_input_is_one_line_before_loading(flags, words, tiny_teacher_dir, tiny_student_dir, monkeypatch, capsys):
    from linzoo import cli

    monkeypatch.setattr(speed, "load_for_eval", lambda *a, **k: pytest.fail("a model loaded before the checks"))
    code = cli.main(["eval", "speed", "--models", str(tiny_teacher_dir), str(tiny_student_dir), *flags])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("linzoo eval speed: error: ") and words in err and err.count("\n") == 1


def test_one_model_is_refused(tiny_teacher_dir):
    with pytest.raises(ValueError, match="at least one student"):
        speed.main(["--models", str(tiny_teacher_dir)])


def test_int8_quantizes_every_model_alike(tiny_teacher_dir, tiny_student_dir, tmp_path):
    """--quantize int8: both models' linear layers int8 (torch's dynamic quantization), their weight bytes counted
    (packed outside parameters()), the results saying so; the card leaves them out."""
    from hub_cards import card

    results = speed.main(["--models", str(tiny_teacher_dir), str(tiny_student_dir), "--lengths", "16",
                          "--batch_sizes", "1", "--decode_tokens", "2", "--repeats", "1", "--threads", "1",
                          "--device", "cpu", "--quantize", "int8", "--out", str(tmp_path / "q")])
    plain = speed.main(["--models", str(tiny_teacher_dir), str(tiny_student_dir), "--lengths", "16",
                        "--batch_sizes", "1", "--decode_tokens", "2", "--repeats", "1", "--threads", "1",
                        "--device", "cpu", "--out", str(tmp_path / "p")])
    assert results["quantize"] == "int8" and plain["quantize"] == "none"
    for name in results["models"]:  # linear weights at 1 byte instead of 4: fewer bytes, more than the rest alone
        assert 0 < results["parameter_bytes"][name] < plain["parameter_bytes"][name]
    assert "dynamically quantized to int8" in speed.card_section(results, tmp_path)
    (tiny_student_dir / "eval").mkdir(exist_ok=True)
    target = tiny_student_dir / "eval" / "quality.json"
    from linzoo.evals.common import write_json

    write_json({"schema": "linzoo.quality/v1", "model": str(tiny_student_dir), "quantize": "int8"}, target)
    try:
        found, left_out = card.matching_results(tiny_student_dir)
        assert found["quality"] is None and any("quantized to int8" in line for line in left_out)
    finally:
        target.unlink()


@pytest.mark.parametrize("flags, words", [
    (["--quantize", "int4"], "--quantize"),
    (["--quantize", "int8", "--dtype", "bfloat16"], "leave --dtype auto"),
])
def test_bad_quantize_is_one_line_before_loading(flags, words, tiny_teacher_dir, tiny_student_dir, monkeypatch,
                                                  capsys):
    from linzoo import cli

    monkeypatch.setattr(speed, "load_for_eval", lambda *a, **k: pytest.fail("a model loaded before the checks"))
    code = cli.main(["eval", "speed", "--models", str(tiny_teacher_dir), str(tiny_student_dir), *flags])
    err = capsys.readouterr().err
    assert code == 2 and words in err and err.count("\n") == 1


def test_int8_student_stays_close_and_generates():
    """The quantized tiny student: logits near the float ones, and generate() runs on its cache (activations are
    quantized per call, so a cached step is near, not equal to, the same position in one uncached forward)."""
    from linzoo.evals.common import quantize_int8
    from test_modeling import VOCAB, tiny_model

    model = tiny_model("gated_deltanet", [1], window_size=4)
    ids = torch.randint(1, VOCAB, (1, 12))
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
        quantize_int8(model)
        assert not any(isinstance(m, torch.nn.Linear) and type(m) is torch.nn.Linear for m in model.modules())
        got = model(ids, use_cache=False).logits
        assert (got - want).abs().max() < 0.1 * want.abs().max()
        out = model.generate(ids, max_new_tokens=4, do_sample=False, output_logits=True, return_dict_in_generate=True)
        full = model(out.sequences[:, :-1], use_cache=False).logits[:, ids.shape[1] - 1:]
    assert out.sequences.shape == (1, 16)
    torch.testing.assert_close(torch.stack(out.logits, 1), full, atol=0.1 * full.abs().max().item(), rtol=0)


def test_a_slow_warm_up_does_not_skip_longer_lengths(tiny_pair, monkeypatch):
    """The skip rule predicts from the timed runs: a warm-up holding a one-off compile (0.5 s here, Triton and
    torch.compile on the H100 of 2026-12-06, where a 1k cell then predicted 688 s at 4k) must not skip the rest."""
    import time

    teacher, student, _ = tiny_pair
    base = speed.PeakMemory

    class SlowWarmUp(base):
        def __enter__(self):
            time.sleep(0.5)
            return super().__enter__()

    monkeypatch.setattr(speed, "PeakMemory", SlowWarmUp)
    results = speed.run_speed({"teacher": teacher, "student": student}, "8,16", "1", decode_tokens=1, repeats=1,
                              threads=1, max_seconds_per_cell=0.4, progress=lambda line: None)
    assert results["skipped"] == [] and {r["length"] for r in results["rows"]} == {8, 16}


def test_int8_teacher_with_tied_head_survives_lm_evals_tie_weights(tiny_teacher_dir):
    """lm-eval's HFLM calls tie_weights() on the model it is given: a quantized head tied to the embedding must stay
    (the main job's student failed `eval quality --quantize int8` with "attribute 'weight' already exists")."""
    from transformers import AutoModelForCausalLM

    from linzoo.evals.common import quantize_int8

    model = AutoModelForCausalLM.from_pretrained(tiny_teacher_dir).eval()
    assert model.config.tie_word_embeddings
    quantize_int8(model)
    model.tie_weights()
    with torch.no_grad():
        assert model(torch.tensor([[1, 2, 3]])).logits.isfinite().all()


def test_static_decoder_is_the_teachers_greedy_decoding(tiny_pair):
    """The teacher's graph-decoding side (a static cache, the step run eagerly off CUDA) gives generate()'s greedy
    tokens, and again from the prompt on a second call; the pure student's side is its own GraphedDecoder."""
    teacher, pure, hybrid = tiny_pair
    ids = torch.randint(1, 64, (2, 12), generator=torch.Generator().manual_seed(3))  # 0 is the padding id below
    reference = teacher.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)[:, 12:]
    decoder = speed.StaticDecoder(teacher, ids, 7, graph=False)
    assert torch.equal(decoder.generate(6), reference) and torch.equal(decoder.generate(6), reference)
    student, why = speed.graph_decoder(pure, ids, 7)
    assert why is None and type(student).__name__ == "GraphedDecoder"
    assert torch.equal(student.generate(6), pure.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=None,
                                                          pad_token_id=0)[:, 12:])
    assert speed.graph_decoder(hybrid, ids, 7) == (None, "a hybrid's softmax layers keep a growing KV cache")


def test_graph_decoding_column_and_ratio(tiny_pair, tmp_path):
    teacher, pure, hybrid = tiny_pair
    results = speed.run_speed({"teacher": teacher, "pure": pure, "hybrid": hybrid}, "16", "1", decode_tokens=2,
                              repeats=1, threads=1, graph_decoding=True)
    rows = {r["model"]: r for r in results["rows"]}
    assert rows["teacher"]["graph_decode_ms_per_token"] > 0 and rows["pure"]["graph_decode_ms_per_token"] > 0
    assert rows["pure"]["ratios"]["graph_decode_ms_per_token"] == pytest.approx(
        rows["pure"]["graph_decode_ms_per_token"] / rows["teacher"]["graph_decode_ms_per_token"])
    assert rows["hybrid"]["graph_decode_ms_per_token"] is None
    section = speed.card_section(results, tmp_path)
    assert "| graph decode / token |" in section and "keep a growing KV cache" in section


def _oom_above(monkeypatch, limits: dict):
    """run_once raises CUDA's out-of-memory error where batch x length exceeds the model's limit in `limits`."""
    real = speed.run_once

    def run_once(model, input_ids, decode_tokens):
        if input_ids.numel() > limits.get(id(model), float("inf")):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(model, input_ids, decode_tokens)
    monkeypatch.setattr(speed, "run_once", run_once)


def test_largest_batch_doubles_until_out_of_memory(tiny_pair, monkeypatch):
    teacher, pure, _ = tiny_pair
    _oom_above(monkeypatch, {id(teacher): 4 * 16, id(pure): 16 * 16})
    rows = speed.largest_batch({"teacher": teacher, "pure": pure}, 16, 2, start=2, limit=64, progress=lambda _: None)
    by = {r["model"]: r for r in rows}
    assert by["teacher"]["largest"]["batch"] == 4 and by["teacher"]["stopped_by"] == "out of memory at batch 8"
    assert by["pure"]["largest"]["batch"] == 16 and by["pure"]["stopped_by"] == "out of memory at batch 32"
    assert by["pure"]["tokens_per_second_ratio"] == pytest.approx(
        by["pure"]["largest"]["tokens_per_second"] / by["teacher"]["largest"]["tokens_per_second"])
    _oom_above(monkeypatch, {id(teacher): 0})
    rows = speed.largest_batch({"teacher": teacher, "pure": pure}, 16, 2, start=2, limit=4, progress=lambda _: None)
    assert rows[0]["largest"] is None and rows[1]["stopped_by"] == "the limit of 4"
    assert rows[1]["tokens_per_second_ratio"] is None


def test_a_model_out_of_memory_leaves_the_others_measured(tiny_pair, monkeypatch, tmp_path):
    """A cell where one model runs out of memory: the others' rows stay, that model is not run at that batch again,
    and the card lists it; a student's row without the teacher's has no ratios."""
    teacher, pure, _ = tiny_pair
    _oom_above(monkeypatch, {id(teacher): 2 * 16 - 1})
    results = speed.run_speed({"teacher": teacher, "pure": pure}, "16,24", "1,2", decode_tokens=2, repeats=1,
                              threads=1)
    assert results["out_of_memory"] == [{"model": "teacher", "length": 16, "batch": 2}]
    cells = {(r["model"], r["length"], r["batch"]) for r in results["rows"]}
    assert cells == {("teacher", 16, 1), ("teacher", 24, 1), ("pure", 16, 1), ("pure", 24, 1), ("pure", 16, 2),
                     ("pure", 24, 2)}
    row = next(r for r in results["rows"] if r["model"] == "pure" and r["batch"] == 2)
    assert row["ratios"]["prefill_s"] is None
    speed.save_speed(results, tmp_path)
    assert "- Out of memory: teacher at 16 x 2" in speed.card_section(results, tmp_path)
