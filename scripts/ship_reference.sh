#!/usr/bin/env bash
# Ship a checkpoint of the reference training as the project's reference agent:
#   scripts/ship_reference.sh TRAIN_RUN_ID CHECKPOINT_FILE [DB]
# First the gate: the checkpoint plays the shipped agent on 30 held-out seeds under
# breakout-v3 (specs/reference_vs_previous_agent.yaml, with both files staged in a temporary
# folder, run as spec `reference_ship_gate`). Unless the paired interval of the score
# difference lies above zero, nothing in models/ changes and the script fails. Otherwise the
# replaced agent and its card move to models/reference_previous/, the checkpoint becomes
# models/reference/dqn_breakout.pt, and the repository's own spec records the comparison.
# Then it re-exports the ONNX files and the 60 fixed states (day22: later specs refuse stale
# exports), ships the training run's rows as Parquet (models/reference/training_rows),
# evaluates the agent on 30 seeds under breakout-v3, under breakout-v2 and under the serving
# contract (specs/reference_agent*.yaml), and writes models/reference/MODEL_CARD.md from those
# rows. Run again after a failure past the gate, it finds the checkpoint already shipped and
# goes on from there.
set -euo pipefail
cd "$(dirname "$0")/.."
run_id=${1:?training run id}; checkpoint=${2:?checkpoint file}; db=${3:-results.duckdb}
shipped=models/reference/dqn_breakout.pt
latest() { runner sql "SELECT run_id FROM runs WHERE spec_name = '$1' AND status = 'done' ORDER BY started_at DESC LIMIT 1" --csv --db "$db" | tail -1 | tr -d '\r'; }

if cmp -s "$checkpoint" "$shipped"; then
    echo "$checkpoint is the shipped agent already: going on with its exports, rows and card"
else
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    cp "$shipped" "$stage/previous.pt"
    cp "$checkpoint" "$stage/candidate.pt"
    sed -e "s#^name: reference_vs_previous_agent#name: reference_ship_gate#" \
        -e "s#\.\./models/reference/dqn_breakout\.pt#$stage/candidate.pt#" \
        -e "s#\.\./models/reference_previous/dqn_breakout\.pt#$stage/previous.pt#" \
        specs/reference_vs_previous_agent.yaml > "$stage/reference_ship_gate.yaml"
    gate_run=$(runner run "$stage/reference_ship_gate.yaml" --db "$db" --no-report | awk '/^run /{print $2; exit}')
    gate=$(runner sql "SELECT outcome FROM verdicts WHERE run_id = '$gate_run' AND verdict = 'shipped_beats_previous_agent'" \
           --csv --db "$db" | sed -n 2p | tr -d '\r')
    if [ "$gate" != "deployment-worthy" ]; then
        echo "not shipped: shipped_beats_previous_agent is '${gate:-missing}' (run $gate_run); models/ is unchanged" >&2
        exit 1
    fi
    mkdir -p models/reference_previous
    cp "$stage/previous.pt" models/reference_previous/dqn_breakout.pt
    cp models/reference/MODEL_CARD.md models/reference_previous/MODEL_CARD.md
    cp "$stage/candidate.pt" "$shipped"
    runner run specs/reference_vs_previous_agent.yaml --db "$db"
fi

runner run specs/day22_export.yaml --db "$db"
rm -rf models/reference/training_rows
runner export "$run_id" --out models/reference/training_rows --db "$db"
runner run specs/reference_agent.yaml --db "$db"
runner run specs/reference_agent_v2.yaml --db "$db"
runner run specs/reference_agent_served.yaml --db "$db"
runner model-card --checkpoint "$shipped" --train-run "$run_id" \
    --eval-run "$(latest reference_agent)" --eval-run "$(latest reference_agent_v2)" \
    --eval-run "$(latest reference_agent_served)" --db "$db"
