"""`linzoo push-zoo`: every mixer's released folders found under <root>/<mixer>/<folder> (`RELEASED`: the three
stages, and the paper's pure student `base-pure`), the NIAH Space and a Hub collection holding them. A dry run (the
plan of every repo, no network) unless --execute.

    linzoo push-zoo runs/zoo --org my-org                # the plan; missing checkpoints are listed
    linzoo push-zoo runs/zoo --org my-org --execute      # after `hf auth login`

Repos: <org>/linzoo-<mixer>-<stage> (underscores as dashes) and the Space <org>/linzoo-niah, which gets
every eval/ folder under results/<mixer>/<stage>/, lists the checkpoints (plus the teacher) in its
README and $LINZOO_SPACE_MODELS (the only models it offers), and carries linzoo's wheel (built from this
checkout unless --wheel names one) for its requirements.txt to install. An instruct stage's base_model is its
recorded parent when that is a Hub id or one of the zoo's folders, else the nearest earlier stage of the same
mixer (said so in the plan).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from linzoo import MIXERS
from linzoo.arguments import ArgumentParser
from linzoo.evals.common import EVAL_DIR
from linzoo.spaces import niah

from .card import STAGES, checkpoint_info, is_hub_id
from .plan import (ReleaseError, add_existing_repo_flags, build_wheel, hub_error, hub_token, plan_checkpoint,
                   plan_space, repo_exists, upload)

SPACE_NAME = "linzoo-niah"
SPACE_DIR = Path(niah.__file__).parent  # a checkout's spaces/niah (the wheel carries its Python only)
COLLECTION_TITLE = "linzoo: linearized SmolLM2 students"


# The folders of a zoo (`linzoo zoo`) that are released: the stages, and the pure student (every layer linear, the
# paper's), which is a base student too (its card says so; its base_model is the teacher).
RELEASED = ("base", "base-pure", *STAGES[1:])


def repo_name(org: str, mixer: str, stage: str) -> str:
    return f"{org}/linzoo-{mixer.replace('_', '-')}-{stage}"


def find_zoo(root) -> tuple[dict[tuple[str, str], Path], list[tuple[str, str]]]:
    """({(mixer, stage): folder} of the checkpoints present, [(mixer, stage)] of those missing)."""
    found, missing = {}, []
    for mixer in MIXERS:
        for stage in RELEASED:
            folder = Path(root) / mixer / stage
            if (folder / "config.json").is_file():
                found[mixer, stage] = folder
            else:
                missing.append((mixer, stage))
    return found, missing


def base_models(found: dict, org: str, teacher: str | None = None) -> dict[tuple[str, str], tuple]:
    """(base_model override or None for the recorded one, a note when it is assumed) per checkpoint; `teacher`
    (--base-model) is every base student's."""
    by_path = {folder.resolve(): key for key, folder in found.items()}
    out = {}
    for (mixer, stage), folder in found.items():
        parent = checkpoint_info(folder)["parent"]
        if stage in ("base", "base-pure"):
            out[mixer, stage] = (teacher, None)
        elif is_hub_id(parent):
            out[mixer, stage] = (None, None)
        elif parent and Path(parent).resolve() in by_path:
            out[mixer, stage] = (repo_name(org, *by_path[Path(parent).resolve()]), None)
        else:
            earlier = [s for s in STAGES[:STAGES.index(stage)] if (mixer, s) in found]  # never base-pure
            guess = repo_name(org, mixer, earlier[-1]) if earlier else None
            out[mixer, stage] = (guess, f"recorded parent {parent!r} is not in the zoo; assumed {guess}"
                                 if guess else None)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="linzoo push-zoo", description="Upload the whole zoo, its Space and a "
                                                                         "collection (dry run unless --execute).")
    parser.add_argument("root", type=Path, help="folder holding <mixer>/<stage> checkpoint folders")
    parser.add_argument("--org", required=True, help="Hub user or organisation")
    parser.add_argument("--execute", action="store_true", help="really upload (default: print the plan only)")
    parser.add_argument("--private", action="store_true", help="create the repos and the collection private")
    parser.add_argument("--space-dir", type=Path, default=SPACE_DIR, help="the Space folder (default: %(default)s)")
    parser.add_argument("--wheel", type=Path, help="the linzoo wheel the Space installs (default: one built from "
                                                   "this checkout)")
    parser.add_argument("--base-model", help="Hub id of the teacher the base students were linearized from "
                                             "(default: each one's recorded teacher)")
    add_existing_repo_flags(parser, "existing repos")
    args = parser.parse_args(argv)
    if args.wheel is not None and not args.wheel.is_file():
        raise ReleaseError(f"--wheel {args.wheel} is not a file: build one (pip wheel --no-deps -w dist .) or leave "
                           "--wheel out to build it from this checkout")
    if not (args.space_dir / "README.md").is_file() or not (args.space_dir / "app.py").is_file():
        raise ReleaseError(f"--space-dir {args.space_dir} holds no Space (README.md and app.py): pass linzoo's "
                           f"spaces/niah or leave --space-dir out ({SPACE_DIR})")
    with tempfile.TemporaryDirectory() as tmp:  # where the wheel is built; it lives until the upload is done
        return push_zoo(args, Path(tmp))  # a ReleaseError reaches the CLI: one line, exit 2


def push_zoo(args, workdir: Path) -> int:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    token = hub_token() if args.execute else None  # before the slow checks
    found, missing = find_zoo(args.root)
    if not found:
        raise ReleaseError(f"no checkpoint under {args.root}/<mixer>/<folder> (mixers {', '.join(MIXERS)}; "
                           f"folders {', '.join(RELEASED)}).")
    print(("" if args.execute else "DRY RUN, nothing is sent\n") +
          f"zoo {args.root}: {len(found)} of {len(MIXERS) * len(RELEASED)} checkpoints found")
    for (mixer, stage), folder in found.items():  # the folder's name becomes the repo's: it must be the weights'
        held = checkpoint_info(folder)["config"].get("mixer")
        if held is not None and held != mixer:
            raise ReleaseError(f"{folder} holds a {held} student, not {mixer}: it would be uploaded as "
                               f"{repo_name(args.org, mixer, stage)}. Move it to {args.root / held / stage}.")
    bases = base_models(found, args.org, args.base_model)
    plans = []
    for (mixer, stage), folder in found.items():
        override, note = bases[mixer, stage]
        plan = plan_checkpoint(folder, repo_name(args.org, mixer, stage), args.private, base_model=override)
        plan.notes += [note] if note else []
        plans.append(plan)
    wheel = args.wheel or build_wheel(workdir)
    teachers = sorted({t for f in found.values() if is_hub_id(t := checkpoint_info(f)["teacher"])})
    space = plan_space(args.space_dir, f"{args.org}/{SPACE_NAME}", [p.repo_id for p in plans] + teachers,
                       {f"{m}/{s}": folder / EVAL_DIR for (m, s), folder in found.items()}, wheel, args.private)
    plans.append(space)
    for plan in plans:
        print("\n" + plan.describe(args.overwrite, args.create_pr))
    print("\nmissing (not uploaded): " + (", ".join(f"{m}/{s}" for m, s in missing) or "none"))
    print(f"collection {COLLECTION_TITLE!r} in {args.org}: {len(plans)} items "
          f"({len(plans) - 1} models and the Space {space.repo_id})")
    failed = [p.repo_id for p in plans if not p.ok]
    if failed:
        raise ReleaseError(f"checks failed for {', '.join(failed)}; nothing was uploaded.")
    if not args.execute:
        print("\ndry run: all checks pass. Run again with --execute to upload.")
        return 0

    api = HfApi(token=token)
    exists = {p.repo_id: repo_exists(api, p.repo_id, p.repo_type, args.overwrite, args.create_pr) for p in plans}
    try:
        for plan in plans:
            print(f"linzoo: {plan.repo_id} -> {upload(api, plan, exists[plan.repo_id], args.create_pr)}")
        collection = api.create_collection(COLLECTION_TITLE, namespace=args.org, private=args.private, exists_ok=True,
                                           description=f"{len(MIXERS)} linear mixers as base, base-pure, instruct and "
                                                       "instruct-distilled students, and a NIAH Space.")
        for plan in plans:
            api.add_collection_item(collection.slug, plan.repo_id, plan.repo_type, exists_ok=True)
    except HfHubHTTPError as err:
        raise hub_error(err, "uploading the zoo") from None
    print(f"linzoo: collection {collection.url}")
    return 0
