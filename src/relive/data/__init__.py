"""Offline datasets: D4RL-style generation, Minari and D4RL-HDF5 I/O, loaders, normalized scores."""
