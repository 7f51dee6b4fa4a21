"""Students to time with `linzoo eval speed`: every mixer's pure student, and the main job's hybrid layout, built from
the teacher's weights and saved as folders that `linzoo.load_model` reads. Their new parameters keep the plain start:
time and memory depend on the shapes, not on trained values (results/speed/cpu/ times the trained main-job student
beside them).

    python experiments/speed_cpu/speed_students.py --out /tmp/speed-students                # every pure student + gated_deltanet-hybrid
    python experiments/speed_cpu/speed_students.py --out /tmp/s --mixers gated_deltanet     # one
"""

import argparse
from pathlib import Path

import linzoo
from linzoo.loading import load_teacher

HYBRID = {"attn_layers": [6, 17, 18, 20, 21, 23], "window_size": 64}  # the main job's layout on SmolLM2-135M


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder that gets one subfolder per student")
    ap.add_argument("--teacher", default="embedded")
    ap.add_argument("--mixers", default="all", help="comma-separated, or all")
    ap.add_argument("--no_hybrid", action="store_true",
                    help="skip gated_deltanet-hybrid (the main job's layout; <first mixer>-hybrid without gated_deltanet)")
    args = ap.parse_args(argv)
    mixers = list(linzoo.MIXERS) if args.mixers == "all" else args.mixers.split(",")
    unknown = sorted(set(mixers) - set(linzoo.MIXERS))
    if unknown:
        ap.error(f"--mixers {','.join(unknown)}: not a mixer; use {', '.join(linzoo.MIXERS)}")
    teacher, tokenizer = load_teacher(args.teacher)
    hybrid = "gated_deltanet" if "gated_deltanet" in mixers else mixers[0]
    layouts = [(m, m, {}) for m in mixers] + ([] if args.no_hybrid else [(f"{hybrid}-hybrid", hybrid, HYBRID)])
    for name, mixer, layout in layouts:
        folder = Path(args.out) / name
        if (folder / "config.json").is_file():
            print(f"{folder}: there already")
            continue
        student = linzoo.linearize(teacher, mixer, **layout)
        student.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        print(f"{folder}: {mixer} {layout or 'pure'}")


if __name__ == "__main__":
    main()
