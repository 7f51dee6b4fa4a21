"""The headline metric: chance-normalised recovery, (s - c) / (t - c), over tasks where the teacher is clearly
above chance; and where it shows (quality.json via evaluate_quality's dict, the card, the Space's table)."""

import json

import pytest

from linzoo.evals.quality import CHANCE_SE, above_chance_recovery


def scores(**tasks):
    return {task: {"acc": value, "n": n, "chance": chance} for task, (value, n, chance) in tasks.items()}


def test_known_values():
    metric = {t: "acc" for t in ("arc", "wino", "lambada", "piqa")}
    teacher = scores(arc=(0.60, 1000, 0.25), wino=(0.51, 1000, 0.5), lambada=(0.30, 1000, 0.0), piqa=(0.65, 1000, 0.5))
    student = scores(arc=(0.425, 1000, 0.25), wino=(0.60, 1000, 0.5), lambada=(0.15, 1000, 0.0), piqa=(0.45, 1000, 0.5))
    out = above_chance_recovery(student, teacher, metric)
    assert out["arc"] == pytest.approx(50.0) and out["lambada"] == pytest.approx(50.0)
    assert out["piqa"] == pytest.approx(-1 / 3 * 100)  # below chance is negative, not clipped
    assert out["wino"] is None  # the teacher is 0.6 standard errors above chance: nothing to recover
    assert out["tasks"] == ["arc", "lambada", "piqa"] and out["min_teacher_se_above_chance"] == CHANCE_SE
    assert out["average"] == pytest.approx((50 + 50 - 100 / 3) / 3)


def test_a_chance_level_student_scores_zero_and_the_teacher_one_hundred():
    metric = {"arc": "acc"}
    teacher = scores(arc=(0.5, 400, 0.25))
    assert above_chance_recovery(scores(arc=(0.25, 400, 0.25)), teacher, metric)["average"] == pytest.approx(0.0)
    assert above_chance_recovery(teacher, teacher, metric)["average"] == pytest.approx(100.0)


def test_the_threshold_uses_the_teachers_standard_error():
    """t - c = 0.05: three standard errors need n >= 9 t (1 - t) / 0.05^2 = 900 documents at t = 0.5."""
    metric = {"x": "acc"}
    student = scores(x=(0.5, 100, 0.45))
    assert above_chance_recovery(student, scores(x=(0.5, 100, 0.45)), metric)["tasks"] == []
    assert above_chance_recovery(student, scores(x=(0.5, 1000, 0.45)), metric)["tasks"] == ["x"]
    assert above_chance_recovery(student, scores(x=(0.5, 100, 0.45)), metric)["average"] is None


def test_the_standard_error_is_what_resampling_the_documents_gives():
    """The students' and teacher's scores redrawn as binomial proportions of n documents: the spread of
    (s - c) / (t - c) is the reported standard error, per task and for the average (within 5 %)."""
    import numpy as np

    metric = {"arc": "acc", "piqa": "acc"}
    teacher = scores(arc=(0.60, 2000, 0.25), piqa=(0.65, 1800, 0.5))
    student = scores(arc=(0.425, 2000, 0.25), piqa=(0.58, 1800, 0.5))
    out = above_chance_recovery(student, teacher, metric)
    rng = np.random.default_rng(0)
    draws = {}
    for task in metric:
        s, t, c, n = student[task]["acc"], teacher[task]["acc"], student[task]["chance"], student[task]["n"]
        s_hat, t_hat = rng.binomial(n, s, 200_000) / n, rng.binomial(n, t, 200_000) / n
        draws[task] = (s_hat - c) / (t_hat - c) * 100
        assert out["stderr"][task] == pytest.approx(draws[task].std(), rel=0.05), task
    assert out["stderr"]["average"] == pytest.approx(((draws["arc"] + draws["piqa"]) / 2).std(), rel=0.05)
    assert out["stderr"]["arc"] == pytest.approx(3.525, abs=0.001)  # by hand: hypot(0.01105 / 0.35, 0.175 * 0.01095 / 0.35^2)


def test_the_standard_error_is_none_where_the_teacher_is_near_chance():
    out = above_chance_recovery(scores(x=(0.5, 100, 0.45)), scores(x=(0.5, 100, 0.45)), {"x": "acc"})
    assert out["stderr"] == {"x": None, "average": None}


def test_above_chance_script_scores_results_made_before_chance_was_kept(eval_data_dir, tmp_path, capsys):
    """experiments/above_chance/above_chance.py on a quality.json without `chance` (as results/gpu/eval_H200's are):
    chance comes from the same documents (arc_easy's all have 4 choices: 0.25), and other documents are refused."""
    import above_chance

    tasks = {"arc_easy": (0.525, 0.8), "piqa": (0.5, 0.51)}  # (student, teacher) acc_norm on the first 50 documents
    result = {"model": "student", "limit": 50, "recovery_metric": {t: "acc_norm" for t in tasks},
              "tasks": {t: {"acc_norm": s, "n": 50} for t, (s, _) in tasks.items()},
              "teacher_tasks": {t: {"acc_norm": te, "n": 50} for t, (_, te) in tasks.items()},
              "recovery": {"average": 80.0}}
    path = tmp_path / "quality.json"
    path.write_text(json.dumps(result))
    above_chance.main([str(path), "--data_dir", str(eval_data_dir)])
    line = capsys.readouterr().out
    # (0.525 - 0.25) / (0.8 - 0.25) = 50 %; piqa's teacher is 0.14 standard errors above chance: not counted
    assert line.startswith("student: 50.0% ± ") and "(arc_easy 50.0% ± " in line and "piqa" not in line.split("[")[0]
    result["tasks"]["piqa"]["n"] = result["teacher_tasks"]["piqa"]["n"] = 40
    path.write_text(json.dumps(result))
    with pytest.raises(SystemExit, match="scored other piqa documents"):
        above_chance.main([str(path), "--data_dir", str(eval_data_dir)])
