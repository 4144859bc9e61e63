"""The training settings, declared once: each field's default, meaning and bounds.

The trainer reads a `TrainConfig`; the runner derives its spec model (`runner schema`
shows these descriptions) from the same fields, so a setting is added here and nowhere
else. Counts are transitions (one env step of one env), whatever the number of envs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from breakout_core.learning.learner_precision import LEARNER_PRECISIONS, LearnerPrecision

Algorithm = Literal["dqn", "double", "dueling"]  # dueling = dueling head + double targets
ALGORITHMS = get_args(Algorithm)
MAX_TRAINING_SEED = 2**32 - 1  # numpy and torch take 32-bit seeds
# Settings that last for the whole process once a trainer applies them: a process trains
# with one value of each (the trainer refuses another), so a run cannot sweep or mix them.
PROCESS_WIDE_SETTINGS = ("keep_freed_memory",)


def setting(default: Any, description: str, **bounds: Any) -> Any:
    """A dataclass field with what a spec model needs: its description and pydantic bounds
    (ge, gt, le, lt, pattern)."""
    return field(default=default, metadata={"description": description, **bounds})


@dataclass(frozen=True)
class TrainConfig:
    algorithm: Algorithm = setting(
        "dqn", "dqn (Nature DQN targets), double (Double DQN targets) or dueling (dueling head, double targets)")
    total_transitions: int = setting(100_000, "transitions to train, summed over the envs", gt=0)
    num_envs: int = setting(1, "envs stepped together, one action batch per step", ge=1, le=64)
    learning_rate: float = setting(1e-4, "Adam's learning rate", gt=0, lt=1)
    batch_size: int = setting(32, "transitions per gradient step", ge=1, le=4096)
    gamma: float = setting(0.99, "discount per agent step", gt=0, le=1)
    replay_capacity: int = setting(100_000, "transitions the replay holds, split evenly over the envs", ge=1_000,
                                   le=10**12)
    replay_device: str = setting("numpy", "where the replay lives: numpy (host memory) or a torch device",
                                 pattern=r"^(numpy|cpu|cuda(:\d+)?)$")
    learning_starts: int = setting(1_000, "transitions collected before the first gradient step", ge=0)
    train_every: int = setting(4, "transitions per gradient step", ge=1)
    target_sync_every: int = setting(1_000, "transitions between copies of the online network to the target", ge=1)
    epsilon_start: float = setting(1.0, "exploration rate at transition 0", ge=0, le=1)
    epsilon_end: float = setting(0.05, "exploration rate after the decay", ge=0, le=1)
    epsilon_decay_transitions: int = setting(10_000, "transitions of linear decay from start to end", ge=1)
    max_grad_norm: float = setting(10.0, "gradients are clipped to this global L2 norm", gt=0)
    life_loss_terminal: bool = setting(True, "a lost life ends bootstrapping (the game itself goes on)")
    seed: int = setting(42, "a 32-bit training seed: the envs' first games, exploration, initial weights",
                        ge=0, le=MAX_TRAINING_SEED)
    torch_threads: int | None = setting(None, "torch's intra-op threads; unset leaves torch's default", ge=1, le=256)
    channels_last: bool = setting(False, "the networks and batches in channels_last memory format")
    fused_adam: bool = setting(True, "Adam's fused kernel, where the torch build has it")
    input_major_linear: bool = setting(
        True, "the fully connected weights held (in, out) while training, so each one's gradient is the faster "
              "matrix product; checkpoints and states keep torch's (out, in)")
    keep_freed_memory: bool = setting(
        True, "glibc malloc keeps freed blocks for reuse rather than returning them to the OS, so a gradient step "
              "does not fault its tensors' pages in anew each time; glibc only. Process-wide and lasting: one value "
              "per run, neither swept nor mixed between measurements")
    compile: bool = setting(False, "torch.compile the TD loss (inductor); costs seconds to a minute at the first "
                                   "gradient step")
    diagnostics_every: int = setting(1_000, "transitions between diagnostics records (loss, Q, TD error, norms)",
                                     ge=1)
    measure_from: int = setting(0, "warm-up transitions before the throughput clock starts", ge=0)
    checkpoint_at: tuple[int, ...] = setting((), "transitions at which to save a checkpoint")
    learner_device: str = setting("cpu", "where the networks learn: cpu or a CUDA device",
                                  pattern=r"^(cpu|cuda(:\d+)?)$")
    learner_precision: LearnerPrecision = setting(
        "fp32", "the online network's forward and backward in the gradient step: fp32; bf16 (autocast, for a CPU "
                "with AMX, refused elsewhere); or auto (bf16 where the CPU has AMX, fp32 elsewhere). Weights, Adam's "
                "state, the replay, the TD targets and acting stay fp32")

    def __post_init__(self):
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {self.algorithm!r}; known: {', '.join(ALGORITHMS)}")
        if self.learner_precision not in LEARNER_PRECISIONS:
            raise ValueError(f"unknown learner_precision {self.learner_precision!r}; known: "
                             f"{', '.join(LEARNER_PRECISIONS)}")

    def epsilon(self, transitions: int) -> float:
        fraction = min(1.0, transitions / max(1, self.epsilon_decay_transitions))
        return self.epsilon_start + fraction * (self.epsilon_end - self.epsilon_start)
