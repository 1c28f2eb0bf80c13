"""Experiments: grids of runs (presets x tasks x seeds), a resumable runner and multi-seed reports."""
