"""The experiment-spec runner: specs, the results store, verdicts and reports."""
