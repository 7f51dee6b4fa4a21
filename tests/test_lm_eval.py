"""lm-eval-harness scores linzoo's zero-shot tasks: its numbers equal those of linzoo's own scoring code before lm-eval
took over (recorded below), a saved student runs under lm-eval's `hf` model with trust_remote_code=True on the
local task YAMLs, and `HUB` names the datasets of lm-eval's own tasks."""

import json
from pathlib import Path

import lm_eval
import pytest
import torch
from lm_eval.tasks import TaskManager
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

import linzoo
from linzoo.evals import quality

CORPUS = ["Question: Which gas do plants take in to make food?\nAnswer: carbon dioxide",
          "The river watched the garden before the mountain was quiet again.",
          "Sarah was a much better surgeon than Maria so Maria always got the harder cases.",
          "How do I keep bread fresh? Seal it in a bag, and the water will not dry it out."] * 4

# The first 50 documents of each task in ../shared/data/eval scored by `tiny_student` with linzoo's own scoring code
# (quality.score_task / loglikelihoods, commit a218f9d), before lm-eval did the scoring:
# task: (acc, acc_norm, chance, the choice acc makes per document (LAMBADA: greedy hit), acc_norm's choice,
#        the sum of all requests' log-likelihoods, the documents' sha256)
RECORDED = {
    "lambada_openai": (0.0, None, 0.0, "00000000000000000000000000000000000000000000000000",
                       None, -1705.440, "a75dce83dd90e759"),
    "winogrande": (0.46, None, 0.5, "01011101111111110100110101010000001010000000000000",
                   None, -12070.097, "d62e624bc0115e47"),
    "arc_easy": (0.28, 0.34, 0.25, "23031000200032210110300001012330000321132002100020",
                 "21031000300331223021300321010302032321102002100132", -23909.580, "79efa5b041bf6c6d"),
    "arc_challenge": (0.16, 0.18, 0.25, "01300301002330300030123100011300301000003010000000",
                      "03101300132130301230113112211310131113303222022302", -28077.018, "b4b86ac665cf601b"),
    "piqa": (0.46, 0.4, 0.5, "10100111111011011011101110100101110100100111111001",
             "11010100111001101000110011000100110110000001101001", -41941.455, "712550ae5a40769c"),
}

# Hand-made docs in the llm-foundry formats (piqa queries end in whitespace there, as here).
DOCS = {
    "arc_easy": [
        {"query": "Question: Which gas do plants take in to make food?", "choices": ["oxygen", "carbon dioxide",
         "nitrogen", "helium"], "gold": 1},
        {"query": "Question: What is the boiling point of water at sea level?", "choices": ["50 C", "100 C"],
         "gold": 1},
        {"query": "Question: Which tool measures mass?", "choices": ["a balance", "a ruler", "a clock"], "gold": 0},
    ],
    "arc_challenge": [
        {"query": "Question: Which is a mammal?", "choices": ["a trout", "a whale", "a frog", "a hawk"], "gold": 1},
        {"query": "Question: What makes rain?", "choices": ["clouds", "rocks", "sand", "ice"], "gold": 0},
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


def tiny_student():
    """A random 2-layer Llama linearized into gated_deltanet, with a byte-level BPE tokenizer: deterministic."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<eos>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    torch.manual_seed(0)
    teacher = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, initializer_range=0.2,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)).eval()
    return linzoo.linearize(teacher, "gated_deltanet").eval(), tokenizer


def test_lm_eval_scores_real_tasks_as_linzoo_did(eval_data_dir):
    model, tokenizer = tiny_student()
    tasks = quality.load_tasks(quality.TASKS, eval_data_dir)
    docs = {task: quality.task_docs(task, obj, 50) for task, obj in tasks.items()}
    output = quality.run_lm_eval(model, tokenizer, tasks, 50, batch_size=8, log_samples=True)
    for task, obj in tasks.items():
        acc, acc_norm, chance, choices, norm_choices, ll_sum, sha = RECORDED[task]
        samples = sorted(output["samples"][obj.task_name], key=lambda s: s["doc_id"])
        lls = [[resp[0][0] for resp in s["resps"]] for s in samples]
        if task == "lambada_openai":  # one request per doc: acc is whether greedy decoding yields the word
            assert "".join(str(int(s["resps"][0][0][1])) for s in samples) == choices
        else:
            assert "".join(str(max(range(len(x)), key=x.__getitem__)) for x in lls) == choices, task
        gold = [doc.get("gold") for doc in docs[task]]
        if norm_choices:  # acc_norm's choice, seen through whether it is right
            assert [s["acc_norm"] for s in samples] == [float(int(c) == g) for c, g in zip(norm_choices, gold)], task
        assert sum(map(sum, lls)) == pytest.approx(ll_sum, abs=0.05), task
        assert quality.docs_fingerprint(docs[task]).startswith(sha), task
        scores = quality.task_scores(output, obj, docs[task])
        assert {k: scores.get(k) for k in ("acc", "acc_norm", "n", "chance")} == {
            "acc": pytest.approx(acc), "acc_norm": acc_norm and pytest.approx(acc_norm), "n": 50, "chance": chance}


def test_saved_student_under_lm_evals_hf_model_equals_linzoo_eval_quality(tmp_path):
    model, tokenizer = tiny_student()
    model.save_pretrained(tmp_path / "student")
    tokenizer.save_pretrained(tmp_path / "student")
    for task, docs in DOCS.items():
        (tmp_path / f"{task}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    # what `lm_eval --model hf --model_args pretrained=...,trust_remote_code=True --include_path evals/lm_eval_tasks
    # --tasks linzoo_local --metadata '{"data_dir": ...}'` runs (evals/LM_EVAL.md)
    manager = TaskManager(include_path=str(quality.TASKS_DIR), include_defaults=False,
                          metadata={"data_dir": str(tmp_path)})
    cli = lm_eval.simple_evaluate(
        model="hf", model_args=f"pretrained={tmp_path / 'student'},trust_remote_code=True,dtype=float32,device=cpu",
        tasks=["linzoo_local"], task_manager=manager, batch_size=4, bootstrap_iters=0)
    ours = quality.evaluate_quality(*linzoo.load_model(str(tmp_path / "student")), data_dir=tmp_path, batch_size=4,
                                    heldout_tokens=0)
    assert list(ours["tasks"]) == list(quality.TASKS)
    for task, scores in ours["tasks"].items():
        row = cli["results"][quality.local_task(task)]
        assert row["sample_len"] == scores["n"] == len(DOCS[task])
        for metric in ("acc", "acc_norm"):
            assert (metric in scores) == (f"{metric},none" in row), task
            if metric in scores:
                assert scores[metric] == row[f"{metric},none"], task
    assert cli["results"][quality.local_task("lambada_openai")]["perplexity,none"] > 1.0


def test_hub_names_the_datasets_of_lm_evals_own_tasks():
    folders = {"lambada_openai": "lambada", "winogrande": "winogrande", "arc_easy": "arc", "arc_challenge": "arc",
               "piqa": "piqa"}  # where lm-eval keeps them: indexing only these takes no time
    root = Path(lm_eval.__file__).parent / "tasks"
    index = TaskManager(include_path=[str(root / f) for f in set(folders.values())], include_defaults=False).task_index
    for task, (path, name, split) in quality.HUB.items():
        cfg = index[task].cfg
        assert (cfg["dataset_path"], cfg.get("dataset_name"), cfg.get("test_split") or cfg["validation_split"]) == (
            path, name, split), task
