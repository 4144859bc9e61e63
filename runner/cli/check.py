"""`runner check MODEL.onnx`: a shipped deployment spec (specs/check_onnx.yaml) run on one
ONNX file, through `runner run` with that file set as the spec's candidate artifact, and
an exit code a CI job can gate on."""

from __future__ import annotations

import contextlib
import io
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from breakout_core.game.contract import CONTRACTS
from runner.cli.exit_codes import ExitCode, fail
from runner.cli.json_output import check_document, emit_json, json_option
from runner.cli.options import confirm_option, db_option, fail_fast_option, refuse_both, reports_option, set_option
from runner.cli.spec_loading import load_or_exit
from runner.spec.overrides import gate_changes
from runner.spec.questions import QUESTION_WORDS, AskedQuestion, question_for

CHECK_SPEC = Path(__file__).resolve().parents[2] / "specs" / "check_onnx.yaml"
WORTHY = "deployment-worthy"


def modified_gate_words(modified: list[str]) -> str:
    return "modified gate: " + " ".join(f"--set {text}" for text in modified)


def summary(verdicts: list[dict]) -> str:
    counts: dict[str, int] = {}
    for v in verdicts:
        counts[v["outcome"]] = counts.get(v["outcome"], 0) + 1
    return ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())) or "no verdicts"


@click.command()
@click.argument("model", metavar="MODEL.onnx", type=click.Path(path_type=Path))
@click.option("--baseline", metavar="OTHER.onnx", type=click.Path(path_type=Path), default=None,
              help="check against this ONNX model (default: the reference FP32 ONNX the spec names)")
@click.option("--input", "model_input", metavar="DTYPE:RANGE:LAYOUT", default=None,
              help="what MODEL's input takes, e.g. float32:0-255:nchw (DTYPE uint8|float32|float16, RANGE "
                   "0-255|0-1, LAYOUT nchw|nhwc); default: its breakout.input metadata, else uint8; a float input "
                   "must be declared")
@click.option("--baseline-input", metavar="DTYPE:RANGE:LAYOUT", default=None, help="the same for --baseline")
@click.option("--contract", "contract_name", type=click.Choice(sorted(CONTRACTS)), default=None,
              help="the game both models play: a shipped preset (docs/contracts.md); default breakout-v3")
@click.option("--question", type=click.Choice(sorted(QUESTION_WORDS)), default=None,
              help="what the check asks: identical (every verdict gates) or as-good (games, stalls and latency gate; "
                   "decisions and the 256 steps are shown); default: identical for a file in the baseline's "
                   "precision on its runtime, as-good for a converted file or another runtime")
@set_option
@confirm_option
@click.option("--confirm-again", is_flag=True,
              help="--confirm a model whose content this database confirmed before: the same confirmation games "
                   "again, recorded as such")
@fail_fast_option
@db_option
@reports_option
@click.option("--report/--no-report", default=False, show_default=True,
              help="write the run's HTML report under --reports (off: a CI job gates on the exit status and --json, "
                   "and `runner report RUN_ID` writes it later from the database)")
@json_option
@click.pass_context
def check(ctx: click.Context, model: Path, baseline: Path | None, model_input: str | None,
          baseline_input: str | None, contract_name: str | None, question: str | None, overrides: tuple[str, ...],
          confirm: bool, confirm_again: bool, fail_fast: bool, db: Path | None, reports_dir: Path, report: bool,
          as_json: bool) -> None:
    """Check MODEL.onnx against the reference agent's FP32 ONNX (or --baseline) on ONNX Runtime's
    CPU: the same action on 60 fixed states, batch-1 latency at most 10% slower, the same score
    over a 256-step closed loop, and full games in stages until they show less than 10% of the
    baseline's mean score lost (specs/check_onnx.yaml). A file in the baseline's precision on its
    runtime is asked whether it is identical, and every verdict gates; a converted file (FP16,
    INT8) or another runtime whether it is as good and not slower, and the decisions and the 256
    steps are shown without gating (--question chooses). Exit 0 when every gating verdict is
    deployment-worthy; 1 when any is rejected, inconclusive or unavailable (a gate does not pass
    without evidence); 2 for a model it cannot measure. A --baseline's fixed states come from its own games, under the
    contract the check plays (--contract, said first).

    The games are played on seeds drawn for MODEL (keyed by its content, graph and weights: a
    re-save plays the same games); --confirm draws them from the confirmation range, which no spec
    names, once per content in a database (--confirm-again plays them again, recorded). Each check
    says which check of the model it is. --json: one document on stdout (docs/json_output.md); what
    the check says otherwise goes to stderr once it ran."""
    request = CheckRequest(model, baseline, model_input, baseline_input, contract_name, question, overrides,
                           confirm or confirm_again, confirm_again, fail_fast, db, reports_dir, report)
    documents: list[dict] = []
    said = io.StringIO()  # with --json, what the check says goes to stderr once it ran (a refusal: its line alone)
    with contextlib.redirect_stdout(said) if as_json else contextlib.nullcontext():
        outcome = _check(ctx, request, documents.append if as_json else None)
    if as_json:
        click.echo(said.getvalue(), err=True, nl=False)
        emit_json(check_document(documents[0], model, baseline, outcome.passed, gate_changes(overrides),
                                 outcome.question_record(), {"model_content": outcome.model_content,
                                                             "check_number": outcome.check_number,
                                                             "estimate": outcome.estimate}))
    sys.exit(ExitCode.OK if outcome.passed else ExitCode.SAID_NO)


@dataclass(frozen=True)
class CheckRequest:
    """What the user asked of `runner check`, as its options say it."""

    model: Path
    baseline: Path | None
    model_input: str | None
    baseline_input: str | None
    contract_name: str | None
    question: str | None
    overrides: tuple[str, ...]
    confirm: bool
    confirm_again: bool
    fail_fast: bool
    db: Path | None
    reports_dir: Path
    report: bool


@dataclass(frozen=True)
class CheckOutcome:
    asked: AskedQuestion
    gating_names: list[str]  # the verdicts that gate under the question, in the spec's order
    verdicts: list[dict]  # the rows the run decided (a run --fail-fast stopped decides fewer)
    model_content: str  # the model's content hash, which keys its seeds and its checks
    check_number: int  # which check of that content in this database
    estimate: dict | None  # the games and minutes said before they started

    @property
    def gating(self) -> list[dict]:
        return [v for v in self.verdicts if v["verdict"] in self.gating_names]

    @property
    def diagnostics(self) -> list[dict]:
        return [v for v in self.verdicts if v["verdict"] not in self.gating_names]

    @property
    def passed(self) -> bool:
        gating = self.gating
        return len(gating) == len(self.gating_names) > 0 and all(v["outcome"] == WORTHY for v in gating)

    def question_record(self) -> dict:
        return {"asked": self.asked.question, "why": self.asked.why, "gating": self.gating_names,
                "diagnostics": [v["verdict"] for v in self.diagnostics]}


def _check(ctx: click.Context, request: CheckRequest, take_document=None) -> CheckOutcome:
    """The check, said on stdout; its verdicts, split by the question it asked. The run's --json
    document goes to `take_document` where one is given."""
    from breakout_core.conversion.model_content import model_content_sha256
    from runner.cli.check_contract import contract_sets, played_contract, unlabelled_line
    from runner.cli.check_inputs import prepare_models
    from runner.run.check_attempts import earlier_attempts, record_attempt
    from runner.run.check_estimate import games_estimate
    from runner.run.fail_fast import not_reached
    from runner.store.database import Store

    model, baseline, overrides = request.model, request.baseline, request.overrides
    if request.contract_name:
        refuse_both("--contract", overrides, ("contract.name", "contract"))
    chosen = [f"contract.name={request.contract_name}"] if request.contract_name else []
    contract = played_contract(CHECK_SPEC, (*chosen, *overrides))
    sets = [*prepare_models([("MODEL", model, "candidate", request.model_input),
                             ("--baseline", baseline, "baseline", request.baseline_input)], (*chosen, *overrides),
                            CHECK_SPEC, contract, announce=lambda: click.echo(f"check {model} under contract "
                                                                              f"{contract.described()}"),
                            full_action_option=None if contract.full_action_space else (
                                f"the contract option full_action_space, against a baseline of the same 18 actions: "
                                f"runner check {model} --baseline {baseline or 'YOUR_18_ACTION_FP32.onnx'} --set "
                                "contract.full_action_space=true")),
            *chosen]
    store = Store(request.db)
    if store.path.exists():  # read as the run will write it: a file an older runner wrote is upgraded first
        with store.writer():
            pass
    content = model_content_sha256(model)
    attempts = earlier_attempts(store, content)
    if request.confirm and attempts.confirmations and not request.confirm_again:
        fail(f"--confirm: this database confirmed MODEL {model}'s content ({content[:12]}) before; its confirmation "
             "games are drawn once per content and would be the same games: --confirm-again plays them again, "
             "recorded as such", ExitCode.BAD_INPUT)
    click.echo(attempts.words(content))
    note = unlabelled_line({"MODEL": model, "--baseline": baseline}, contract)
    if note:
        click.echo(note)
    modified = gate_changes(overrides)
    if modified:
        click.echo(f"{modified_gate_words(modified)}: its verdicts are not those of the shipped gate "
                   f"({CHECK_SPEC.name}), and their stated error rates do not hold")
    sets += contract_sets(contract, baseline, (*sets, *overrides))  # the baseline's own states, if any, stand
    spec = load_or_exit(CHECK_SPEC, (*sets, *overrides), check_files=False).spec
    asked = question_for(spec, asked=request.question)
    gating = asked.gating(spec)
    click.echo(f"question: {QUESTION_WORDS[asked.question]}; {asked.why}")
    estimate = games_estimate(store, spec)
    if estimate is not None:
        click.echo(estimate.words())
    run = ctx.find_root().command.get_command(ctx, "run")
    verdicts = ctx.invoke(run, spec_path=CHECK_SPEC, overrides=(*sets, *overrides), db=request.db,
                          reports_dir=request.reports_dir, report=request.report, fail_on=frozenset(),
                          fail_fast=request.fail_fast,
                          as_json=take_document is not None, confirm=request.confirm,
                          emit_document=take_document or emit_json, gating=frozenset(gating))
    outcome = CheckOutcome(asked, gating, verdicts, content, attempts.checks + 1,
                           estimate.record() if estimate else None)
    if verdicts:  # a confirmation --fail-fast stopped before its games played none of its seeds
        record_attempt(store, content=content, run_id=verdicts[0]["run_id"], question=asked.question,
                       confirm=request.confirm and not not_reached(spec, verdicts),
                       confirm_again=request.confirm_again, modified_gate=modified, passed=outcome.passed)
    shown = "; diagnostics, not gating: " + ", ".join(f"{v['verdict']} {v['outcome']}" for v in outcome.diagnostics)
    gate = f"; {modified_gate_words(modified)}" if modified else ""
    click.echo(f"check {'passed' if outcome.passed else 'failed'}: {summary(outcome.gating)}"
               f"{shown if outcome.diagnostics else ''} ({asked.question}; {model}{gate})")
    return outcome
