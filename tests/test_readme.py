"""The README is for users, and its quickstart runs as written.

- The fenced blocks under "## Quickstart" run in order in a scratch folder, as a user runs them from the root of a
  checkout: `bash` blocks with `bash -e`, `python` blocks with this interpreter, the `bash server` block (the NIAH
  Space) in the background until it answers over HTTP, then stopped. The `bash gpu` block needs CUDA and is not run;
  its `linzoo zoo` command is checked with `--dry-run` instead. The scratch folder holds only a link to the checkout's
  `recipes/` (the zoo files the quickstart names), so `runs/` is written there and nothing in the checkout is.
- Every repository path and every link the README, CONTRIBUTING.md and docs/ name exists.
- The README and docs/ speak to users: no issue numbers in the README, no words of one machine-lending arrangement.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```$", re.M | re.S)
RUN, SERVER, SKIPPED = {"bash", "python"}, "bash server", "bash gpu"


def quickstart_blocks() -> list[tuple[str, str]]:
    """(info string, body) of every fenced block in the README's Quickstart section, in order."""
    text = (ROOT / "README.md").read_text()
    assert "\n## Quickstart\n" in text, "the README has no '## Quickstart' section"
    section = text.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    return [(info.strip(), body) for info, body in FENCE.findall(section)]


def test_the_quickstart_skips_only_its_gpu_block():
    blocks = quickstart_blocks()
    kinds = [info for info, _ in blocks]
    assert set(kinds) <= RUN | {SERVER, SKIPPED}, f"a quickstart block of unknown kind: {kinds}"
    skipped = [body for info, body in blocks if info == SKIPPED]
    assert len(skipped) == 1 and 'pip install -e ".[gpu]"' in skipped[0] and "zoo-gpu.yaml" in skipped[0], skipped
    assert kinds.count(SERVER) == 1 and "linzoo space " in dict(blocks)[SERVER]
    ran = [body for info, body in blocks if info in RUN]
    needs = ("linzoo linearize ", "from_pretrained(", "linzoo eval niah ", "linzoo zoo --config recipes/135m/zoo-cpu.yaml")
    for needed in needs:
        assert any(needed in body for body in ran), f"no quickstart block that the test runs holds {needed!r}"
    zoo = next(body for body in ran if "linzoo zoo " in body)
    assert "--dry-run" in zoo, "the CPU zoo block builds for hours: the README shows its --dry-run"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {_slug(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


TOP = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")} - {"runs", "build", "outputs"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_and_link_a_page_names_exists(page):
    text = page.read_text()
    missing = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            missing.append(f"link {target}")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            missing.append(f"link {target}: no heading #{anchor}")
    for path in re.findall(r"`([A-Za-z0-9_.\-]+/[^`\s]*)`", text):
        if path.split("/")[0] in TOP and not re.search(r"[<>*|{}]|NAME|\.\.\.", path):
            if not (ROOT / path).exists():
                missing.append(f"path {path}")
    assert not missing, f"{page.relative_to(ROOT)} names what is not there:\n" + "\n".join(missing)


# Words of the one lending arrangement the GPU section used to be written for; the pages speak to any user.
NOT_FOR_USERS = [r"device tool", r"\bleases?\b", r"\blent\b", r"\bcall \d", r"\bcarry\b", r"\bstatus\b", r"\$OUT\b",
                 r"budget_left"]


@pytest.mark.parametrize("page", [p for p in PAGES if p.name != "CONTRIBUTING.md"], ids=lambda p: p.name)
def test_the_pages_speak_to_users(page):
    text = page.read_text()
    found = [m.group(0) for word in NOT_FOR_USERS for m in re.finditer(word, text, re.I)]
    if page.name == "README.md":
        found += re.findall(r"\bissues? \d+", text, re.I)
    assert not found, f"{page.name}: {found}"


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250, "the README is for users: move details to docs/"


# ----------------------------------------------------------------------------------------------- the quickstart, run


def _env() -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # this venv's `linzoo`
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run(argv, cwd, label, timeout=900) -> str:
    started = time.monotonic()
    done = subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"{label} exited {done.returncode}:\n{out[-4000:]}"
    print(f"{label}: {time.monotonic() - started:.0f} s")
    return done.stdout


def _serve_and_ask(body: str, cwd: Path, student: str):
    """Start the Space as written, wait for its URL, ask it over HTTP, stop it."""
    from gradio_client import Client

    log = cwd / "space.log"
    started = time.monotonic()
    with log.open("w") as sink:
        process = subprocess.Popen(["bash", "-e", "-c", body], cwd=cwd, env=_env(), stdout=sink,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = None
        while url is None and time.monotonic() - started < 300:
            assert process.poll() is None, f"the Space exited {process.returncode}:\n{log.read_text()[-4000:]}"
            found = re.search(r"Running on local URL:\s+(http://\S+)", log.read_text())
            url = found and found.group(1)
            time.sleep(1)
        assert url, f"the Space printed no URL in 300 s:\n{log.read_text()[-4000:]}"
        client = Client(url, verbose=False)
        offered = [row[0] for row in client.predict(api_name="/models")["data"]]
        assert offered == [student, "embedded"], offered
        _, table = client.predict([student], 256, 0.5, "passkey", 0, "raw", "", "", "", api_name="/ask")
        assert [row[0] for row in table["data"]] == [student], table
    finally:
        os.killpg(process.pid, signal.SIGTERM)  # its own session: bash and the Space it started
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    print(f"space: {time.monotonic() - started:.0f} s")


@pytest.mark.slow
def test_the_quickstart_runs_as_written(tmp_path):
    (tmp_path / "recipes").symlink_to(ROOT / "recipes", target_is_directory=True)
    student = "runs/quickstart"
    outputs = {}
    for i, (info, body) in enumerate(quickstart_blocks()):
        label = f"block {i} ({info})"
        if info == "bash":
            outputs[i] = _run(["bash", "-e", "-c", body], tmp_path, label)
        elif info == "python":
            outputs[i] = _run([sys.executable, "-c", body], tmp_path, label)
        elif info == SERVER:
            _serve_and_ask(body, tmp_path, student)
        elif info == SKIPPED:  # needs CUDA: its zoo command's plan only
            for line in body.splitlines():
                if line.startswith("linzoo zoo "):
                    outputs[i] = _run(["bash", "-e", "-c", line.split("#")[0] + " --dry-run"], tmp_path, label)
    assert (tmp_path / student / "config.json").is_file() and (tmp_path / student / "model.safetensors").is_file()
    assert (tmp_path / student / "eval" / "niah.json").is_file()
    assert (tmp_path / student / "eval" / "teacher" / "niah.json").is_file()
    chat = next(i for i, (info, _) in enumerate(quickstart_blocks()) if info == "python")
    assert outputs[chat].strip(), "the chat block printed no answer"
    print(f"chat: {outputs[chat].strip()!r}")
    plans = [out for out in outputs.values() if "total: est." in out]
    assert len(plans) == 2, "the CPU and GPU zoo plans were not both printed"
