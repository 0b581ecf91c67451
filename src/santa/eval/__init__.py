"""Accuracy evaluation: task generators, graders, sweeps and reports."""
