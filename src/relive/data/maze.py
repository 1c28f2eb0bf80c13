"""A scripted collector for Gymnasium-Robotics PointMaze (the sparse-reward, goal-reaching task of the
antmaze-style experiments in the ARB and Cal-QL papers; D4RL's maze2d data came from the same kind of
waypoint controller).

The controller plans a shortest path over the maze's free cells (breadth-first search), steers towards the
centre of the next cell with a PD law, and adds Gaussian action noise for coverage. Observations are the
flattened goal-conditioned dict: [achieved_goal(2), desired_goal(2), position(2), velocity(2)].
"""

from __future__ import annotations

from collections import deque

import numpy as np


def shortest_path(free: np.ndarray, start: tuple[int, int], goal: tuple[int, int]) -> list[tuple[int, int]]:
    """Cells from start to goal (inclusive) over free cells (4-connected), or [start] if unreachable."""
    prev: dict[tuple[int, int], tuple[int, int] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            break
        r, c = cell
        for nxt in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
            if 0 <= nxt[0] < free.shape[0] and 0 <= nxt[1] < free.shape[1] and free[nxt] and nxt not in prev:
                prev[nxt] = cell
                queue.append(nxt)
    if goal not in prev:
        return [start]
    path: list[tuple[int, int]] = []
    step: tuple[int, int] | None = goal
    while step is not None:
        path.append(step)
        step = prev[step]
    return path[::-1]


def waypoint_policy(env, rng: np.random.Generator, noise: float = 0.3, kp: float = 4.0, kd: float = 0.5):
    """A policy ``obs [1, 8] -> action [1, 2]`` for a (flattened) PointMaze env."""
    maze = env.unwrapped.maze
    free = np.asarray(maze.maze_map) != 1

    def act(obs: np.ndarray) -> np.ndarray:
        o = obs[0]
        goal, pos, vel = o[2:4], o[4:6], o[6:8]
        row, col = maze.cell_xy_to_rowcol(pos)
        cur = (int(row), int(col))
        row, col = maze.cell_xy_to_rowcol(goal)
        tgt = (int(row), int(col))
        path = shortest_path(free, cur, tgt)
        way = goal if len(path) <= 2 else np.asarray(maze.cell_rowcol_to_xy(np.array(path[1])), dtype=np.float64)
        a = kp * (way - pos) - kd * vel + noise * rng.normal(size=2)
        return np.clip(a, -1.0, 1.0).astype(np.float32)[None]

    return act
