"""`train`: DQN-family training trials; every episode, diagnostics row and checkpoint stored.

A sweep lists values for any training field; each combination is a trial. `seeds:` trains
each trial once per training seed: a (trial, training seed) training is the unit of work, and
every row carries its training seed. With `score_seeds:` each training's final checkpoint plays
those episode seeds greedily; a training's score is its mean, and comparisons between trials
judge the scores over training seeds (mean, IQM and probability of improvement, each with a
95% CI over seeds that accounts for how few seeds there are: breakout_core.statistics.stats). With one
training seed per arm a comparison is inconclusive: one training run says nothing about the
spread between runs.

`runner run SPEC --resume` continues the spec's last unfinished run: each unfinished training
goes on from its last checkpoint (its replay refilled first), and rows the killed attempt
wrote past that checkpoint are superseded in the *_valid views.
"""

from __future__ import annotations

from runner.kinds.kind import Kind
from runner.kinds.shared.training_report import training_sections
from runner.kinds.train.compare import compare_train
from runner.kinds.train.execute import execute, trainings_not_made
from runner.kinds.train.metric_names import COMPARISON_METRICS, METRIC_NAMES, RAW_COMPARISONS
from runner.kinds.train.metrics import metrics, participants
from runner.kinds.train.model import TrainMeasurement
from runner.kinds.train.tables import MIGRATIONS, VIEWS
from runner.report.section import Section


def report(con, run_id: str, m: TrainMeasurement) -> list[Section]:
    return training_sections(con, run_id, m.name)




KIND = Kind(
    name="train",
    model=TrainMeasurement,
    migrations=MIGRATIONS,
    views=VIEWS,
    execute=execute,
    participants=participants,
    metric_names=METRIC_NAMES,
    metrics=metrics,
    report=report,
    needs_baseline=False,
    comparison_metrics=COMPARISON_METRICS + RAW_COMPARISONS,
    metric_problem=TrainMeasurement.metric_problem,
    episode_seeds=TrainMeasurement.episode_seeds,
    resume_problem=trainings_not_made,
    compare=compare_train,
    not_settings=frozenset({"sweep", "max_trials", "seeds", "score_seeds", "score_batch", "evaluate_checkpoints", "gif",
                            "diagnostics_every", "checkpoint_at", "checkpoint_every"}),
)
