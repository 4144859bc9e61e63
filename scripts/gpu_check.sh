#!/usr/bin/env bash
# The GPU rows in one command, on a machine with an NVIDIA GPU:
#   scripts/gpu_check.sh [--dry-run] [--db FILE]
# 1. installs what the README's GPU paragraph installs (the `gpu` extra, onnxruntime-gpu in
#    place of onnxruntime, torch's CUDA wheel of the pinned version; CUDA_TAG picks the wheel's
#    CUDA tag, default cu128);
# 2. runs the `gpu`-marked tests;
# 3. runs day23 (ONNX Runtime CUDA), day25 (FP16) and day26 (TensorRT) into one database
#    (default gpu_check.duckdb);
# 4. prints their verdicts and the runtime table (driver, CUDA, TensorRT, GPU name).
# On a machine without one it says so in one line and exits 0. --dry-run prints the steps
# without running any. A failed step is reported and the others still run; the exit status
# is then 1.
set -uo pipefail
cd "$(dirname "$0")/.."

dry_run=0
db=gpu_check.duckdb
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) dry_run=1; shift ;;
        --db) db=${2:?--db needs a file}; shift 2 ;;
        *) echo "scripts/gpu_check.sh: unknown argument '$1' (usage: scripts/gpu_check.sh [--dry-run] [--db FILE])" >&2
           exit 2 ;;
    esac
done
cuda_tag=${CUDA_TAG:-cu128}
torch_version=$(sed -n 's/^ *"torch==\([0-9.]*\)".*/\1/p' pyproject.toml | head -1)
specs=(specs/day23_ort_parity.yaml specs/day25_fp16.yaml specs/day26_tensorrt.yaml)

steps=(
    "pip install -e '.[gpu,test]'"
    "pip uninstall -y onnxruntime && pip install 'onnxruntime-gpu>=1.20'"
    "pip install --force-reinstall --no-deps torch==${torch_version} --index-url https://download.pytorch.org/whl/${cuda_tag}"
    "python -m pytest -q -m gpu"
)
for spec in "${specs[@]}"; do
    steps+=("runner run $spec --db $db --no-report")
done

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }

if [ "$dry_run" = 1 ]; then
    has_gpu && echo "# an NVIDIA GPU is here; the steps:" || echo "# no NVIDIA GPU here; on a machine with one, the steps:"
    for step in "${steps[@]}"; do echo "$step"; done
    echo "# then: the verdicts of the ${#specs[@]} runs and the runtime table (driver, CUDA, TensorRT, GPU name) from $db"
    exit 0
fi
if ! has_gpu; then
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi is missing or lists no GPU); nothing to check"
    exit 0
fi

failed=()
runs=()
for step in "${steps[@]}"; do
    echo "== $step"
    if [[ "$step" == runner\ run* ]]; then
        out=$(eval "$step" 2>&1 | tee /dev/stderr) || failed+=("$step")
        run=$(printf '%s\n' "$out" | awk '/^run /{print $2; exit}')
        [ -n "$run" ] && runs+=("'$run'")
    else
        eval "$step" || failed+=("$step")
    fi
done

if [ ${#runs[@]} -gt 0 ]; then
    in_runs=$(IFS=,; echo "${runs[*]}")
    echo "== verdicts"
    runner sql "SELECT r.spec_name, v.verdict, v.outcome, v.reason FROM verdicts v JOIN runs r USING (run_id)
                WHERE v.run_id IN ($in_runs) ORDER BY r.spec_name, v.verdict" --db "$db"
    echo "== runtimes"
    runner sql "SELECT DISTINCT r.spec_name, t.runtime, t.backend, t.available,
                       t.runtime_describe->>'\$.actual.device' AS device,
                       t.runtime_describe->>'\$.actual.device_name' AS gpu_name,
                       t.runtime_describe->>'\$.versions.tensorrt' AS tensorrt, t.reason
                FROM runtime_status t JOIN runs r USING (run_id) WHERE t.run_id IN ($in_runs) ORDER BY ALL" --db "$db"
fi
echo "== machine"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/GPU, driver: /'
nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/CUDA (driver): \1/p'
python -c "import torch; print('CUDA (torch):', torch.version.cuda)"
python -c "import tensorrt; print('TensorRT:', tensorrt.__version__)" 2>/dev/null || echo "TensorRT: not importable"
if [ ${#failed[@]} -gt 0 ]; then
    printf 'gpu_check: failed: %s\n' "${failed[@]}" >&2
    exit 1
fi
