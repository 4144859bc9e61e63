"""Statistics the verdicts decide by: intervals, the staged games test and its operating
characteristics, the stalls test, latency over rounds."""
