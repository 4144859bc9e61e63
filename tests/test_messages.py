import subprocess
import sys

from breakout_core.common.messages import described, first_line, last_line, process_failure


def test_first_line_skips_blank_lines_and_names_an_empty_message():
    assert first_line(ValueError("\n  Parser Error: syntax error at or near \"SELEC\"\nLINE 1: SELEC 1\n")) == \
        'Parser Error: syntax error at or near "SELEC"'
    assert first_line(RuntimeError()) == "no message"
    assert first_line(RuntimeError('Error(s) in loading state_dict for QNetwork:\n\tMissing key(s) in state_dict: '
                                   '"torso.0.weight".\n\tUnexpected key(s) in state_dict: "x".')) == \
        'Error(s) in loading state_dict for QNetwork: Missing key(s) in state_dict: "torso.0.weight".'
    assert first_line("   \n", empty="unreadable") == "unreadable"


def test_described_gives_the_type_and_the_first_line():
    assert described(KeyError("weights")) == "KeyError: 'weights'"
    assert described(OSError(""), "unparsable") == "OSError: unparsable"


def test_process_failure_quotes_the_last_line_of_a_real_process_stderr():
    finished = subprocess.run([sys.executable, "-c", "raise SystemExit('replay too small')"],
                              capture_output=True, text=True)
    assert process_failure("the learner side", finished) == "the learner side failed (exit 1): replay too small"
    silent = subprocess.run([sys.executable, "-c", "import sys; sys.exit(3)"], capture_output=True, text=True)
    assert process_failure("CleanRL", silent) == "CleanRL failed (exit 3): no message"


def test_last_line_is_where_a_traceback_says_what_ended_it():
    try:
        raise ValueError("slot 3 has no episode")
    except ValueError:
        import traceback

        text = traceback.format_exc()
    assert last_line(text) == "ValueError: slot 3 has no episode"
    assert last_line("\n \n") == "no message"
