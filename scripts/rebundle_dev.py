"""Re-split the lent GPU's staging bundles (`.dev/b*`, made by ../shared/device/prepare.sh) so that each fits one call
beside this checkout: a call sends the tracked files plus what `carry` names, 64 MiB in all, and prepare.sh's bundles
(<= 54 MB) stop fitting once the tracked files pass ~13 MB (2026-12-07: 16.8 MB, and every staging call was refused
as too large). Files are packed first-fit by size into as few bundles as fit; MANIFEST and TEACHER_SHA256 go into
each (stage.sh reads them from its pool). A file larger than that room (tilelang's 49.6 MB wheel, once the
checkout passed 16.8 MiB) is split into parts that stage.sh, patched here once, joins on the machine. Prints each
bundle's size and the room left.

    python scripts/rebundle_dev.py            # then carry [.dev/stage.sh, .dev/bN] a call, as before
"""

import shutil
import subprocess
import sys
from pathlib import Path

LIMIT = 64 * 2**20
MARGIN = 2 * 2**20  # stage.sh, a commit or two, and slack: at 63.5 of 64 MiB a call was refused (2026-12-07)
SHARED = ("MANIFEST", "TEACHER_SHA256")


def main():
    dev = Path(".dev")
    bundles = sorted(p for p in dev.glob("b[0-9]*") if p.is_dir())
    if not bundles and not (dev / "pool.tmp").is_dir():  # pool.tmp: a run stopped before it had re-split
        sys.exit("rebundle_dev: no .dev/b* bundles here: run `bash ../shared/device/prepare.sh` in the checkout first")
    tracked = sum(Path(f).stat().st_size for f in subprocess.run(
        ["git", "ls-files", "-z"], capture_output=True, text=True, check=True).stdout.split("\0") if f and Path(f).is_file())
    room = LIMIT - tracked - MARGIN
    pool = dev / "pool.tmp"
    pool.mkdir(exist_ok=True)
    for b in bundles:
        for f in b.iterdir():
            target = pool / f.name
            if target.exists():
                f.unlink()  # MANIFEST and TEACHER_SHA256: the same in every bundle
            else:
                shutil.move(str(f), target)
        b.rmdir()
    join(pool)
    shared = [pool / n for n in SHARED if (pool / n).exists()]
    pooled = lambda: sorted((f for f in pool.iterdir() if f.name not in SHARED), key=lambda f: -f.stat().st_size)  # noqa: E731
    room -= sum(f.stat().st_size for f in shared)
    if room < 2**20:
        sys.exit(f"rebundle_dev: the {tracked / 2**20:.1f} MiB of tracked files leave no room in a call's 64 MiB: "
                 f"make the checkout smaller (files are in {pool})")
    for f in [f for f in pooled() if f.stat().st_size > room // 2]:  # halves pack badly: split into thirds of a call
        split(f, room // 3)
    patch_stage(dev / "stage.sh")
    files = pooled()
    bins: list[list[Path]] = []
    for f in files:
        for b in bins:
            if sum(x.stat().st_size for x in b) + f.stat().st_size <= room:
                b.append(f)
                break
        else:
            bins.append([f])
    for i, b in enumerate(bins):
        out = dev / f"b{i}"
        out.mkdir()
        for f in b:
            shutil.move(str(f), out / f.name)
        for s in shared:
            shutil.copy(s, out / s.name)
        size = sum(x.stat().st_size for x in out.iterdir())
        print(f"{out}: {size / 1e6:.1f} MB, {len(b)} files; with the checkout {(size + tracked) / 2**20:.1f} of 64 MiB")
    for s in shared:
        s.unlink()
    pool.rmdir()


def split(f: Path, most: int):
    """A large file travels as `<name>.split<i>of<n>` parts of at most `most` bytes; stage.sh joins them."""
    data = f.read_bytes()
    n = -(-len(data) // most)
    size = -(-len(data) // n)
    for i in range(n):
        (f.parent / f"{f.name}.split{i}of{n}").write_bytes(data[i * size:(i + 1) * size])
    f.unlink()
    print(f"{f.name}: {len(data) / 2**20:.1f} MiB, split into {n} parts")


def join(pool: Path):
    """Undo split() in the pool, so that a re-split starts from whole files."""
    for first in sorted(pool.glob("*.split0of*")):
        base, n = first.name.rsplit(".split0of", 1)
        parts = [pool / f"{base}.split{i}of{n}" for i in range(int(n))]
        (pool / base).write_bytes(b"".join(x.read_bytes() for x in parts))
        for x in parts:
            x.unlink()


JOIN = ('for _rb_p in $S/pool/*.split0of*; do [ -f "$_rb_p" ] || continue; _rb_base=${_rb_p%.split0of*}; '
        '_rb_n=${_rb_p##*.split0of}; [ -f "$_rb_base" ] && continue; _rb_parts=(); for _rb_i in $(seq 0 $((_rb_n-1))); '
        'do [ -f "$_rb_base.split${_rb_i}of$_rb_n" ] && _rb_parts+=("$_rb_base.split${_rb_i}of$_rb_n"); done; '
        '[ "${#_rb_parts[@]}" = "$_rb_n" ] && cat "${_rb_parts[@]}" > "$_rb_base.tmp" && mv "$_rb_base.tmp" "$_rb_base"; '
        'done; unset _rb_p _rb_base _rb_n _rb_parts _rb_i  # rebundle_dev.py')


def patch_stage(stage: Path):
    """prepare.sh's stage.sh gathers whole files: teach it, once, to join split parts after gathering."""
    text = stage.read_text()
    if JOIN in text:
        return
    text = "".join(line for line in text.splitlines(keepends=True) if not line.rstrip().endswith("# rebundle_dev.py"))
    anchor = next((line for line in text.splitlines() if line.startswith("for b in .dev/b")), None)
    if anchor is None:
        sys.exit(f"rebundle_dev: {stage} has no `for b in .dev/b...` line to join split files after: run "
                 "`bash ../shared/device/prepare.sh` again (the split files are in the bundles)")
    stage.chmod(0o755)
    stage.write_text(text.replace(anchor, anchor + "\n" + JOIN, 1))
    stage.chmod(0o555)


if __name__ == "__main__":
    main()
