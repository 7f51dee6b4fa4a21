"""What `linzoo push` and `linzoo push-zoo` upload, the checks that must pass first, and the upload itself.

A plan is a valid repo id plus the exact files (path in repo, size) of one commit. Before anything is sent,
a checkpoint must (1) hold no Python but linzoo's own modeling files, byte for byte, so that (2) loading it with
`trust_remote_code` in a fresh Python process runs only linzoo's code, (3) hold safetensors weights, no pickle
files, each weights file intact and equal to the sha256 in its lineage record, and (4) get a card whose
model-index numbers, read back from its YAML, equal the results files'. The Space's plan carries linzoo's own
wheel, built from this checkout, which its requirements.txt installs. The dry run prints all of it and touches no
network.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub import CommitOperationAdd, CommitOperationDelete, ModelCard, SpaceCard

from linzoo import __version__ as linzoo_version
from linzoo import modeling as linzoo_modeling
from linzoo.evals.common import EVAL_DIR, NOT_MEASURED
from linzoo.evals.registry import all_evals
from linzoo.integrity import LINEAGE_FILE, recorded_digests, verify_folder

from .card import (build_card, checkpoint_info, default_base_model, eval_key, eval_results, hub_base_model,
                   matching_results, results_of)
from .files import FileDecision, decide_files, read_json

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib")
LOGIN_HOW = "log in once with `hf auth login` (or set the HF_TOKEN environment variable to a token with write access)"
LOGIN_HELP = f"No Hugging Face token found: {LOGIN_HOW}, then run the command again."
SPACE_WHEEL_LINE = re.compile(r"\./linzoo-\S+\.whl")  # the requirements.txt line plan_space points at the wheel


def add_existing_repo_flags(parser, what: str = "an existing repo") -> None:
    """--overwrite / --create-pr, mutually exclusive: what to do when the target repo already exists."""
    existing = parser.add_mutually_exclusive_group()
    existing.add_argument("--overwrite", action="store_true", help=f"replace the files of {what}")
    existing.add_argument("--create-pr", action="store_true", help=f"send the files to {what} as a PR")


class ReleaseError(Exception):
    """A reason to stop before (or instead of) uploading, worded for the person at the terminal."""


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


@dataclass
class RepoPlan:
    repo_id: str
    repo_type: str  # "model" | "space"
    source: Path
    files: list[tuple[str, Path | bytes]]  # (path in repo, local file or generated content)
    front_matter: str
    private: bool = False
    revision: str | None = None
    left_out: list[FileDecision] = field(default_factory=list)  # of the source folder, with why (`decide_files`)
    checks: list[Check] = field(default_factory=list)
    variables: dict[str, str] = field(default_factory=dict)  # Space variables
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def size(self, content: Path | bytes) -> int:
        return len(content) if isinstance(content, bytes) else content.stat().st_size

    def operations(self) -> list[CommitOperationAdd]:
        return [CommitOperationAdd(path_in_repo=path, path_or_fileobj=content if isinstance(content, bytes) else
                                   str(content)) for path, content in self.files]

    def describe(self, overwrite: bool = False, create_pr: bool = False) -> str:
        total = sum(self.size(c) for _, c in self.files)
        where = f"{'private' if self.private else 'public'}, branch {self.revision or 'main'}"
        existing = ("sent as a pull request (--create-pr)" if create_pr else
                    "its files replaced and stale ones deleted (--overwrite)" if overwrite else
                    "refused (pass --overwrite or --create-pr)")
        lines = [f"{self.repo_type} repo {self.repo_id}  ({where}; if it exists already: {existing})",
                 f"  from {self.source}", f"  files ({len(self.files)}, {total:,} bytes):"]
        lines += [f"    {self.size(c):>13,}  {path}{'  (generated)' if isinstance(c, bytes) else ''}"
                  for path, c in self.files]
        if self.left_out:
            lines.append(f"  not uploaded: {', '.join(d.path for d in self.left_out)}")
            lines += [f"    {d.path}: {d.why}" for d in self.left_out]
        lines += [f"  variable {key}={value}" for key, value in self.variables.items()]
        lines.append("  card front matter:")
        lines += [f"    {line}" for line in self.front_matter.strip().splitlines()]
        lines += [f"  note: {note}" for note in self.notes]
        lines.append("  checks:")
        lines += [f"    [{'ok' if c.ok else 'FAIL'}] {c.name}{': ' + c.detail if c.detail else ''}"
                  for c in self.checks]
        return "\n".join(lines)


def upload_files(folder: Path) -> tuple[list[tuple[str, Path]], list[FileDecision]]:
    """(files to upload, those left out): `decide_files`' decision, the one the card shows by."""
    try:
        decided = decide_files(folder)
    except ValueError as err:  # a link out of the folder, a results file of another schema
        raise ReleaseError(str(err)) from None
    return [(d.path, folder / d.path) for d in decided if d.included], [d for d in decided if not d.included]


def check_repo_id(repo_id: str) -> None:
    """A ReleaseError unless huggingface_hub's own validator (the one behind every HfApi call) accepts the id."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise ReleaseError(f"{repo_id!r} is not a Hub repo id: {err} Give ORG/NAME, e.g. my-org/my-student-base.") \
            from None


def check_weights(files: list[tuple[str, Path | bytes]]) -> Check:
    name = "weights are safetensors only"
    pickles = [path for path, _ in files if path.lower().endswith(PICKLE_SUFFIXES)]
    if pickles:
        return Check(name, False, f"refusing pickle files {pickles}: re-save with save_pretrained "
                                  "(safe_serialization) or delete them")
    weights = [path for path, _ in files if path.endswith(".safetensors")]
    return Check(name, bool(weights), ", ".join(weights) if weights else "no .safetensors file")


def check_intact(folder: Path) -> Check:
    """`linzoo.integrity.verify_folder`: the JSON files parse, the weights open and equal their recorded sha256."""
    name = "files intact, weights as recorded"
    try:
        verify_folder(folder)
    except (ValueError, FileNotFoundError) as err:
        return Check(name, False, str(err))
    return Check(name, True, "sha256 as recorded in " + LINEAGE_FILE if recorded_digests(folder) else
                 f"no sha256 recorded ({LINEAGE_FILE} of an older run, or none)")


def check_code(folder: Path) -> Check:
    """The folder's Python files are linzoo's installed modeling files, byte for byte, and every `auto_map` entry
    (config.json, tokenizer_config.json) names one of them: loading it with trust_remote_code runs linzoo's code
    only. Read, never imported."""
    own = Path(linzoo_modeling.__file__).parent
    name = f"Python files are linzoo {linzoo_version}'s own modeling files"
    foreign = [p.name for p in sorted(folder.glob("*.py")) if p.name == "__init__.py" or not (own / p.name).is_file()]
    differ = [p.name for p in sorted(folder.glob("*.py")) if p.name not in foreign
              and p.read_bytes() != (own / p.name).read_bytes()]
    entries = []
    for config in ("config.json", "tokenizer_config.json"):
        auto_map = (read_json(folder / config) or {}).get("auto_map") or {}
        for ref in (r for v in auto_map.values() for r in (v if isinstance(v, list) else [v]) if r):
            if "--" in ref or not (folder / f"{ref.rsplit('.', 1)[0]}.py").is_file():
                entries.append(f"{config} auto_map {ref!r}")
    if not (foreign or differ or entries):
        return Check(name, True)
    problems = ([f"differs from linzoo's own in {own}: {', '.join(differ)}"] if differ else []) + \
               ([f"not linzoo's: {', '.join(foreign)}"] if foreign else []) + \
               ([f"names code outside the folder's files: {', '.join(entries)}"] if entries else [])
    return Check(name, False, "; ".join(problems) + ". Not run: copy linzoo's own files over them (or push with "
                                                     "the linzoo that wrote them) and delete the others")


_LOAD = """
import json, sys
from transformers import AutoModelForCausalLM, AutoTokenizer
from linzoo.integrity import unusable_model
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=True)
print("LOADED", json.dumps({"module": type(model).__module__, "cls": type(model).__name__,
                  "mixer": getattr(model.config, "mixer", None), "unusable": unusable_model(model),
                  "params": sum(p.numel() for p in model.parameters())}))
"""


LOAD_CHECK = "loads with trust_remote_code in a fresh Python"


def check_loads(folder: Path, timeout: int = 900) -> Check:
    """Load the folder in a fresh interpreter (sys.executable), offline, from an empty working directory."""
    name = LOAD_CHECK
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    with tempfile.TemporaryDirectory() as cwd:
        try:
            run = subprocess.run([sys.executable, "-c", _LOAD, str(folder.resolve())], cwd=cwd, env=env,
                                 capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return Check(name, False, f"timed out after {timeout} s")
    if run.returncode != 0 or "LOADED" not in run.stdout:
        error = run.stderr.strip().splitlines()[-1] if run.stderr.strip() else f"exit {run.returncode}"
        return Check(name, False, error)
    got = json.loads(run.stdout.rsplit("LOADED", 1)[1])
    remote = got["module"].startswith("transformers_modules")  # the folder's own code, not an installed package
    ok = remote and not got["unusable"]
    detail = f"{got['cls']} ({got['mixer']}), {got['params']:,} parameters"
    detail += "" if remote else f"; loaded from {got['module']}, not the folder's remote code"
    return Check(name, ok, detail + (f"; {got['unusable']}" if got["unusable"] else ""))


CARD_CHECK = "card numbers equal the results files"


def check_card(folder: Path, card: ModelCard) -> Check:
    """The card's model-index, parsed back from its YAML, equals the numbers in the results files."""
    name = CARD_CHECK
    results, left_out = matching_results(folder)
    expected = {eval_key(r): r.metric_value for r in eval_results(results)}
    got = {eval_key(r): r.metric_value for r in ModelCard(str(card)).data.eval_results or []}
    if got != expected:
        diff = sorted(set(got.items()) ^ set(expected.items()), key=str)[:3]
        return Check(name, False, f"card and files differ: {diff}")
    missing = [f"{EVAL_DIR}/{spec.result_file}" for spec in all_evals()  # the evals whose card section says so
               if results_of(spec, results) == [("", None)] and NOT_MEASURED in spec.card_section(None, folder, "")]
    return Check(name, True, f"{len(expected)} numbers" + (f"; {', '.join(missing)} missing: the card says "
                                                            "'not measured'" if missing else "")
                 + "".join(f"; {line}" for line in left_out))


def plan_checkpoint(folder, repo_id: str, private: bool = False, revision: str | None = None,
                    base_model: str | None = None, load_check: bool = True) -> RepoPlan:
    """The plan of one model repo: its files (`decide_files`' decision), the generated card and the checks. A folder
    whose files are not as its run saved them gets no card (`build_card` loads it as linzoo's loaders do): its plan
    says which file, in the failed check."""
    check_repo_id(repo_id)
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise ReleaseError(f"{folder} is not a model folder (no config.json).")
    intact, card = check_intact(folder), None
    if intact.ok:
        try:
            card = build_card(folder, repo_id, base_model)
        except (ValueError, FileNotFoundError) as err:
            raise ReleaseError(str(err)) from err
    files, left_out = upload_files(folder)
    files += [("README.md", str(card).encode())] if card else []
    recorded = base_model or default_base_model(checkpoint_info(folder))
    base = hub_base_model(recorded)
    checks = [check_weights(files), intact,
              check_card(folder, card) if card else Check(CARD_CHECK, False, "not run: no card of a folder whose "
                                                                             "files are not as saved"),
              Check("base_model is a Hub id", bool(base), base or f"{recorded!r} is not a Hub id: pass --base-model "
                                                                  "ORG/NAME")]
    code = check_code(folder)
    if load_check:  # the folder's Python runs only when it is linzoo's own
        checks.insert(0, check_loads(folder) if code.ok else Check(LOAD_CHECK, False, "not run: see the check above"))
    checks.insert(0, code)
    notes = []
    if card and (folder / "README.md").is_file() and (folder / "README.md").read_text() != str(card):
        notes.append("README.md in the folder differs from the regenerated card; the regenerated card is uploaded")
    return RepoPlan(repo_id, "model", folder, files, card.data.to_yaml() if card else "(no card)", private, revision,
                    left_out, checks, notes=notes)


def build_wheel(out_dir) -> Path:
    """linzoo's wheel (`pip wheel --no-deps`) built from the checkout this linzoo runs from, into `out_dir`. The
    sources are copied to a temporary folder first, so the build leaves nothing (build/, *.egg-info) behind."""
    import tomllib

    root = Path(__file__).resolve().parents[1]
    if not (root / "pyproject.toml").is_file():
        raise ReleaseError(f"linzoo runs from {root}, not from a checkout: build its wheel in one "
                           "(pip wheel --no-deps -w dist .) and pass it with --wheel.")
    project = tomllib.loads((root / "pyproject.toml").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        src, dist = Path(tmp) / "linzoo", Path(tmp) / "dist"
        src.mkdir()
        for name in ("pyproject.toml", project["project"]["readme"]):
            shutil.copy2(root / name, src / name)
        for folder in project["tool"]["setuptools"]["package-dir"].values():
            shutil.copytree(root / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
        run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)],
                             capture_output=True, text=True)
        if run.returncode != 0:
            error = (run.stderr.strip() or f"exit {run.returncode}").splitlines()[-1]
            raise ReleaseError(f"building linzoo's wheel failed: {error}")
        (wheel,) = dist.glob("linzoo-*.whl")
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        return Path(shutil.move(wheel, Path(out_dir) / wheel.name))


def _requires_python(wheel: Path) -> str:
    import zipfile
    from email.parser import HeaderParser

    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return HeaderParser().parsestr(archive.read(name).decode()).get("Requires-Python") or ""


def plan_space(space_dir, repo_id: str, models: list[str], results: dict[str, Path], wheel: Path,
               private: bool = False) -> RepoPlan:
    """The Space repo: app files, README front matter listing `models`, results/<name>/ from each eval folder, and
    linzoo's `wheel`, which the uploaded requirements.txt installs from its URL in the Space repo (the Hub builds
    the environment from requirements.txt alone, before the repo's other files are copied in)."""
    from huggingface_hub import hf_hub_url
    from packaging.specifiers import SpecifierSet

    check_repo_id(repo_id)
    space_dir, wheel = Path(space_dir), Path(wheel)
    card = SpaceCard.load(space_dir / "README.md")
    card.data.models = [m for m in models if "/" in m]
    url = hf_hub_url(repo_id, wheel.name, repo_type="space")
    requirements = (space_dir / "requirements.txt").read_text().splitlines()
    at = [i for i, line in enumerate(requirements) if SPACE_WHEEL_LINE.fullmatch(line.strip())]
    for i in at:
        requirements[i] = f"linzoo @ {url}"
    files: list[tuple[str, Path | bytes]] = [("README.md", str(card).encode()),
                                             ("requirements.txt", ("\n".join(requirements) + "\n").encode())]
    # The folder's Python besides app.py (the Space's logic, `linzoo.spaces.<name>`) reaches the Space in the wheel.
    files += [(p.name, p) for p in sorted(space_dir.iterdir()) if p.is_file() and not p.name.startswith(".")
              and p.name not in ("README.md", "requirements.txt") and p.suffix != ".whl"
              and (p.suffix != ".py" or p.name == "app.py")]
    files.append((wheel.name, wheel))
    for name, eval_dir in results.items():  # eval/ and its sub-folders (a zoo's evals run again: eval/natural, ...)
        subs = [""] + (sorted(p.name for p in eval_dir.iterdir() if p.is_dir()) if eval_dir.is_dir() else [])
        files += [(f"results/{name}/{sub + '/' if sub else ''}{f}", eval_dir / sub / f) for sub in subs
                  for spec in all_evals() for f in spec.files if (eval_dir / sub / f).is_file()]
    pin = next((line.split("==")[1].strip() for line in requirements if line.startswith("gradio==")), None)
    python, requires = str(card.data.python_version or ""), _requires_python(wheel)
    checks = [Check("app.py present", (space_dir / "app.py").is_file()),
              Check("sdk_version equals the gradio pin of requirements.txt", str(card.data.sdk_version) == pin,
                    f"sdk_version {card.data.sdk_version}, requirements gradio=={pin}"),
              Check("requirements.txt installs linzoo from the uploaded wheel", len(at) == 1,
                    url if len(at) == 1 else f"{len(at)} lines match ./linzoo-<version>-*.whl in "
                                             f"{space_dir / 'requirements.txt'}, 1 expected"),
              Check("python_version fits the wheel's Requires-Python",
                    bool(python) and python in SpecifierSet(requires),
                    f"python_version {python or 'not set (the Hub default)'}, Requires-Python {requires}")]
    notes = ["a private Space's build may be refused the download of its own wheel (not yet tried on the Hub)"
             ] if private else []
    return RepoPlan(repo_id, "space", space_dir, files, card.data.to_yaml(), private, None, [], checks,
                    {"LINZOO_SPACE_MODELS": ",".join(models)}, notes)


def hub_token() -> str:
    """The saved or $HF_TOKEN token; a ReleaseError saying how to log in when there is none."""
    from huggingface_hub import get_token

    token = get_token()
    if not token:
        raise ReleaseError(LOGIN_HELP)
    return token


def hub_error(err, doing: str) -> ReleaseError:
    """A ReleaseError for a failed Hub call: its HTTP status and, for 401/403, how to log in (never the token)."""
    status = getattr(getattr(err, "response", None), "status_code", None)
    hint = f"; {LOGIN_HOW}" if status in (401, 403) else ""
    return ReleaseError(f"The Hub answered {status or type(err).__name__} while {doing}{hint}.")


def repo_exists(api, repo_id: str, repo_type: str, overwrite: bool, create_pr: bool) -> bool:
    """Whether the repo exists; a ReleaseError when it does and neither --overwrite nor --create-pr allows a commit."""
    from huggingface_hub.errors import HfHubHTTPError

    try:
        exists = api.repo_exists(repo_id, repo_type=repo_type)
    except HfHubHTTPError as err:
        raise hub_error(err, f"looking up {repo_id}") from None
    if exists and not (overwrite or create_pr):
        raise ReleaseError(f"{repo_type} repo {repo_id} already exists; nothing was uploaded. Pass --overwrite "
                           "to replace its files, or --create-pr to send them as a pull request.")
    return exists


def upload(api, plan: RepoPlan, exists: bool, create_pr: bool = False) -> str:
    """One commit with exactly the plan's files (an existing repo also loses files the plan does not have)."""
    if not exists:
        api.create_repo(plan.repo_id, repo_type=plan.repo_type, private=plan.private,
                        space_sdk="gradio" if plan.repo_type == "space" else None)
    if plan.revision and not create_pr:
        api.create_branch(plan.repo_id, branch=plan.revision, repo_type=plan.repo_type, exist_ok=True)
    operations: list = plan.operations()
    if exists:
        planned = {path for path, _ in plan.files} | {".gitattributes"}
        stale = set(api.list_repo_files(plan.repo_id, repo_type=plan.repo_type, revision=plan.revision)) - planned
        operations += [CommitOperationDelete(path_in_repo=path) for path in sorted(stale)]
    info = api.create_commit(plan.repo_id, operations, commit_message=f"linzoo: upload {plan.source.name}",
                             repo_type=plan.repo_type, revision=plan.revision, create_pr=create_pr and exists)
    for key, value in plan.variables.items():
        api.add_space_variable(plan.repo_id, key, value)
    return info.pr_url or info.commit_url
