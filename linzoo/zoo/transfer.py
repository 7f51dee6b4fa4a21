"""Move a zoo's students from one machine to the next in small files: what training changed, not the checkpoint.

A GPU machine held for a while (an offline cloud node, a preemptible instance) may let a few files of a few MB out,
never a whole build. A linearize row that trained its mixers only (`--stage_trainable mixers`) differs from its
teacher in its mixers alone: those tensors, in bf16 (~54 MB for the 135M pure student) or as trained (fp32), are the
student. `export_rows` writes them for every finished row, in files of at most `--max_file_mb`, with the row's small
files (config, lineage, run record, results) inside the first file's safetensors metadata, and `zoo_export.json` with
the build's `zoo_state.json`; `import_rows` rebuilds each row's folder on the next machine from the teacher and those
files, and `linzoo zoo` goes on from there: a linearize row whose parent is an imported row trains it further
(`--init_student`).

    linzoo export-zoo runs/race exported/ [--rows MIXER/pure-500k] [--dtype bfloat16] [--max_file_mb 16]
    linzoo import-zoo exported/ runs/race          # on the next machine, before `linzoo zoo --out runs/race`

Exported as trained (`--dtype float32`), a row comes back byte for byte: its weights' hash is the same, so its results
stand and the build ends as an unsplit one would. Exported in bf16, the rebuilt row's lineage records it
(`exported`) and its weights' new hash, so its evals run again on what came back.
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

from .plan import STATE_FILE, ZooState, _absolute

PACK_FILE = "zoo_export.json"
META_KEY = "linzoo_export"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
SKIP_DIRS = ("checkpoint-", "stage")  # the trainers' checkpoints and stage folders: superseded by the saved student
SKIP_FILES = (".lock", ".linzoo.lock")
DTYPES = ("bfloat16", "float32")


def row_files(folder: Path) -> dict[str, str]:
    """The row's small files (config, tokenizer, lineage, results, figures, modeling code), relative path -> base64:
    everything but weights, checkpoints, stage folders and locks."""
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if (not path.is_file() or path.suffix in WEIGHT_SUFFIXES or path.name.endswith(SKIP_FILES)
                or any(part.startswith(SKIP_DIRS) for part in rel.parts[:-1])):
            continue
        out[rel.as_posix()] = base64.b64encode(path.read_bytes()).decode()
    return out


def changed_tensors(student, teacher_state: dict) -> dict:
    """The student's tensors that are not its teacher's, bit for bit, under the same name: new parameters and what
    training changed (tied weights once)."""
    import torch

    out, seen = {}, set()
    for name, tensor in student.state_dict().items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in seen:
            continue
        seen.add(key)
        ref = teacher_state.get(name)
        if ref is None or ref.shape != tensor.shape or not torch.equal(ref.to(tensor.dtype), tensor):
            out[name] = tensor
    return out


def shards(tensors: dict, limit: int) -> list[dict]:
    """`tensors` in file-sized groups of at most `limit` bytes each (a tensor larger than it gets a file alone)."""
    groups, size = [{}], 0
    for name in sorted(tensors):
        n = tensors[name].numel() * tensors[name].element_size()
        if groups[-1] and size + n > limit:
            groups.append({})
            size = 0
        groups[-1][name] = tensors[name]
        size += n
    return groups


def finished_rows(out: Path) -> list[str]:
    """<mixer>/<variant> of every finished training under a zoo folder (its lineage file is there)."""
    from linzoo.integrity import LINEAGE_FILE

    return sorted(p.parent.relative_to(out).as_posix() for p in out.glob(f"*/*/{LINEAGE_FILE}")
                  if p.parent.parent.name != "teacher")


def export_rows(out, dest, rows: list[str] | None = None, dtype: str = "bfloat16", max_file_mb: float = 16,
                teacher: str | None = None, say=print) -> list[Path]:
    """Writes `dest`/zoo_export.json and each row's `<mixer>.<variant>.NN.safetensors`; returns the files written."""
    import torch
    from safetensors.torch import save_file

    from linzoo.integrity import LINEAGE_FILE, write_json
    from linzoo.loading import load_model, load_teacher
    from linzoo.trainers.common import RUN_FILE

    out, dest = Path(out), Path(dest)
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype}: give one of {', '.join(DTYPES)}")
    if not (out / STATE_FILE).is_file():
        raise ValueError(f"{out} holds no zoo build ({STATE_FILE} is missing): give the --out of a `linzoo zoo` run")
    found = finished_rows(out)
    rows = found if rows is None else rows
    missing = [r for r in rows if r not in found]
    if missing:
        raise ValueError(f"{', '.join(missing)}: no finished row of {out} (finished: {', '.join(found) or 'none'})")
    if not rows:
        raise ValueError(f"{out} has no finished row to export yet")
    dest.mkdir(parents=True, exist_ok=True)
    written, teachers, listing = [], {}, {}
    for row in rows:
        folder = out / row
        run = folder / RUN_FILE  # the teacher as the run was given it ('embedded'), not the Hub id it names
        spec = teacher or (json.loads(run.read_text())["arguments"].get("teacher") if run.is_file() else None) \
            or json.loads((folder / LINEAGE_FILE).read_text()).get("teacher")
        if spec not in teachers:
            teachers[spec] = load_teacher(spec)[0].float().state_dict()
        student = load_model(str(folder), dtype=torch.float32)[0]
        tensors = {k: v.to(getattr(torch, dtype)).contiguous() for k, v in
                   changed_tensors(student, teachers[spec]).items()}
        groups = shards(tensors, int(max_file_mb * 2**20) - 2**20)  # a MB for the header (the row's small files)
        meta = {"row": row, "dtype": dtype, "teacher": spec, "files": row_files(folder), "shards": len(groups)}
        names = []
        for i, group in enumerate(groups):
            path = dest / f"{row.replace('/', '.')}.{i:02d}.safetensors"
            save_file(group, str(path), metadata={META_KEY: json.dumps(meta)} if i == 0 else {"row": row})
            names.append(path.name)
            written.append(path)
        too_big = [p.name for p in written[-len(groups):] if p.stat().st_size > max_file_mb * 2**20]
        if too_big:
            raise ValueError(f"{', '.join(too_big)} exceed --max_file_mb {max_file_mb:g}: the row's small files are "
                             "too many (figures, logs); raise --max_file_mb")
        listing[row] = names
        size = sum((dest / n).stat().st_size for n in names)
        say(f"export-zoo: {row}: {len(tensors)} tensors changed from the teacher ({dtype}), {size / 2**20:.1f} MiB in "
            f"{len(names)} files")
    written.append(write_json(dest / PACK_FILE, {"rows": listing, "zoo_state": ZooState.read(out)}))
    return written


def moved_state(state: dict, out) -> dict:
    """zoo_state.json of a build whose folder is now `out` (as this process spells it, from its cwd): each record's
    command line names the rows in their new place, so the build there finds them done."""
    import os

    out = str(out)
    for records in state.get("steps", {}).values():
        for record in records.values():
            if not (record.get("out") and record.get("cwd")):
                continue
            root = os.path.normpath(os.path.join(record["cwd"], record["out"]))
            argv = _absolute(record["argv"], record["out"], record["cwd"])
            record["argv"] = [out + w[len(root):] if w == root or w.startswith(root + "/") else w for w in argv]
            record["out"], record["cwd"] = out, os.getcwd()
    return state


def import_rows(source, out, teacher: str | None = None, say=print) -> list[str]:
    """Rebuilds each row of `source`/zoo_export.json under the zoo folder `out` (a row already there is left as it is),
    and `out`/zoo_state.json where there is none; returns the rows rebuilt."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file

    from linzoo.integrity import DIGESTS, LINEAGE_FILE, weights_record, write_json
    from linzoo.loading import load_teacher
    from linzoo.modeling import LinzooConfig, LinzooForCausalLM

    source, out = Path(source), Path(out)
    if not (source / PACK_FILE).is_file():
        raise ValueError(f"{source} holds no exported build ({PACK_FILE} is missing): give what `linzoo export-zoo` "
                         "wrote")
    pack_record = json.loads((source / PACK_FILE).read_text())
    out.mkdir(parents=True, exist_ok=True)
    state_path = out / STATE_FILE
    if state_path.is_file():
        if ZooState.read(out)["steps"].keys() - pack_record["zoo_state"].get("steps", {}).keys():
            raise ValueError(f"{state_path} records steps the exported build has not: import into the folder of the "
                             "build it came from, or a new one")
    rebuilt, teachers = [], {}
    for row, names in pack_record["rows"].items():
        folder = out / row
        if (folder / LINEAGE_FILE).is_file():
            say(f"import-zoo: {row}: already in {folder}, left as it is")
            continue
        missing = [n for n in names if not (source / n).is_file()]
        if missing:
            raise ValueError(f"{row}: {', '.join(missing)} missing from {source}: bring every file export-zoo wrote")
        with safe_open(str(source / names[0]), "pt") as f:
            meta = json.loads(f.metadata()[META_KEY])
        tensors = {}
        for name in names:
            tensors.update(load_file(str(source / name)))
        files = {rel: base64.b64decode(data) for rel, data in meta["files"].items()}
        spec = teacher or meta["teacher"]
        if spec not in teachers:
            teachers[spec] = load_teacher(spec)[0].float().state_dict()
        config = LinzooConfig.from_dict(json.loads(files["config.json"]))
        model = LinzooForCausalLM(config).float()
        state = model.state_dict()
        unset = [k for k in state if k not in tensors and k not in teachers[spec]]
        if unset:
            raise ValueError(f"{row}: {len(unset)} tensors neither exported nor the teacher's (e.g. {unset[0]}): "
                             "export with the teacher the row was trained from (--teacher)")
        with torch.no_grad():
            for k, v in state.items():
                v.copy_(tensors[k] if k in tensors else teachers[spec][k])
        tmp = out / f".{row.replace('/', '.')}.importing"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        for rel, data in files.items():  # the row's own config, lineage and results over what save_pretrained wrote
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(data)
        lineage = json.loads(files[LINEAGE_FILE])
        now = weights_record(tmp)
        if lineage.get(DIGESTS) != now[DIGESTS]:  # exported in another dtype than it trained in
            lineage["exported"] = {"dtype": meta["dtype"], "tensors": len(tensors), "trained": lineage.get(DIGESTS)}
            lineage[DIGESTS] = now[DIGESTS]
            write_json(tmp / LINEAGE_FILE, lineage)
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp.rename(folder)
        rebuilt.append(row)
        same = "byte for byte" if "exported" not in lineage else f"its {meta['dtype']} tensors over the teacher's"
        say(f"import-zoo: {row}: rebuilt in {folder} ({same})")
    if not state_path.is_file():
        ZooState(moved_state(pack_record["zoo_state"], out)).save(out)
    return rebuilt


def export_main(argv: list[str] | None = None) -> int:
    """`linzoo export-zoo ZOO_OUT DEST`: a build's finished rows as the tensors training changed."""
    from linzoo.arguments import ArgumentParser

    parser = ArgumentParser(prog="linzoo export-zoo", description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the zoo's folder (`linzoo zoo --out`)")
    parser.add_argument("dest", help="the folder for the files to take to the next machine")
    parser.add_argument("--rows", help="<mixer>/<variant>, comma-separated (default: every finished row)")
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPES,
                        help="the tensors' dtype in the files (float32: back byte for byte; default %(default)s)")
    parser.add_argument("--max_file_mb", type=float, default=16, help="the largest file written (default %(default)s)")
    parser.add_argument("--teacher", help="the teacher the rows were trained from (default: each row's run's)")
    args = parser.parse_args(argv)
    if args.max_file_mb < 2:
        raise ValueError(f"--max_file_mb {args.max_file_mb:g}: give at least 2")
    rows = None if args.rows is None else [r.strip() for r in args.rows.split(",") if r.strip()]
    files = export_rows(args.out, args.dest, rows, args.dtype, args.max_file_mb, args.teacher)
    print(f"export-zoo: {len(files)} files in {args.dest}")
    return 0


def import_main(argv: list[str] | None = None) -> int:
    """`linzoo import-zoo SOURCE ZOO_OUT`: the exported rows rebuilt from the teacher in a zoo's folder."""
    from linzoo.arguments import ArgumentParser

    parser = ArgumentParser(prog="linzoo import-zoo", description=__doc__.splitlines()[0])
    parser.add_argument("source", help="the folder `linzoo export-zoo` wrote")
    parser.add_argument("out", help="the zoo's folder to rebuild the rows in (`linzoo zoo --out`)")
    parser.add_argument("--teacher", help="the teacher (default: the one each row was exported with)")
    args = parser.parse_args(argv)
    rows = import_rows(args.source, args.out, args.teacher)
    print(f"import-zoo: {len(rows)} rows rebuilt in {args.out}")
    return 0
