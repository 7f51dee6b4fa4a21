"""`linzoo.load_model` runs no checkpoint's own Python unless asked: a linzoo student loads through the installed
linzoo, a Llama through transformers, and a repo that needs its own code only with `trust_remote_code=True`.

Each hostile folder ships modeling/configuration files that write a marker file when Python imports them: the
marker must never appear, except in the one control that passes the flag (which shows the code would run).

Loads from several threads at once give the same whole models as one load alone.
"""

import json
import shutil
import threading

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, HfArgumentParser

import linzoo
from linzoo.evals import niah
from linzoo.loading import read_config

AUTO_MAP = {"AutoConfig": "configuration_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}


def plant(folder, marker, names=("configuration_evil.py", "modeling_evil.py")):
    """Python files in `folder` that create `marker` when imported."""
    for name in names:
        (folder / name).write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")


def edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


@pytest.fixture
def marker(tmp_path):
    path = tmp_path / "remote code ran"
    yield path
    assert not path.exists(), "a checkpoint's own code ran"


def test_a_student_loads_through_the_installed_linzoo(tiny_student_dir, tmp_path, marker):
    folder = shutil.copytree(tiny_student_dir, tmp_path / "student")
    plant(folder, marker, ("modeling_linzoo.py", "configuration_linzoo.py"))  # its remote code, replaced
    model, tokenizer = linzoo.load_model(str(folder))
    assert type(model).__module__ == "linzoo.modeling.modeling_linzoo" and model.config.model_type == "linzoo"
    reference, _ = linzoo.load_model(str(tiny_student_dir))
    ids = tokenizer("The pass key is", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)


def test_transformers_own_remote_code_path_still_loads_a_student(tiny_student_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_student_dir, trust_remote_code=True)
    assert type(model).__module__.startswith("transformers_modules")


def test_a_llama_loads_through_transformers_whatever_its_auto_map(tiny_teacher_dir, tmp_path, marker):
    folder = shutil.copytree(tiny_teacher_dir, tmp_path / "llama")
    edit_config(folder, auto_map=AUTO_MAP)
    plant(folder, marker)
    model, _ = linzoo.load_model(str(folder))
    assert type(model).__module__ == "transformers.models.llama.modeling_llama"


@pytest.fixture
def foreign(tiny_teacher_dir, tmp_path, marker):
    """A repo whose model type only its own code knows."""
    folder = shutil.copytree(tiny_teacher_dir, tmp_path / "foreign")
    edit_config(folder, model_type="evilnet", auto_map=AUTO_MAP)
    plant(folder, marker)
    return folder


def test_foreign_code_needs_trust_remote_code(foreign, marker):
    with pytest.raises(ValueError, match=r"'evilnet' model.*trust_remote_code=True \(--trust_remote_code\)"):
        linzoo.load_model(str(foreign))
    with pytest.raises(ValueError, match="trust_remote_code"):
        linzoo.load_teacher(str(foreign))
    with pytest.raises(ValueError, match="trust_remote_code"):
        niah.main(["--model", str(foreign), "--lengths", "128", "--device", "cpu"])  # the eval CLIs' --model


def test_the_flag_runs_it(foreign, marker):
    """The control: with trust_remote_code=True the planted code does run (it defines no model, so loading fails)."""
    with pytest.raises(Exception):  # whatever transformers makes of a module without the class
        linzoo.load_model(str(foreign), trust_remote_code=True)
    assert marker.read_text() == "ran"
    marker.unlink()


def test_eval_clis_take_trust_remote_code():
    parser = HfArgumentParser(niah.NiahArguments)
    assert parser.parse_args_into_dataclasses(args=[])[0].trust_remote_code is False
    assert parser.parse_args_into_dataclasses(args=["--trust_remote_code"])[0].trust_remote_code is True


def test_safetensors_only_refuses_pickled_weights(tiny_teacher_dir, tmp_path):
    folder = shutil.copytree(tiny_teacher_dir, tmp_path / "pickled")
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    assert type(linzoo.load_model(str(folder))[0]).__name__ == "LlamaForCausalLM"  # a user's own folder: allowed
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        linzoo.load_model(str(folder), safetensors_only=True)


def test_read_config_runs_nothing(foreign, marker):
    assert read_config(str(foreign))["model_type"] == "evilnet"


# ---------------------------------------------------------------------------------------- integrity


@pytest.fixture
def recorded(tiny_student_dir, tmp_path, monkeypatch):
    """A copy of the tiny student saved as a run saves it: with the weights' sha256 in linzoo_training.json."""
    from linzoo.trainers.common import save_with_lineage

    monkeypatch.setenv("LINZOO_CACHE", str(tmp_path / "cache"))
    model, tokenizer = linzoo.load_model(str(tiny_student_dir))
    save_with_lineage(model, tokenizer, tmp_path / "recorded", "base", "tiny", {})
    return tmp_path / "recorded"


def scribble(path, size, at=0.5):
    """Overwrite `size` random bytes in the middle of a file (its header intact)."""
    import os

    with open(path, "r+b") as f:
        f.seek(int(path.stat().st_size * at) - size // 2)
        f.write(os.urandom(size))


def test_a_run_records_its_weights_and_a_changed_file_is_named(recorded):
    from linzoo.integrity import file_sha256

    record = json.loads((recorded / "linzoo_training.json").read_text())
    assert record["weights_sha256"] == {"model.safetensors": file_sha256(recorded / "model.safetensors")}
    linzoo.load_model(str(recorded))  # hashes once and remembers this state of the file
    scribble(recorded / "model.safetensors", 4096)  # the header still parses: only the digest can tell
    with pytest.raises(ValueError, match=r"recorded/model.safetensors is not the file its run saved.*"
                                         r"linzoo_training.json.*copy it again"):
        linzoo.load_model(str(recorded))


def test_truncated_weights_or_json_name_the_file(tiny_student_dir, tmp_path):
    folder = shutil.copytree(tiny_student_dir, tmp_path / "student")
    weights = folder / "model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    with pytest.raises(ValueError, match=r"student/model.safetensors is not a readable safetensors file.*truncated"):
        linzoo.load_model(str(folder))
    folder = shutil.copytree(tiny_student_dir, tmp_path / "student2")
    (folder / "tokenizer.json").write_text((folder / "tokenizer.json").read_text()[:1000])
    with pytest.raises(ValueError, match=r"student2/tokenizer.json is not valid JSON"):
        linzoo.load_model(str(folder))


def test_folders_without_a_record_load_as_before(tiny_teacher_dir, tiny_student_dir):
    assert not (tiny_teacher_dir / "linzoo_training.json").exists()
    assert type(linzoo.load_model(str(tiny_teacher_dir))[0]).__name__ == "LlamaForCausalLM"
    assert linzoo.load_model(str(tiny_student_dir))[0].config.model_type == "linzoo"


def test_loads_in_threads_give_whole_tied_models(tiny_teacher_dir, tiny_student_dir):
    """transformers' from_pretrained swaps process-wide state while it builds a model: loads that overlap used to
    leave lm_head untied or on the meta device (the tiny teacher ties its embeddings; the student does not)."""
    for folder in (tiny_teacher_dir, tiny_student_dir):
        reference, _ = linzoo.load_model(str(folder))
        models = [None] * 6

        def load(i, folder=folder):
            models[i] = linzoo.load_model(str(folder))[0]

        threads = [threading.Thread(target=load, args=(i,)) for i in range(len(models))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for model in models + [linzoo.load_model(str(folder))[0]]:  # and a load after them
            assert not any(t.is_meta for t in model.state_dict().values())
            tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
            assert tied == model.config.tie_word_embeddings == (folder == tiny_teacher_dir)
            assert model.state_dict().keys() == reference.state_dict().keys()
            assert all(torch.equal(t, reference.state_dict()[k]) for k, t in model.state_dict().items())


def test_the_embedded_teachers_tokenizer_knows_its_context_and_a_saved_student_keeps_it(embedded_teacher, tmp_path):
    """The GGUF's tokenizer came with transformers' 'unset' model_max_length (1e30), which students saved beside it
    carried: truncation and the context checks of users' code had no limit to go by."""
    from transformers import AutoTokenizer

    teacher, tokenizer = embedded_teacher
    assert tokenizer.model_max_length == teacher.config.max_position_embeddings == 8192
    tokenizer.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path).model_max_length == 8192
