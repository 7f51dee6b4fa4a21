"""The NIAH Space: its helpers, the models it agrees to load, spaces/niah/app.py served on localhost with a tiny
student, driven through gradio_client (the UI's own endpoint) and a headless Chromium (selenium), and the Space
repo `linzoo push-zoo` plans, installed into a fresh venv from its requirements.txt alone and started there.

The tiny random student cannot retrieve a pass key, so the served answers are compared with what the
same cached model generates in this process (greedy, CPU: identical), and the "correct" verdict is
exercised with a custom needle whose expected answer is a piece of that deterministic generation.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zipfile
from pathlib import Path

import gradio
import pytest
import space_screenshot
import torch
from gradio_client import Client
from huggingface_hub import SpaceCard, hf_hub_url
from test_loading import AUTO_MAP, edit_config, marker, plant  # noqa: F401 (marker: a fixture)
from transformers import LlamaConfig, LlamaForCausalLM

import linzoo
import linzoo.loading
from linzoo.evals import niah, quality
from linzoo.formatting import format_bytes
from linzoo.hub_cards import plan
from linzoo.modeling.configuration_linzoo import state_sizes
from linzoo.spaces.niah import niah_space as space

ROOT = Path(__file__).resolve().parents[1]
SPACE_DIR = ROOT / "spaces" / "niah"
FILLER = "\n\n".join(f"The river watched the garden before mountain {i} was quiet again. The letter crossed the "
                     f"kitchen while the harbour slept." for i in range(40))
CONTEXT = 256
HAYSTACK = "Alpha went to the market. Beta stayed home. The secret code is hidden somewhere. Gamma slept."
QUESTION = "What is the secret code?"


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
    size = state_sizes(model.config, 37)
    assert size.total == cache_bytes(cache)
    assert size.teacher_kv == 2 * 3 * 2 * 8 * 37 * 4
    assert state_sizes(model.config, 3700).recurrent == size.recurrent  # fixed, whatever the context


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
    with pytest.raises(ValueError, match="'/etc' is not one of this Space's models; pick among embedded"):
        space.run_query(["/etc"], 512, 0.5, allowed=["embedded"])


@pytest.mark.parametrize("field, value", [
    ("context_len", float("inf")), ("context_len", float("nan")), ("context_len", -1), ("context_len", 1e9),
    ("context_len", 1000.5), ("depth", 2), ("depth", -0.1), ("depth", float("nan")), ("seed", 1e30),
    ("seed", float("inf")), ("seed", -1), ("seed", 1.5), ("seed", "7; rm -rf /")])
def test_numbers_are_checked_before_loading(field, value, tiny_teacher_dir, monkeypatch):
    monkeypatch.setattr(space, "load", lambda spec: pytest.fail(f"{spec} was loaded"))
    query = {"context_len": 256, "depth": 0.5, "seed": 7, field: value}
    name = {"context_len": r"Context length \(tokens\) must be a whole number in 64\.\.4096",
            "depth": r"Needle depth must be a number in 0\.\.1", "seed": r"Seed must be a whole number in 0\.\.4294967295"}
    with pytest.raises(ValueError, match=rf"^{name[field]} on this Space, got {re.escape(repr(value))}\.$"):
        space.run_query([str(tiny_teacher_dir)], query["context_len"], query["depth"], "passkey", query["seed"],
                        allowed=[str(tiny_teacher_dir)])


class NoTokenizer:
    def __call__(self, *args, **kwargs):
        pytest.fail("the tokenizer read the haystack")

    apply_chat_template = __call__


def test_a_long_haystack_is_refused_before_the_tokenizer_reads_it(tiny_teacher_dir, monkeypatch):
    haystack = "The secret code is 42. " * (space.MAX_CUSTOM_CHARS // 23 + 1)
    refusal = rf"^Your haystack and question have {len(haystack) + len(QUESTION):,} characters; this Space reads at most"
    with pytest.raises(ValueError, match=refusal):
        space.custom_sample(NoTokenizer(), haystack, QUESTION, "42")
    monkeypatch.setattr(space, "load", lambda spec: pytest.fail(f"{spec} was loaded"))
    with pytest.raises(ValueError, match=refusal):
        space.run_query([str(tiny_teacher_dir)], 256, 0.5, "custom", 0, "raw", haystack, QUESTION, "42",
                        allowed=[str(tiny_teacher_dir)])


def test_cards_import_nothing_of_the_space():
    """A card depends on the results and the model, not on the demo: importing card (and push, which writes cards)
    in a fresh process loads no module of the Space, wherever it lives (the one with `run_query`)."""
    probe = ("import sys, linzoo.hub_cards.card, linzoo.hub_cards.push; print([name for name, module in "
             "sys.modules.items() if name.startswith('linzoo') and (hasattr(module, 'run_query') or "
             "name.startswith('linzoo.spaces'))])")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def test_space_metadata_matches_the_installed_gradio():
    card = SpaceCard.load(SPACE_DIR / "README.md")
    assert (card.data.sdk, card.data.app_file, card.data.license) == ("gradio", "app.py", "apache-2.0")
    assert card.data.sdk_version == gradio.__version__ and card.data.title and card.data.emoji and card.data.models
    assert card.data.python_version == f"{sys.version_info.major}.{sys.version_info.minor}"  # the tested one
    requirements = (SPACE_DIR / "requirements.txt").read_text().splitlines()
    assert f"gradio=={gradio.__version__}" in requirements
    assert f"torch=={torch.__version__.split('+')[0]}" in requirements
    assert f"./linzoo-{linzoo.__version__}-py3-none-any.whl" in requirements  # the line the Space plan rewrites
    assert len((SPACE_DIR / "app.py").read_text().splitlines()) < 80  # wiring only


# ------------------------------------------------------------------------------------------ what it loads


def custom_query(models, allowed):
    return space.run_query(models, 256, 0.5, "custom", 0, "raw", HAYSTACK, QUESTION, "code", allowed=allowed)


def test_only_the_owners_models_load(tiny_student_dir, tiny_teacher_dir, tmp_path, marker, monkeypatch):
    foreign = shutil.copytree(tiny_teacher_dir, tmp_path / "foreign")  # code only the repo itself knows
    edit_config(foreign, model_type="evilnet", auto_map=AUTO_MAP)
    plant(foreign, marker)
    student = shutil.copytree(tiny_student_dir, tmp_path / "student")  # a linzoo student whose own code is hostile
    plant(student, marker, ("modeling_linzoo.py", "configuration_linzoo.py"))
    monkeypatch.setenv("LINZOO_SPACE_MODELS", str(student))
    for typed in (str(foreign), str(tiny_student_dir), "/etc", "someone/their-model"):  # not on the owner's list
        with pytest.raises(ValueError, match="is not one of this Space's models"):
            space.run_query([typed], 256, 0.5)
    with pytest.raises(ValueError, match=r"foreign is not loaded: it is a 'evilnet' model; this Space runs linzoo "
                                         r"and llama models only"):
        custom_query([str(foreign)], allowed=[str(foreign)])  # even its owner cannot list one
    _, rows = custom_query([str(student)], allowed=[str(student)])
    assert rows[0][0] == str(student)
    assert type(space.load(str(student))[0]).__module__ == "linzoo.modeling.modeling_linzoo"


def test_concurrent_queries_load_a_model_once_and_answer_as_one_query_alone(tiny_teacher_dir, monkeypatch):
    """Eight queries at once for a model not yet loaded: one load, and each answer what one query alone gets (the
    tiny teacher ties its embeddings, which overlapping loads used to leave untied)."""
    spec = str(tiny_teacher_dir)
    loads = []

    def counted(*args, **kwargs):
        loads.append(args[0])
        return load_model(*args, **kwargs)

    def query():
        return space.run_query([spec], CONTEXT, 0.5, "passkey", 7, allowed=[spec])

    load_model = linzoo.loading.load_model
    monkeypatch.setattr(linzoo.loading, "load_model", counted)
    space._loaded.cache_clear()
    answers = [None] * 8

    def ask(i):
        answers[i] = query()

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(answers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert loads == [spec]
    space._loaded.cache_clear()
    html, (alone,) = query()
    assert len(loads) == 2
    without_seconds = [*alone[:4], *alone[5:]]
    assert all(shown == html and [*row[:4], *row[5:]] == without_seconds for shown, (row,) in answers)
    space._loaded.cache_clear()


def test_oversized_model_is_refused_before_loading(tmp_path, monkeypatch):
    big = tmp_path / "llama-70b"  # a config.json and no weights: loading would fail otherwise
    big.mkdir()
    (big / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 8192, "num_hidden_layers": 80, "vocab_size": 128256,
        "intermediate_size": 28672, "num_attention_heads": 64, "num_key_value_heads": 8,
        "tie_word_embeddings": False}))
    monkeypatch.setattr(space, "load", lambda spec: pytest.fail(f"{spec} was loaded"))
    with pytest.raises(ValueError, match="llama-70b is not loaded: its config implies ~70.6B parameters; this Space "
                                         "loads at most 2B"):
        custom_query([str(big)], allowed=[str(big)])
    (big / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8192}))
    with pytest.raises(ValueError, match="config.json does not say the model's size"):
        custom_query([str(big)], allowed=[str(big)])


def test_approx_parameters_counts_a_llama(tiny_teacher_dir):
    model = LlamaForCausalLM.from_pretrained(tiny_teacher_dir)
    config = json.loads((tiny_teacher_dir / "config.json").read_text())
    norms = sum(p.numel() for name, p in model.named_parameters() if "norm" in name)
    assert space.approx_parameters(config) == sum(p.numel() for p in model.parameters()) - norms
    smollm2_135m = {"hidden_size": 576, "num_hidden_layers": 30, "vocab_size": 49152, "intermediate_size": 1536,
                    "num_attention_heads": 9, "num_key_value_heads": 3, "tie_word_embeddings": True}
    assert round(space.approx_parameters(smollm2_135m) / 1e6, 1) == 134.5


def test_results_view(tmp_path):
    assert space.results_view([tmp_path / "nothing here"]) == ("no results yet", [], *([] for _ in space.result_tables()))
    assert space.results_view([ROOT / "tests"])[0] == "no results yet"


def test_model_rows_say_measured_decoding_or_state_size_and_not_measured(tiny_teacher_dir, tiny_student_dir, tmp_path):
    """The Ask tab's table of the offered models: a folder with a speed.json beside it (eval/speed/, as the main job
    writes it) shows the decode ms/token and state it measured; one without, its state size from config.json at the
    Space's longest context and "not measured"."""
    from linzoo.evals import speed

    measured = shutil.copytree(tiny_student_dir, tmp_path / "measured")
    models = {str(tiny_teacher_dir): linzoo.load_teacher(str(tiny_teacher_dir))[0],
              str(measured): linzoo.load_model(str(measured))[0]}
    results = speed.run_speed(models, "16,32", "1", decode_tokens=2, repeats=1, threads=1, progress=lambda *a: None)
    speed.save_speed(results, measured / "eval" / "speed")
    rows = {r["model"]: r for r in results["rows"] if r["length"] == 32}
    ours, teacher = rows[str(measured)], rows[str(tiny_teacher_dir)]
    size = state_sizes(json.loads((tiny_student_dir / "config.json").read_text()), space.MAX_CONTEXT)
    assert space.model_rows([str(measured), str(tiny_student_dir)]) == [
        [str(measured), f"{format_bytes(ours['state_bytes_per_sequence'])} at 32 tokens (measured)",
         f"{ours['decode_ms_per_token']:.1f} ms/token at 32 tokens, batch 1, on {results['device_name']} (cpu); "
         f"teacher {teacher['decode_ms_per_token']:.1f} ms/token, {ours['ratios']['decode_ms_per_token']:.2f}×"],
        [str(tiny_student_dir), f"{format_bytes(size.fixed)} fixed at {space.MAX_CONTEXT} tokens (from its config)",
         "not measured"]]
    assert space.model_row("embedded")[2] == "not measured"  # no folder beside it to hold a measurement


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
        demo, url = space_screenshot.start_space([spec, "embedded"], [results])
        yield url, spec
        demo.close()


def expected_row(spec, sample, max_new_tokens=None):
    """What the Space must show for `sample`: generated by the same cached model in this process."""
    model, tokenizer = space.load(spec)
    text, correct, _ = niah.answer_one(model, tokenizer, sample, max_new_tokens)
    size = state_sizes(model.config, sample.n_tokens)
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
    assert row[6] == f"{format_bytes(size.recurrent + size.conv)} fixed"
    assert row[7] == format_bytes(size.teacher_kv)
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


def test_client_cannot_name_a_model(served, tiny_teacher_dir):
    url, _ = served
    for typed in (str(tiny_teacher_dir), "someone/their-model"):
        with pytest.raises(Exception, match="not in the list of choices"):
            Client(url, verbose=False).predict([typed], CONTEXT, 0.5, "passkey", 0, "raw", "", "", "", api_name="/ask")


def test_app_refuses_numbers_in_one_line(served):
    """Through Gradio's HTTP API (JSON as Python writes it, NaN and Infinity included): a one-line message each."""
    url, spec = served

    def ask(context_len, depth, seed) -> dict:
        body = json.dumps({"data": [[spec], context_len, depth, "passkey", seed, "raw", "", "", ""]}).encode()
        request = urllib.request.Request(f"{url}gradio_api/call/ask", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request) as response:
            event = json.load(response)["event_id"]
        with urllib.request.urlopen(f"{url}gradio_api/call/ask/{event}") as response:
            kind, data = response.read().decode().strip().splitlines()[:2]
        assert kind == "event: error"
        return json.loads(data.removeprefix("data: "))

    nan, inf = float("nan"), float("inf")
    for args, message in [((nan, 0.5, 0), "Context length (tokens) must be a whole number in 64..4096 on this Space"),
                          ((CONTEXT, nan, 0), "Needle depth must be a number in 0..1 on this Space, got nan."),
                          ((CONTEXT, 0.5, nan), "Seed must be a whole number in 0..4294967295 on this Space, got nan."),
                          ((CONTEXT, 0.5, 1.5), "Seed must be a whole number in 0..4294967295 on this Space, got 1.5."),
                          ((CONTEXT, 0.5, inf), "Value inf is greater than maximum value 4294967295."),  # Gradio's
                          ((inf, 0.5, 0), "Value inf is greater than maximum value 4096.")]:
        assert ask(*args)["error"].startswith(message), args


def test_client_results_tab(served):
    url, _ = served
    note, gallery, recovery, niah_rows, *other_tables = Client(url, verbose=False).predict(api_name="/results")
    assert note.startswith("results files: 1 quality, 1 niah, 0 heads")  # then the other evals' (none)
    assert len(gallery) == 1 and Path(gallery[0]["image"]).stat().st_size > 1000
    assert "tiny-gdn: NIAH passkey, overall 0.50" == gallery[0]["caption"]
    assert recovery["data"][0][:2] == ["tiny-gdn", "embedded"]
    assert "91.5%" in recovery["data"][0] and "77.9%" in recovery["data"][0]  # recovery, a uniform guess's
    assert niah_rows["data"][0][:4] == ["tiny-gdn", "passkey", "raw", "0.500"]


def test_client_models_table(served):
    url, spec = served
    rows = Client(url, verbose=False).predict(api_name="/models")["data"]
    assert [row[0] for row in rows] == [spec, "embedded"]
    assert rows[0] == space.model_row(spec) and rows[0][1].endswith("fixed at 4096 tokens (from its config)")
    assert rows[0][2] == rows[1][2] == "not measured"


def test_browser_runs_a_query_and_shows_the_verdict(served, tmp_path):
    if None in space_screenshot.chromium_paths():
        pytest.skip("chromium / chromedriver not installed (apt-get install -y chromium chromium-driver)")
    url, spec = served
    model, tokenizer = space.load(spec)
    probe = space.custom_sample(tokenizer, HAYSTACK, QUESTION, "unused")
    generated, _, _ = expected_row(spec, probe, space.CUSTOM_MAX_NEW_TOKENS)
    fragment = max(re.findall(r"[A-Za-z0-9]{3,}", generated), key=len)
    driver = space_screenshot.chromium(Path(tempfile.mkdtemp(dir=tmp_path)))
    try:
        passkey = space_screenshot.ask(driver, url, CONTEXT, expect=spec)
        assert spec in passkey and ("correct" in passkey or "wrong" in passkey) and "KiB fixed" in passkey
        assert driver.find_element("css selector", "#haystack mark.needle").text.startswith("The pass key is")
        custom = space_screenshot.ask(driver, url, CONTEXT, custom=(HAYSTACK, QUESTION, fragment), expect=fragment)
        assert space.CORRECT in custom and fragment in custom
        driver.save_screenshot(str(tmp_path / "space.png"))
    finally:
        driver.quit()
    assert (tmp_path / "space.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------------------ the Space repo, installed


def wait_for_page(url: str, process, timeout: float = 300) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"app.py exited with {process.returncode}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.read().decode()
        except OSError:
            time.sleep(1)
    raise AssertionError(f"no page at {url} after {timeout} s")


@pytest.mark.slow
def test_planned_space_installs_from_its_requirements_alone_and_serves(tiny_student_dir, tmp_path):
    """The Space repo exactly as `linzoo push-zoo` would commit it, its requirements.txt installed into a fresh
    venv on its own (as the Hub installs it, before the other files are copied in), then app.py started from
    that venv serves the page and answers a query. The Hub serves the wheel's URL from the Space repo; here the
    same file on disk stands in for it."""
    wheel = plan.build_wheel(tmp_path / "dist")
    # an installed (not editable) linzoo's push-zoo plans the Space from the package's own spaces/niah
    assert {f"linzoo/spaces/niah/{name}" for name in ("app.py", "README.md", "requirements.txt")} <= set(
        zipfile.ZipFile(wheel).namelist())
    planned = plan.plan_space(SPACE_DIR, "tester/linzoo-niah", [str(tiny_student_dir)], {}, wheel)
    assert planned.ok, planned.describe()
    repo = tmp_path / "space-repo"
    for path, content in planned.files:
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_bytes(content if isinstance(content, bytes) else content.read_bytes())
    requirements = (repo / "requirements.txt").read_text()
    url = hf_hub_url("tester/linzoo-niah", wheel.name, repo_type="space")
    assert f"\nlinzoo @ {url}\n" in requirements and (repo / wheel.name).is_file()
    alone = tmp_path / "build" / "requirements.txt"  # nothing else of the repo beside it
    alone.parent.mkdir()
    alone.write_text(requirements.replace(url, (repo / wheel.name).as_uri()))

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    # --retries 0: torch's CPU index is out of reach here (its torch wheel lies on this machine's disk), and pip
    # would retry it for every package.
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", "--retries", "0", "-r", alone.name],
                             cwd=alone.parent, capture_output=True, text=True, timeout=2400)
    assert install.returncode == 0, install.stderr[-4000:]
    versions = subprocess.run([str(python), "-c", "import linzoo, torch, gradio; print(linzoo.__file__, "
                               "torch.__version__, gradio.__version__)"], cwd=repo, capture_output=True, text=True)
    where, torch_version, gradio_version = versions.stdout.split()
    assert where.startswith(str(venv)) and torch_version.endswith("+cpu") and gradio_version == gradio.__version__

    port = space_screenshot.free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port), GRADIO_ANALYTICS_ENABLED="False",
               HF_HUB_OFFLINE="1", LINZOO_SPACE_MODELS=str(tiny_student_dir))
    log = (tmp_path / "app.log").open("w")
    app = subprocess.Popen([str(python), "app.py"], cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        page = wait_for_page(f"http://127.0.0.1:{port}/", app)
        assert "<title>linzoo NIAH</title>" in page or "linzoo NIAH" in page
        _, table = Client(f"http://127.0.0.1:{port}/", verbose=False).predict(
            [str(tiny_student_dir)], CONTEXT, 0.5, "custom", 0, "raw", HAYSTACK, QUESTION, "code", api_name="/ask")
        assert table["data"][0][0] == str(tiny_student_dir) and table["data"][0][3] in (space.CORRECT, space.WRONG)
    finally:
        app.terminate()
        app.wait(timeout=30)
        log.close()
