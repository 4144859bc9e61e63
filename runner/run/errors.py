"""Errors a run raises that the CLI reports in one line: before it executes anything (the user's
to fix), or about the files it reads and writes."""


class ResumeRefused(ValueError):
    """`runner run --resume` cannot go on: no unfinished run of this spec text, settings this
    runner reads otherwise than the run stored, a start file that changed, trainings the spec
    does not make, or a contract that no longer rebuilds to its hash."""


class ArtifactBusy(ValueError):
    """A path this run writes is locked by another run that writes it; nothing was stored."""


class ArtifactChanged(ValueError):
    """A file loaded for an artifact is not the one this run recorded for it (its sha256 differs)."""
