"""The NIAH Space: its helpers, and spaces/niah/app.py served on localhost with a tiny student, driven
through gradio_client (the UI's own endpoint) and a headless Chromium (selenium).

The tiny random student cannot retrieve a pass key, so the served answers are compared with what the
same cached model generates in this process (greedy, CPU: identical), and the "correct" verdict is
exercised with a custom needle whose expected answer is a piece of that deterministic generation.
"""

import importlib.util
import json
import os
import re
import tempfile
from pathlib import Path

import gradio
import pytest
import torch
from gradio_client import Client
from huggingface_hub import SpaceCard
from transformers import LlamaConfig, LlamaForCausalLM

import linzoo
from linzoo.evals import niah, quality
from linzoo.hub_cards import space

ROOT = Path(__file__).resolve().parents[1]
SPACE_DIR = ROOT / "spaces" / "niah"
FILLER = "\n\n".join(f"The river watched the garden before mountain {i} was quiet again. The letter crossed the "
                     f"kitchen while the harbour slept." for i in range(40))
CONTEXT = 256
HAYSTACK = "Alpha went to the market. Beta stayed home. The secret code is hidden somewhere. Gamma slept."
QUESTION = "What is the secret code?"


def load_screenshot_helpers():
    spec = importlib.util.spec_from_file_location("space_screenshot", ROOT / "scripts" / "space_screenshot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------------ helpers


def cache_bytes(cache) -> int:
    total = 0
    for layer in cache.layers:
        for states in (getattr(layer, "recurrent_states", None), getattr(layer, "conv_states", None)):
            total += sum(t.numel() * t.element_size() for t in (states or {}).values() if torch.is_tensor(t))
        kv = (getattr(layer, "keys", None), getattr(layer, "values", None))
        total += sum(t.numel() * t.element_size() for t in kv if torch.is_tensor(t))
    return total


@pytest.mark.parametrize("mixer, attn_layers", [("gated_deltanet", []), ("xlstm", []), ("linear_attn", [1]),
                                                ("kda", []), (None, [])])
def test_state_sizes_equal_the_real_cache(mixer, attn_layers):
    from linzoo.modeling.modeling_linzoo import LinzooCache

    torch.manual_seed(0)
    teacher = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                           num_attention_heads=4, num_key_value_heads=2)).eval()
    ids = torch.randint(0, 64, (1, 37))
    if mixer is None:  # the teacher: its state is its KV cache
        model = teacher
        cache = model(ids, use_cache=True).past_key_values
    else:
        model = linzoo.linearize(teacher, mixer, attn_layers=attn_layers).eval()
        cache = LinzooCache(config=model.config)
        model(ids, cache=cache, use_cache=True)
    size = space.state_sizes(model.config, 37)
    assert size.total == cache_bytes(cache)
    assert size.teacher_kv == 2 * 3 * 2 * 8 * 37 * 4
    assert space.state_sizes(model.config, 3700).recurrent == size.recurrent  # fixed, whatever the context


def test_highlight_escapes_and_marks_the_needle():
    text = "a <b> The key is 42. c"
    html = space.highlight_html(text, [(text.index("The"), text.index(" c"))])
    assert '<mark class="needle">The key is 42.</mark>' in html and "a &lt;b&gt; " in html


def test_query_validation():
    with pytest.raises(ValueError, match="one to 3 models"):
        space.run_query([], 512, 0.5)
    with pytest.raises(ValueError, match="one to 3 models"):
        space.run_query(["a", "b", "c", "d"], 512, 0.5)
    with pytest.raises(ValueError, match="4096"):
        space.run_query(["embedded"], 8192, 0.5)
    with pytest.raises(ValueError, match="needs a haystack, a question and the expected answer"):
        space.custom_sample(None, "text", "", "x")


def test_space_metadata_matches_the_installed_gradio():
    card = SpaceCard.load(SPACE_DIR / "README.md")
    assert (card.data.sdk, card.data.app_file, card.data.license) == ("gradio", "app.py", "apache-2.0")
    assert card.data.sdk_version == gradio.__version__ and card.data.title and card.data.emoji and card.data.models
    requirements = (SPACE_DIR / "requirements.txt").read_text()
    assert f"gradio=={gradio.__version__}" in requirements and "linzoo" in requirements
    assert len((SPACE_DIR / "app.py").read_text().splitlines()) < 80  # wiring only


def test_results_view(tmp_path):
    assert space.results_view([tmp_path / "nothing here"]) == ("no results yet", [], [], [])
    assert space.results_view([ROOT / "tests"])[0] == "no results yet"


# ------------------------------------------------------------------------------------------ served app


@pytest.fixture(scope="module")
def served(tiny_student_dir, tmp_path_factory):
    """(url, model spec, results folder): app.py served from a thread, as `linzoo space` and the Hub run it."""
    results = tmp_path_factory.mktemp("results")
    niah.save_niah({"schema": niah.SCHEMA, "model": "tiny-gdn", "needle": "passkey", "prompt_format": "raw",
                    "lengths": [256], "depths": [0.0, 1.0], "samples_per_cell": 1,
                    "accuracy": {"256": {"0": 0.0, "1": 1.0}}, "mean_by_length": {"256": 0.5}, "overall": 0.5,
                    "seed": 0}, results / "tiny")
    (results / "tiny" / "quality.json").write_text(json.dumps({
        "schema": quality.SCHEMA, "model": "tiny-gdn", "teacher": "embedded", "limit": 10, "tasks": {},
        "teacher_tasks": {}, "recovery": {"piqa": 91.5, "average": 91.5}, "recovery_metric": {},
        "chance_recovery": {"piqa": 77.9, "average": 77.9}, "perplexity": None,
        "teacher_perplexity": None, "kl_to_teacher": None, "heldout_tokens": 0}))
    filler = tmp_path_factory.mktemp("filler") / "filler.txt"
    filler.write_text(FILLER)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LINZOO_SPACE_FILLER", str(filler))
        spec = str(tiny_student_dir)
        demo, url = load_screenshot_helpers().start_space([spec, "embedded"], [results])
        yield url, spec
        demo.close()


def expected_row(spec, sample, max_new_tokens=None):
    """What the Space must show for `sample`: generated by the same cached model in this process."""
    model, tokenizer = space.load(spec)
    text, correct, _ = niah.answer_one(model, tokenizer, sample, max_new_tokens)
    size = space.state_sizes(model.config, sample.n_tokens)
    return text.strip(), correct, size


def test_client_passkey_shows_answer_time_and_state(served):
    url, spec = served
    html, table = Client(url, verbose=False).predict([spec], CONTEXT, 0.5, "passkey", 7, "raw", "", "", "",
                                                     api_name="/ask")
    model, tokenizer = space.load(spec)
    sample = niah.build_haystack(tokenizer, list(space.filler_texts(os.environ["LINZOO_SPACE_FILLER"])),
                                 CONTEXT, 0.5, "passkey", 7)
    text, correct, size = expected_row(spec, sample)
    (row,) = table["data"]
    assert table["headers"] == space.RESULT_HEADERS
    assert row[:4] == [spec, sample.answer, text, space.CORRECT if correct else space.WRONG]
    assert float(row[4]) > 0 and int(row[5]) == sample.n_tokens <= CONTEXT
    assert row[6] == f"{space.format_bytes(size.recurrent + size.conv)} fixed"
    assert row[7] == space.format_bytes(size.teacher_kv)
    assert f'<mark class="needle">{sample.needle}</mark>' in html


def test_client_custom_needle_is_judged_correct(served):
    url, spec = served
    model, tokenizer = space.load(spec)
    probe = space.custom_sample(tokenizer, HAYSTACK, QUESTION, "unused")
    generated, _, _ = expected_row(spec, probe, space.CUSTOM_MAX_NEW_TOKENS)
    fragment = max(re.findall(r"[A-Za-z0-9]{3,}", generated), key=len)
    _, table = Client(url, verbose=False).predict([spec], CONTEXT, 0.5, "custom", 0, "raw", HAYSTACK, QUESTION,
                                                  fragment, api_name="/ask")
    assert table["data"][0][1:4] == [fragment, generated, space.CORRECT]


def test_client_results_tab(served):
    url, _ = served
    note, gallery, recovery, niah_rows = Client(url, verbose=False).predict(api_name="/results")
    assert note.startswith("1 NIAH and 1 quality")
    assert len(gallery) == 1 and Path(gallery[0]["image"]).stat().st_size > 1000
    assert "tiny-gdn: NIAH passkey, overall 0.50" == gallery[0]["caption"]
    assert recovery["data"][0][:2] == ["tiny-gdn", "embedded"]
    assert "91.5%" in recovery["data"][0] and "77.9%" in recovery["data"][0]  # recovery, a uniform guess's
    assert niah_rows["data"][0][:4] == ["tiny-gdn", "passkey", "raw", "0.500"]


def test_browser_runs_a_query_and_shows_the_verdict(served, tmp_path):
    helpers = load_screenshot_helpers()
    if None in helpers.chromium_paths():
        pytest.skip("chromium / chromedriver not installed (apt-get install -y chromium chromium-driver)")
    url, spec = served
    model, tokenizer = space.load(spec)
    probe = space.custom_sample(tokenizer, HAYSTACK, QUESTION, "unused")
    generated, _, _ = expected_row(spec, probe, space.CUSTOM_MAX_NEW_TOKENS)
    fragment = max(re.findall(r"[A-Za-z0-9]{3,}", generated), key=len)
    driver = helpers.chromium(Path(tempfile.mkdtemp(dir=tmp_path)))
    try:
        passkey = helpers.ask(driver, url, CONTEXT, expect=spec)
        assert spec in passkey and ("correct" in passkey or "wrong" in passkey) and "KiB fixed" in passkey
        assert driver.find_element("css selector", "#haystack mark.needle").text.startswith("The pass key is")
        custom = helpers.ask(driver, url, CONTEXT, custom=(HAYSTACK, QUESTION, fragment), expect=fragment)
        assert space.CORRECT in custom and fragment in custom
        driver.save_screenshot(str(tmp_path / "space.png"))
    finally:
        driver.quit()
    assert (tmp_path / "space.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
