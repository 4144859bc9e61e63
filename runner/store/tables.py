"""The store's own tables: runs, verdicts, artifacts, run files and spooled batches, and the
latest_verdicts view. Each kind declares its tables in its `Kind`; these are the ones every run has."""

from __future__ import annotations

from runner.store import schema

MIGRATIONS: list[tuple[str, str]] = [
    (
        "0001_runs",
        """
        CREATE TABLE runs (
            run_id VARCHAR PRIMARY KEY,
            spec_name VARCHAR NOT NULL,
            spec_path VARCHAR,
            spec_hash VARCHAR NOT NULL,
            spec_text VARCHAR NOT NULL,
            git_commit VARCHAR,
            contract_hash VARCHAR,
            contract JSON,
            host VARCHAR NOT NULL,
            pid INTEGER NOT NULL,
            cpu VARCHAR,
            gpu VARCHAR,
            packages JSON,
            started_at TIMESTAMPTZ NOT NULL,
            ended_at TIMESTAMPTZ,
            status VARCHAR NOT NULL CHECK (status IN ('running', 'done', 'failed', 'interrupted')),
            error VARCHAR
        );
        CREATE TABLE verdicts (
            run_id VARCHAR NOT NULL,
            verdict VARCHAR NOT NULL,
            measurement VARCHAR NOT NULL,
            candidate VARCHAR NOT NULL,
            baseline VARCHAR NOT NULL,
            outcome VARCHAR NOT NULL
                CHECK (outcome IN ('deployment-worthy', 'rejected', 'inconclusive', 'unavailable')),
            reason VARCHAR NOT NULL,
            evidence JSON NOT NULL,
            decided_at TIMESTAMPTZ NOT NULL
        );
        CREATE TABLE artifacts (
            run_id VARCHAR NOT NULL,
            measurement VARCHAR NOT NULL,
            label VARCHAR NOT NULL,
            path VARCHAR NOT NULL,
            bytes BIGINT NOT NULL
        );
        """,
    ),
    (
        # spool files already appended: a kill between the append and the unlink repeats nothing
        "0002_spooled_batches",
        """
        CREATE TABLE spooled_batches (
            batch VARCHAR PRIMARY KEY, "rows" BIGINT NOT NULL, appended_at TIMESTAMPTZ NOT NULL);
        """,
    ),
    (
        "0003_runs_heartbeat",  # a run's process, wherever it is, says every few seconds that it lives
        """
        ALTER TABLE runs ADD COLUMN heartbeat_at TIMESTAMPTZ;
        """,
    ),
    (
        "0004_runs_spec_settings",  # the spec as it ran, every default filled in by the runner that ran it
        """
        ALTER TABLE runs ADD COLUMN spec_settings JSON;
        """,
    ),
    (
        "0005_runs_overrides",  # the `--set path=value` arguments laid on the spec file, as given (NULL: none)
        """
        ALTER TABLE runs ADD COLUMN overrides JSON;
        """,
    ),
    (
        # the sha256 of each artifact a run read (at its start) or wrote (when it published it), which
        # every load of that artifact in the run is held to (runner.run.artifact_files)
        "0006_run_files",
        """
        CREATE TABLE run_files (
            run_id VARCHAR NOT NULL, artifact VARCHAR NOT NULL,
            role VARCHAR NOT NULL CHECK (role IN ('input', 'output')), path VARCHAR NOT NULL,
            sha256 VARCHAR NOT NULL, bytes BIGINT NOT NULL, recorded_at TIMESTAMPTZ NOT NULL
        );
        """,
    ),
    (
        "0007_runs_confirm",  # whether the run began with --confirm, which its --resume keeps (NULL: not stored)
        """
        ALTER TABLE runs ADD COLUMN confirm BOOLEAN;
        """,
    ),
]

VIEWS = [
    """
    CREATE OR REPLACE VIEW latest_verdicts AS  -- per machine and contract: one never stands in for another;
    SELECT v.*, r.spec_name, r.overrides, r.started_at, r.host, r.contract_hash  -- nor a spec --set otherwise
    FROM verdicts v JOIN runs r USING (run_id)
    QUALIFY row_number() OVER (PARTITION BY r.spec_name, r.overrides, v.verdict, r.host, r.contract_hash
                               ORDER BY v.decided_at DESC) = 1
    """,
]


schema.declare("store", MIGRATIONS, VIEWS)
