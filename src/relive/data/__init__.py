"""Offline datasets: Minari, D4RL-HDF5, LeRobot and .npz I/O, loaders and their checks, normalized scores (generating
D4RL-style levels trains an expert: ``relive.train.generate``)."""
