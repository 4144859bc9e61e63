"""Errors a run raises before it executes anything, which the CLI reports as the user's to fix."""


class ResumeRefused(ValueError):
    """`runner run --resume` cannot go on: no unfinished run of this spec text, settings this
    runner reads otherwise than the run stored, a start file that changed, trainings the spec
    does not make, or a contract that no longer rebuilds to its hash."""
