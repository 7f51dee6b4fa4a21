"""A folder is what its files say (issue 33): a config.json that disagrees with its weights is refused in one line,
by `linzoo.load_model` and by `AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)` alike, never
built into another model around them (another mixer scored NIAH 0.00; extra layers started random and still wrote
fluent text). A run's record keeps config.json's sha256, and a folder without tokenizer files says so.
"""

import json
import re
import shutil

import pytest
from transformers import AutoModelForCausalLM

import linzoo
from linzoo.integrity import verify_folder, weights_record
from linzoo.modeling.modeling_linzoo import LinzooForCausalLM, LinzooModel

RESTORE = r": restore the config.json saved with these weights$"


def disagrees(folder, says):
    """The one line's pattern: `<folder>/config.json disagrees with its weights: <says>...: restore ...`."""
    return rf"^{re.escape(str(folder))}/config\.json disagrees with its weights: {says}.*{RESTORE}"


@pytest.fixture(scope="module")
def hybrid_dir(tiny_teacher_dir, tmp_path_factory):
    """A tiny gated_deltanet student that keeps softmax attention in layer 0 of 2 (lm_head tied), with its tokenizer."""
    teacher, tokenizer = linzoo.load_model(str(tiny_teacher_dir))
    folder = tmp_path_factory.mktemp("hybrid") / "student"
    linzoo.linearize(teacher, "gated_deltanet", attn_layers=[0]).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def edited(folder, to, **changes):
    """A copy of `folder` at `to` whose config.json has `changes`."""
    folder = shutil.copytree(folder, to)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


# config.json edits -> what the one line says
DISAGREEING = [
    pytest.param({"mixer": "gla"}, r"the config builds layer 1 with other tensors than the weights hold \(missing "
                 r"model\.layers\.1\.self_attn\.gk_proj\.0\.weight, .* \(3 keys\); unexpected "
                 r"model\.layers\.1\.self_attn\.A_log, .* and 2 more \(5 keys\)\)", id="mixer"),
    pytest.param({"num_hidden_layers": 1}, r"the config builds 1 layer, the weights hold 2 \(unexpected "
                 r"model\.layers\.1\.\* \(\d+ keys\)\)", id="fewer-layers"),
    pytest.param({"num_hidden_layers": 3}, r"the config builds 3 layers, the weights hold 2 \(missing "
                 r"model\.layers\.2\.\* \(\d+ keys\)\)", id="more-layers"),
    pytest.param({"attn_layers": [1]}, r"the config builds layers 0-1 with other tensors than the weights hold "
                 r"\(missing model\.layers\.0\.self_attn\.A_log, .*; unexpected model\.layers\.1\.self_attn\.A_log, ",
                 id="attn-layers"),
]


@pytest.mark.parametrize("changes, says", DISAGREEING)
def test_load_model_refuses_a_config_that_disagrees_with_its_weights(hybrid_dir, tmp_path, changes, says):
    folder = edited(hybrid_dir, tmp_path / "student", **changes)
    with pytest.raises(ValueError, match=disagrees(folder, says)) as err:
        linzoo.load_model(str(folder))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("changes, says", DISAGREEING)
def test_remote_code_refuses_it_too(hybrid_dir, tmp_path, changes, says, request):
    # a folder name of its own per case: transformers caches remote code by the folder's name
    folder = edited(hybrid_dir, tmp_path / f"remote-{request.node.callspec.id}", **changes)
    with pytest.raises(ValueError, match=disagrees(folder, says)):
        AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)


def test_a_teacher_whose_config_disagrees_is_refused(tiny_teacher_dir, tmp_path):
    folder = edited(tiny_teacher_dir, tmp_path / "llama", num_hidden_layers=3)
    with pytest.raises(ValueError, match=disagrees(folder, r"the config builds 3 layers, the weights hold 2 \(missing "
                                                           r"model\.layers\.2\.\* ")):
        linzoo.load_model(str(folder))


def test_a_whole_folder_loads_as_before(hybrid_dir, tiny_teacher_dir, tiny_student_dir):
    """No error, no key reported: tied lm_head (student and teacher) included; `output_loading_info` still answers;
    the body alone leaves an untied head behind."""
    model, _ = linzoo.load_model(str(hybrid_dir))
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert not json.loads((tiny_student_dir / "config.json").read_text())["tie_word_embeddings"]
    assert type(LinzooModel.from_pretrained(tiny_student_dir)).__name__ == "LinzooModel"
    assert type(linzoo.load_model(str(tiny_teacher_dir))[0]).__name__ == "LlamaForCausalLM"
    model, info = AutoModelForCausalLM.from_pretrained(hybrid_dir, trust_remote_code=True, output_loading_info=True)
    assert type(model).__module__.startswith("transformers_modules")
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"]), info


def test_the_optional_null_logit_stays_exempt(hybrid_dir):
    """A student saved without a window, loaded with one: its null logit is declared optional
    (`_keys_to_ignore_on_load_missing`), so it starts at 0 with no error."""
    def remote(folder, **kwargs):
        return AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, **kwargs)

    for load in (LinzooForCausalLM.from_pretrained, remote):
        model, info = load(hybrid_dir, window_size=4, output_loading_info=True)
        assert model.config.window_size == 4
        assert model.model.layers[1].self_attn.memory.null_logit.abs().sum() == 0
        assert not info["missing_keys"], info


def test_other_shapes_are_refused_in_the_same_line_unless_asked_for(hybrid_dir, tmp_path):
    folder = edited(hybrid_dir, tmp_path / "student", vocab_size=500)
    says = (r"the config builds tensors of other shapes than the weights hold "
            r"\(mismatched model\.embed_tokens\.weight: "
            r"model\.embed_tokens\.weight is \[\d+, 32\] in the weights, \[500, 32\] in the config\)")
    with pytest.raises(ValueError, match=disagrees(folder, says)):
        linzoo.load_model(str(folder))
    model = LinzooForCausalLM.from_pretrained(folder, ignore_mismatched_sizes=True)  # transformers' own choice
    assert model.config.vocab_size == 500


def test_the_record_keeps_the_configs_sha256(hybrid_dir, tmp_path, monkeypatch):
    from linzoo.trainers.common import save_with_lineage

    monkeypatch.setenv("LINZOO_CACHE", str(tmp_path / "cache"))
    model, tokenizer = linzoo.load_model(str(hybrid_dir))
    folder = tmp_path / "recorded"
    save_with_lineage(model, tokenizer, folder, "base", "tiny", {})
    record = json.loads((folder / "linzoo_training.json").read_text())
    assert record["config_sha256"] == weights_record(folder)["config_sha256"]
    verify_folder(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    where = re.escape(str(folder))
    says = (rf"^{where}/config\.json is not the file its run saved: its sha256 differs from the one in "
            rf"{where}/linzoo_training\.json; restore it, or, if you changed the config on purpose, delete "
            r"'config_sha256' from that file$")
    with pytest.raises(ValueError, match=says):
        verify_folder(folder)
    with pytest.raises(ValueError, match=says):
        linzoo.load_model(str(folder))
    del record["config_sha256"]  # changed on purpose: the weights still say what they are
    (folder / "linzoo_training.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="the config builds 3 layers, the weights hold 2"):
        linzoo.load_model(str(folder))


def test_a_folder_without_a_tokenizer_says_so(hybrid_dir, tmp_path):
    folder = shutil.copytree(hybrid_dir, tmp_path / "student")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    with pytest.raises(FileNotFoundError, match=rf"^{re.escape(str(folder))} holds no tokenizer \(tokenizer\.json / "
                                                r"tokenizer_config\.json\): copy the tokenizer files saved with the "
                                                r"model into it$"):
        linzoo.load_model(str(folder))
