"""The tables and views the `train` kind owns."""

from __future__ import annotations

MIGRATIONS = [
    (
        "0200_train",
        """
        CREATE TABLE train_attempts (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, trial VARCHAR NOT NULL,
            attempt INTEGER NOT NULL, from_transition BIGINT NOT NULL, config JSON NOT NULL,
            out_dir VARCHAR NOT NULL, started_at TIMESTAMPTZ NOT NULL
        );
        CREATE TABLE train_episodes (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, trial VARCHAR NOT NULL, attempt INTEGER NOT NULL,
            env_index INTEGER NOT NULL, transition BIGINT NOT NULL, episode_return DOUBLE NOT NULL,
            length INTEGER NOT NULL, ended_by VARCHAR NOT NULL
        );
        CREATE TABLE train_diagnostics (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, trial VARCHAR NOT NULL, attempt INTEGER NOT NULL,
            transition BIGINT NOT NULL, "update" BIGINT NOT NULL, loss DOUBLE, q_mean DOUBLE, target_mean DOUBLE,
            td_abs_mean DOUBLE, td_abs_max DOUBLE, grad_norm DOUBLE, epsilon DOUBLE, replay_frames BIGINT
        );
        CREATE TABLE train_checkpoints (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, trial VARCHAR NOT NULL, attempt INTEGER NOT NULL,
            transition BIGINT NOT NULL, path VARCHAR NOT NULL
        );
        CREATE TABLE train_results (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, trial VARCHAR NOT NULL, attempt INTEGER NOT NULL,
            transitions BIGINT NOT NULL, updates BIGINT NOT NULL, target_syncs BIGINT NOT NULL,
            wall_s DOUBLE NOT NULL, transitions_per_s DOUBLE NOT NULL
        );
        """,
    ),
    (
        "0201_train_results_measured",  # throughput after warm-up; how far the weights moved
        """
        ALTER TABLE train_results ADD COLUMN measured_transitions BIGINT;
        ALTER TABLE train_results ADD COLUMN measured_s DOUBLE;
        ALTER TABLE train_results ADD COLUMN weights_moved DOUBLE;
        """,
    ),
    (
        "0202_train_seeds",  # every row carries its training seed; rows stored before take their config's
        """
        ALTER TABLE train_attempts ADD COLUMN training_seed BIGINT;
        UPDATE train_attempts SET training_seed = CAST(json_extract_string(config, '$.seed') AS BIGINT);
        """ + "".join(f"""
        ALTER TABLE {table} ADD COLUMN training_seed BIGINT;
        UPDATE {table} t SET training_seed = a.training_seed FROM train_attempts a
        WHERE a.run_id = t.run_id AND a.measurement = t.measurement AND a.trial = t.trial AND a.attempt = t.attempt;
        """ for table in ("train_episodes", "train_diagnostics", "train_checkpoints", "train_results")) + """
        CREATE TABLE train_scores (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, trial VARCHAR NOT NULL,
            training_seed BIGINT NOT NULL, transition BIGINT NOT NULL, checkpoint VARCHAR NOT NULL,
            eval_seed BIGINT NOT NULL, score DOUBLE NOT NULL, steps INTEGER NOT NULL, ended_by VARCHAR NOT NULL
        );
        """,
    ),
    (
        "0203_train_resume_modes",  # how each attempt began; attempts stored before began fresh or from their state
        """
        ALTER TABLE train_attempts ADD COLUMN resume_mode VARCHAR;
        ALTER TABLE train_attempts ADD COLUMN resumed_from VARCHAR;
        UPDATE train_attempts SET resume_mode = CASE WHEN from_transition = 0 THEN 'fresh' ELSE 'trainer_state' END;
        """,
    ),
    (
        "0204_train_start_file_sha256",  # which bytes a checkpoint-mode attempt began from; unknown for earlier rows
        "ALTER TABLE train_attempts ADD COLUMN resumed_from_sha256 VARCHAR;",
    ),
    (
        # what the learner computed in: requested, chosen, why and the CPU flags it was chosen for; earlier rows
        # learned in fp32, the only precision there was
        "0205_train_learner_precision",
        """
        ALTER TABLE train_attempts ADD COLUMN learner_precision JSON;
        UPDATE train_attempts SET learner_precision = json_object('requested', 'fp32', 'chosen', 'fp32',
                                                                  'reason', 'before the setting existed');
        """,
    ),
]

_SUPERSEDED = """
    NOT EXISTS (SELECT 1 FROM train_attempts a
                WHERE a.run_id = t.run_id AND a.measurement = t.measurement AND a.trial = t.trial
                  AND a.training_seed = t.training_seed AND a.attempt > t.attempt AND t.transition > a.from_transition)
"""

VIEWS = [
    f"CREATE OR REPLACE VIEW train_episodes_valid AS SELECT t.* FROM train_episodes t WHERE {_SUPERSEDED}",
    f"CREATE OR REPLACE VIEW train_diagnostics_valid AS SELECT t.* FROM train_diagnostics t WHERE {_SUPERSEDED}",
    # a resumed attempt writes again the checkpoint file it resumed from when that was the last one (final.pt)
    f"""CREATE OR REPLACE VIEW train_checkpoints_valid AS SELECT t.* FROM train_checkpoints t WHERE {_SUPERSEDED}
        QUALIFY row_number() OVER (PARTITION BY run_id, measurement, trial, training_seed, transition, path
                                   ORDER BY attempt DESC) = 1""",
    """
    CREATE OR REPLACE VIEW train_curve AS
    SELECT *, avg(episode_return) OVER (
               PARTITION BY run_id, measurement, trial, training_seed ORDER BY transition, env_index
               ROWS BETWEEN 19 PRECEDING AND CURRENT ROW) AS moving_avg_20
    FROM train_episodes_valid
    """,
    """
    CREATE OR REPLACE VIEW train_trial_summary AS
    WITH ranked AS (
        SELECT *, row_number() OVER (PARTITION BY run_id, measurement, trial, training_seed
                                     ORDER BY transition DESC, env_index DESC) AS back
        FROM train_episodes_valid)
    SELECT run_id, measurement, trial, training_seed, count(*) AS episodes, max(transition) AS last_episode_transition,
           avg(episode_return) FILTER (WHERE back <= 20) AS last20_mean,
           median(episode_return) FILTER (WHERE back <= 20) AS last20_median,
           avg(episode_return) FILTER (WHERE back <= 10) - avg(episode_return) FILTER (WHERE back BETWEEN 11 AND 20)
               AS last20_trend,
           max(episode_return) AS best_return
    FROM ranked GROUP BY run_id, measurement, trial, training_seed
    """,
    """
    CREATE OR REPLACE VIEW train_seed_scores AS
    SELECT run_id, measurement, trial, training_seed, any_value(transition) AS transition, count(*) AS episodes,
           avg(score) AS score, count(DISTINCT score) AS distinct_scores, count(DISTINCT steps) AS distinct_lengths,
           count(*) FILTER (WHERE ended_by = 'time_limit') AS time_limit_episodes
    FROM train_scores GROUP BY run_id, measurement, trial, training_seed
    """,
]
