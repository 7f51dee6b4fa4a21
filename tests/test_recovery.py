"""The headline metric: chance-normalised recovery, (s - c) / (t - c), over tasks where the teacher is clearly
above chance; and where it shows (quality.json via evaluate_quality's dict, the card, the Space's table)."""

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
