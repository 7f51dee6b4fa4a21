"""lm-eval-harness compatibility: a saved linzoo student runs under lm-eval's `hf` model with
trust_remote_code=True on the local tasks in evals/lm_eval_tasks, and lm-eval sends the same requests
and gets the same log-likelihoods as `linzoo eval quality` (linzoo.evals.quality)."""

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

TASKS_DIR = Path(__file__).resolve().parents[1] / "evals" / "lm_eval_tasks"
LOCAL = {t: f"linzoo_{t}_local" for t in ("lambada_openai", "winogrande", "arc_easy", "arc_challenge", "piqa")}

# Hand-made docs in the llm-foundry JSONL formats (piqa queries end in "\n" there, as here).
DOCS = {
    "arc_easy": [
        {"query": "Question: Which gas do plants take in to make food?", "choices": ["oxygen", "carbon dioxide",
         "nitrogen", "helium"], "gold": 1},
        {"query": "Question: What is the boiling point of water at sea level?", "choices": ["50 C", "100 C"],
         "gold": 1},
        {"query": "Question: Which tool measures mass?", "choices": ["a balance", "a ruler", "a clock"], "gold": 0},
    ],
    "piqa": [
        {"query": "Question: How do I keep bread fresh?\n", "choices": ["Seal it in a bag.", "Leave it in the sun."],
         "gold": 0},
        {"query": "Question: To dry wet shoes,  \n", "choices": ["fill them with newspaper.", "put them in water."],
         "gold": 0},
    ],
    "winogrande": [
        {"context_options": ["The cup fell off the table because the cup",
                             "The cup fell off the table because the table"],
         "continuation": "was tilted too far.", "gold": 1},
        {"context_options": ["Anna lent Beth a pen since Anna", "Anna lent Beth a pen since Beth"],
         "continuation": " had forgotten hers. ", "gold": 1},
    ],
    "lambada_openai": [
        {"context": "She opened the door and the dog ran out into the", "continuation": "garden"},
        {"context": "He put the key back in his", "continuation": "pocket"},
    ],
}


def _load_task_utils():
    spec = importlib.util.spec_from_file_location("linzoo_lm_eval_task_utils", TASKS_DIR / "utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_data_file_resolution_order(tmp_path, monkeypatch):
    utils = _load_task_utils()
    monkeypatch.delenv(utils.ENV, raising=False)
    sample = utils.resolve_data_file("arc_easy")
    assert sample == TASKS_DIR / "arc_easy_sample.jsonl"
    assert len(sample.read_text().splitlines()) == 50
    with pytest.raises(FileNotFoundError, match="data_dir"):
        utils.resolve_data_file("piqa")  # no sample ships for piqa
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "arc_easy.jsonl").write_text("{}\n")
    (tmp_path / "arc_easy.jsonl").write_text("{}\n")
    (tmp_path / "meta.jsonl").write_text("{}\n")
    monkeypatch.setenv(utils.ENV, str(tmp_path / "env"))
    assert utils.resolve_data_file("arc_easy") == tmp_path / "env" / "arc_easy.jsonl"
    assert utils.resolve_data_file("arc_easy", data_dir=str(tmp_path)) == tmp_path / "arc_easy.jsonl"
    assert utils.resolve_data_file("arc_easy", data_files=str(tmp_path / "meta.jsonl")) == tmp_path / "meta.jsonl"
    with pytest.raises(FileNotFoundError, match="no such file"):
        utils.resolve_data_file("piqa")  # $LINZOO_EVAL_DATA has no piqa.jsonl


def _byte_bpe(corpus):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<eos>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory):
    """A saved tiny gated_deltanet student (random tiny Llama teacher) with its byte-level BPE tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import linzoo

    corpus = (TASKS_DIR / "arc_easy_sample.jsonl").read_text().splitlines()
    tokenizer = _byte_bpe(corpus)
    torch.manual_seed(0)
    teacher = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id)).eval()
    student = linzoo.linearize(teacher, "gated_deltanet")
    out = tmp_path_factory.mktemp("lm_eval_student")
    student.save_pretrained(out)
    tokenizer.save_pretrained(out)
    assert (out / "modeling_linzoo.py").is_file() and "auto_map" in json.loads((out / "config.json").read_text())
    return out


def _simple_evaluate(student_dir, tasks, limit=None, metadata=None):
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    # include_defaults=False skips indexing lm-eval's thousands of built-in task YAMLs (most of a minute here)
    task_manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False, metadata=metadata)
    return lm_eval.simple_evaluate(
        model="hf", model_args=f"pretrained={student_dir},trust_remote_code=True,dtype=float32,device=cpu",
        tasks=tasks, task_manager=task_manager, limit=limit, batch_size=4, log_samples=True)


def _same_as_linzoo(student_dir, results, docs_by_task):
    """lm-eval's requests equal quality.task_requests and its log-likelihoods equal quality.loglikelihoods."""
    import linzoo
    from linzoo.evals import quality

    model, tokenizer = linzoo.load_model(str(student_dir))
    for task, docs in docs_by_task.items():
        samples = sorted(results["samples"][LOCAL[task]], key=lambda s: s["doc_id"])
        assert len(samples) == len(docs)
        for sample, doc in zip(samples, docs):
            requests = quality.task_requests(task, doc)
            assert [tuple(a) for a in sample["arguments"]] == requests, task
            ours = quality.loglikelihoods(model, tokenizer, requests, batch_size=4)
            theirs = [resp[0] for resp in sample["resps"]]
            for (ll, greedy), (their_ll, their_greedy) in zip(ours, theirs):
                assert math.isclose(ll, their_ll, rel_tol=1e-4, abs_tol=1e-3), (task, ll, their_ll)
                assert greedy == bool(their_greedy), task
        scores = quality.score_task(model, tokenizer, task, docs, batch_size=4)
        for metric in ("acc", "acc_norm"):
            if metric in scores:
                assert results["results"][LOCAL[task]][f"{metric},none"] == pytest.approx(scores[metric]), task


def test_hf_trust_remote_code_on_shipped_arc_easy_sample(student_dir):
    pytest.importorskip("lm_eval")
    results = _simple_evaluate(student_dir, [LOCAL["arc_easy"]], limit=10)
    row = results["results"][LOCAL["arc_easy"]]
    assert row["sample_len"] == 10
    for metric in ("acc,none", "acc_norm,none"):
        assert isinstance(row[metric], float) and 0.0 <= row[metric] <= 1.0
    docs = [json.loads(line) for line in (TASKS_DIR / "arc_easy_sample.jsonl").read_text().splitlines()[:10]]
    _same_as_linzoo(student_dir, results, {"arc_easy": docs})


def test_all_local_tasks_from_a_data_dir_match_linzoo(student_dir, tmp_path):
    pytest.importorskip("lm_eval")
    for task, docs in DOCS.items():
        (tmp_path / f"{task}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    results = _simple_evaluate(student_dir, [LOCAL[t] for t in DOCS], metadata={"data_dir": str(tmp_path)})
    for task, docs in DOCS.items():
        row = results["results"][LOCAL[task]]
        assert row["sample_len"] == len(docs)  # read from data_dir, not the shipped 50-doc sample
        assert 0.0 <= row["acc,none"] <= 1.0
    assert results["results"][LOCAL["lambada_openai"]]["perplexity,none"] > 1.0
    _same_as_linzoo(student_dir, results, DOCS)
