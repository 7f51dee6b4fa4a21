"""`linzoo card`: the model card of one checkpoint folder, written from what was measured.

    linzoo card runs/my-student                                  # writes runs/my-student/README.md
    linzoo card runs/my-student-sft --repo-id my-org/my-student-instruct --base-model my-org/my-student-base

The front matter is `ModelCardData` (its model-index from the results files of every registered eval in
<folder>/eval/, `linzoo.evals.registry`); the body is `template.md` with each eval's section in its "Results". Lineage, recipe and token counts come from
config.json, linzoo_training.json and trainer_state.json when present. Anything not measured reads
"not measured". Which results files and figures it shows is `files.decide_files`' decision, the one `linzoo push`
uploads by. A folder that linzoo's loaders refuse gets no card.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from linzoo.arguments import ArgumentParser
from linzoo.evals.common import EVAL_DIR
from linzoo.evals.registry import all_evals, get_eval
from linzoo.formatting import NOT_MEASURED, format_bytes, measured
from linzoo.loading import load_model
from linzoo.modeling.configuration_linzoo import state_sizes
from linzoo.modeling.mixers import MIXER_CLASSES

from .files import FileDecision, decide_files, read_json, released_folder, results_path

TEMPLATE = Path(__file__).with_name("template.md")
STAGES = ("base", "instruct", "instruct-distilled")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
STATE_AT_TOKENS = 4096  # context at which the card compares the fixed state with the teacher's KV cache



def matching_results(folder) -> tuple[dict, list[str]]:
    """`results_in(decide_files(folder))`."""
    return results_in(decide_files(folder))


def results_in(decided: list[FileDecision]) -> tuple[dict, list[str]]:
    """({key: its results dict, or None}, [why each results file found was left out]) of a folder's file decisions
    (`decide_files`), for every registered eval: the key is its name for eval/<results file> (present for every eval,
    None where not run or left out), and "<name>/<sub>" for each eval/<sub>/<results file> (a zoo's second run of an
    eval, e.g. NIAH's natural variant in eval/natural)."""
    of_results = {d.path: d for d in decided if d.eval and d.path == results_path(get_eval(d.eval), d.sub)}
    results = {}
    for spec in all_evals():
        top = of_results.get(results_path(spec, ""))
        results[spec.name] = top and top.results
        for d in sorted((d for d in of_results.values() if d.eval == spec.name and d.sub), key=lambda d: d.sub):
            results[f"{spec.name}/{d.sub}"] = d.results
    return results, [f"{d.path} left out: {d.why}" for d in of_results.values() if not d.included]


def results_of(spec, results: dict) -> list[tuple[str, dict | None]]:
    """[(sub, results dict)] of one eval in `matching_results`' dict: eval/ itself ("") first, then each sub-folder
    that holds its results; eval/ itself is left out where it has none and a sub-folder has some."""
    subs = [(key.split("/", 1)[1], data) for key, data in results.items()
            if key.startswith(f"{spec.name}/") and data is not None]
    top = results.get(spec.name)
    return ([("", top)] if top is not None or not subs else []) + subs


def read_results(folder) -> dict:
    """{eval name: its results dict from <folder>/eval/, or None where it was not run or measured another model}."""
    return matching_results(folder)[0]


def eval_results(results: dict) -> list[EvalResult]:
    """The model-index entries of the measured results (the student's own numbers; teacher scores stay in the body)."""
    return [entry for spec in all_evals() for _, data in results_of(spec, results) if data
            for entry in spec.card_results(data)]


def eval_key(result: EvalResult) -> tuple:
    """What identifies one number of a model-index, to compare a card with the results files."""
    return (result.dataset_type, result.dataset_config, result.dataset_split, result.metric_type, result.metric_name,
            result.metric_config)


def checkpoint_info(folder) -> dict:
    """Lineage and training facts of a folder: config.json, linzoo_training.json, trainer_state.json."""
    folder = Path(folder)
    config = read_json(folder / "config.json")
    if config is None:
        raise FileNotFoundError(f"{folder} holds no config.json: not a model folder.")
    training = read_json(folder / "linzoo_training.json") or {}
    check_record(folder, config, training)
    state = read_json(folder / "trainer_state.json") or {}
    return {"config": config, "training": training, "trainer_state": state, "stage": training.get("stage") or "base",
            "teacher": config.get("teacher") or training.get("teacher"), "parent": training.get("parent")}


def check_record(folder, config: dict, training: dict):
    """config.json says what the weights are, linzoo_training.json what the run says it made: a card is built only
    when they agree on what both state (the mixer; a base student's teacher; an instruct stage's teacher is another)."""
    stated = {"mixer": training.get("mixer")}
    if training.get("stage", "base") == "base":
        stated["teacher"] = training.get("teacher")
    differ = [f"{key} {config[key]!r} in config.json, {value!r} in linzoo_training.json"
              for key, value in stated.items() if value is not None and key in config and config[key] != value]
    if differ:
        raise ValueError(f"{folder}: the weights and their record disagree ({'; '.join(differ)}): the record is not "
                         "of these weights. Train again into a new --output_dir (or with --overwrite_output_dir true).")


def is_hub_id(name: str | None) -> bool:
    return bool(name) and bool(HUB_ID.match(name)) and not Path(name).exists()


def default_base_model(info: dict) -> str | None:
    """The teacher for a base student, the parent checkpoint for the instruct stages."""
    return info["teacher"] if info["stage"] == "base" else info["parent"] or info["teacher"]


def hub_base_model(name: str | None) -> str | None:
    """The card's base_model: `name` where it is a Hub id; a local path is none."""
    return name if is_hub_id(name) else None


def _training_rows(info: dict) -> dict:
    training, state = info["training"], info["trainer_state"]
    skip = {"stage", "parent", "teacher", "tokens", "stages", "final_losses", "dataset", "recipe", "first_loss",
            "final_loss", "config_sha256"}  # the config's hash is integrity, not recipe (linzoo.integrity)
    recipe = training.get("recipe") or {k: v for k, v in training.items()
                                        if k not in skip and isinstance(v, (str, int, float, bool, list))}
    tokens = [[name, f"{n:,}" if isinstance(n, int) else str(n)]
              for name, n in (training.get("tokens") or {}).items() if n is not None]
    if state.get("num_input_tokens_seen"):
        tokens.append(["trainer_state.json: tokens seen", f"{state['num_input_tokens_seen']:,}"])
    losses = dict(training.get("final_losses") or {})
    for s in training.get("stages") or []:
        losses.setdefault(s["stage"], s.get("final_loss"))
    if training.get("final_loss") is not None:  # the sft / distill-instruct record: one stage, one loss
        losses.setdefault(info["stage"], training["final_loss"])
    logged = [h["loss"] for h in state.get("log_history", []) if "loss" in h]
    if logged:
        losses.setdefault(f"last logged loss (step {state.get('global_step')})", logged[-1])
    return {"recipe": [[k, json.dumps(v) if isinstance(v, list) else str(v)] for k, v in recipe.items()],
            "tokens": tokens, "losses": [[k, measured(v, "{:.4f}")] for k, v in losses.items()]}


def _params(folder: Path) -> int | None:
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    total = 0
    for path in files:
        with safe_open(str(path), "pt") as f:
            for name in f.keys():
                total += math.prod(f.get_slice(name).get_shape())
    return total if files else None


def build_card(folder, repo_id: str | None = None, base_model: str | None = None) -> ModelCard:
    """The model card of `folder`. `base_model` overrides the recorded teacher/parent (use a Hub id)."""
    folder = Path(folder)
    info = checkpoint_info(folder)
    config, stage, mixer = info["config"], info["stage"], info["config"].get("mixer")
    if mixer not in MIXER_CLASSES:
        raise ValueError(f"{folder}/config.json has mixer {mixer!r}; a linzoo student has one of {list(MIXER_CLASSES)}")
    load_model(str(folder))  # a card describes only what loads: refused in the loader's words (a changed file, a
    # config.json its weights disagree with, non-finite weights or logits)
    decided = decide_files(folder)
    results, _ = results_in(decided)
    base_model = hub_base_model(base_model or default_base_model(info))
    dataset = info["training"].get("dataset")
    name = repo_id or folder.resolve().name
    data = ModelCardData(
        model_name=name,
        license="apache-2.0",
        base_model=base_model,
        base_model_relation="finetune" if base_model else None,
        pipeline_tag="text-generation",
        library_name="transformers",
        datasets=[dataset] if is_hub_id(dataset) else None,
        tags=["linzoo", "linear-attention", mixer, stage, "distillation"],
        eval_results=eval_results(results) or None,
    )
    size = state_sizes(config, STATE_AT_TOKENS)
    with released_folder(folder, decided) as released:  # where the sections find their figures: the released ones
        sections = [spec.card_section(data, released, sub) for spec in all_evals()
                    for sub, data in results_of(spec, results)]
    return ModelCard.from_template(
        data,
        template_path=str(TEMPLATE),
        name=name,
        repo=repo_id or str(folder),
        mixer=mixer,
        mixer_name=MIXER_CLASSES[mixer].title,
        recurrence=MIXER_CLASSES[mixer].recurrence,
        stage=stage,
        lineage=" → ".join(f"**{step} (this model)**" if step == stage else step
                           for step in (info["teacher"] or "teacher", *STAGES)),
        teacher=info["teacher"] or "the teacher (not recorded)",
        parent=info["parent"],
        base=base_model,
        dataset=dataset,
        arch=config,
        attn_choice=info["training"].get("attn_layers_choice"),
        params=_params(folder),
        state=format_bytes(size.fixed),
        teacher_kv=format_bytes(size.teacher_kv),
        state_tokens=STATE_AT_TOKENS,
        **_training_rows(info),
        eval_sections=sections,
        not_measured=NOT_MEASURED,
        not_recorded="not recorded",
    )


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="linzoo card", description="Write <folder>/README.md from measured results.")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--repo-id", help="the Hub repo the card is for (usage snippet and model-index name)")
    parser.add_argument("--base-model", help="Hub id of the parent (default: the recorded teacher / parent)")
    parser.add_argument("--overwrite", action="store_true", help="replace a README.md that linzoo card did not write")
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        raise FileNotFoundError(f"{args.folder} is not a folder: pass the checkpoint folder that `linzoo linearize`, "
                                "`sft` or `distill-instruct` wrote (the one holding config.json)")
    if args.repo_id is not None:
        from .plan import check_repo_id

        check_repo_id(args.repo_id)
    path = args.folder / "README.md"
    if path.is_file() and not args.overwrite and "linzoo" not in (_card_tags(path) or []):
        raise ValueError(f"{path} is not a card linzoo wrote (no 'linzoo' tag): move it aside, or pass --overwrite "
                         "to replace it")
    card = build_card(args.folder, args.repo_id, args.base_model)
    for d in decide_files(args.folder):
        if not d.included and (d.eval or d.path.startswith(f"{EVAL_DIR}/")):
            print(f"linzoo: {d.path} left out: {d.why}")
    card.save(path)
    if card.data.base_model:
        base = card.data.base_model
    elif args.base_model:
        base = f"left out: --base-model {args.base_model!r} is not a Hub id (ORG/NAME)"
    else:
        base = "left out: the recorded parent is not a Hub id, pass --base-model ORG/NAME"
    print(f"linzoo: wrote {path} ({len(card.data.eval_results or [])} eval results; base_model {base})")
    return 0


def _card_tags(path: Path) -> list | None:
    try:
        return ModelCard.load(path).data.tags
    except Exception:  # not a card at all (no or broken front matter): not ours
        return None
