#!/usr/bin/env bash
# Ship a checkpoint of the reference training as the project's reference agent:
#   scripts/ship_reference.sh TRAIN_RUN_ID CHECKPOINT_FILE [DB]
# copies the checkpoint to models/reference/dqn_breakout.pt, re-exports the ONNX files and
# the 60 fixed states (day22: later specs refuse stale exports), ships the training run's
# rows as Parquet (models/reference/training_rows), evaluates the agent on 30 seeds
# under breakout-v3, under breakout-v2 and under the serving contract (specs/reference_agent*.yaml), and writes
# models/reference/MODEL_CARD.md from those rows.
set -euo pipefail
cd "$(dirname "$0")/.."
run_id=${1:?training run id}; checkpoint=${2:?checkpoint file}; db=${3:-results.duckdb}
cp "$checkpoint" models/reference/dqn_breakout.pt
runner run specs/day22_export.yaml --db "$db"
rm -rf models/reference/training_rows
runner export "$run_id" --out models/reference/training_rows --db "$db"
runner run specs/reference_agent.yaml --db "$db"
runner run specs/reference_agent_v2.yaml --db "$db"
runner run specs/reference_agent_served.yaml --db "$db"
latest() { runner sql "SELECT run_id FROM runs WHERE spec_name = '$1' AND status = 'done' ORDER BY started_at DESC LIMIT 1" --csv --db "$db" | tail -1 | tr -d '\r'; }
runner model-card --checkpoint models/reference/dqn_breakout.pt --train-run "$run_id" \
    --eval-run "$(latest reference_agent)" --eval-run "$(latest reference_agent_v2)" \
    --eval-run "$(latest reference_agent_served)" --db "$db"
