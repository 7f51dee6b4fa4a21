"""Re-split the lent GPU's staging bundles (`.dev/b*`, made by ../shared/device/prepare.sh) so that each fits one call
beside this checkout: a call sends the tracked files plus what `carry` names, 64 MiB in all, and prepare.sh's bundles
(<= 54 MB) stop fitting once the tracked files pass ~13 MB (2026-12-07: 16.8 MB, and every staging call was refused
as too large). Files are packed first-fit by size into as few bundles as fit; MANIFEST and TEACHER_SHA256 go into
each (stage.sh reads them from its pool). Prints each bundle's size and the room left.

    python scripts/rebundle_dev.py            # then carry [.dev/stage.sh, .dev/bN] a call, as before
"""

import shutil
import subprocess
import sys
from pathlib import Path

LIMIT = 64 * 2**20
MARGIN = 512 * 2**10  # stage.sh, and a commit or two before the call
SHARED = ("MANIFEST", "TEACHER_SHA256")


def main():
    dev = Path(".dev")
    bundles = sorted(p for p in dev.glob("b[0-9]*") if p.is_dir())
    if not bundles:
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
    shared = [pool / n for n in SHARED if (pool / n).exists()]
    files = sorted((f for f in pool.iterdir() if f.name not in SHARED), key=lambda f: -f.stat().st_size)
    room -= sum(f.stat().st_size for f in shared)
    too_big = [f.name for f in files if f.stat().st_size > room]
    if too_big:
        sys.exit(f"rebundle_dev: {', '.join(too_big)} alone exceed the {room / 2**20:.1f} MiB a call has beside the "
                 f"{tracked / 2**20:.1f} MiB of tracked files: make the checkout smaller (files are in {pool})")
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


if __name__ == "__main__":
    main()
