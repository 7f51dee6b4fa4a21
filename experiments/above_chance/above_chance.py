"""The headline of `linzoo eval quality`, recovery above chance with its standard error, for quality.json files
written before it existed (no `chance` per task): chance is recomputed from the same documents, whose sha256 must
match the file's `docs_sha256` where the file has one. Prints one line per file; changes nothing.

    python experiments/above_chance/above_chance.py results/gpu/eval_H200/*/quality.json --data_dir .dev/eval
"""

import argparse
import json
import sys

from linzoo.evals import quality as q


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="quality.json files (those without teacher scores are named, skipped)")
    parser.add_argument("--data_dir", required=True, help="the folder of the five .jsonl sets they were scored on")
    args = parser.parse_args(argv)
    try:
        q.check_data_dir(args.data_dir, q.TASKS)
    except ValueError as e:
        sys.exit(f"above_chance: {e}")
    chance, docs = {}, {}
    for path in args.files:
        r = json.loads(open(path).read())
        if not r.get("teacher_tasks"):
            print(f"{r['model']}: no teacher scores (a teacher's own file, or scored without --teacher)  [{path}]")
            continue
        for task, scores in r["tasks"].items():
            if task not in chance:
                docs[task] = q.load_task_docs(task, args.data_dir, r.get("limit"))
                chance[task] = q.chance_score(q.load_tasks([task], args.data_dir)[task], docs[task])
            if len(docs[task]) != scores["n"] or r.get("docs_sha256", {}).get(task, q.docs_fingerprint(docs[task])) \
                    != q.docs_fingerprint(docs[task]):
                sys.exit(f"above_chance: {path} scored other {task} documents than {args.data_dir}'s: pass the folder "
                         "it was scored on")
        above = q.above_chance_recovery({t: {**s, "chance": chance[t]} for t, s in r["tasks"].items()},
                                        r["teacher_tasks"], r["recovery_metric"])
        per_task = ", ".join(f"{t} {q.with_stderr(above[t], above['stderr'][t])}" for t in above["tasks"])
        print(f"{r['model']}: {q.with_stderr(above['average'], above['stderr']['average'])} above chance "
              f"({per_task}); recovery {r['recovery']['average']:.1f}%  [{path}]")


if __name__ == "__main__":
    main()
