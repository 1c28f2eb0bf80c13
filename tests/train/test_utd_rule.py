"""One meaning per setting (issue 46, item 1): RLPD's "the actor steps once per env step" is a rule of the agent
(``agent.actor_per_env_step``), not a number the ``--utd`` flag rewrites, so every way of setting the UTD ratio
trains the same agent, and config.json records the rule."""

from __future__ import annotations

import json

from relive.cli import main
from tests.train.test_trainer import TINY, assert_same_agent, cfg_for

RUN = ["rlpd", "--env", "Pendulum-v1", "--online-steps", "40", "--warmup", "30", "--seed", "3",
       "--set", "agent.num_qs=2", "--eval-every", "40", *TINY]


def test_utd_flag_and_set_train_bit_identical_agents_and_config_says_the_rule(tmp_path):
    flag, setting = tmp_path / "flag", tmp_path / "set"
    assert main(["train", *RUN, "--utd", "4", "--run-dir", str(flag)]) == 0
    assert main(["train", *RUN, "--set", "schedule.utd_ratio=4", "--run-dir", str(setting)]) == 0
    assert_same_agent(flag, setting)
    for run in (flag, setting):
        cfg = json.loads((run / "config.json").read_text())
        assert cfg["agent"]["actor_per_env_step"] is True and cfg["agent"]["actor_every"] == 1
        assert cfg["schedule"]["utd_ratio"] == 4
    summary = json.loads((flag / "summary.json").read_text())
    assert summary  # (the run finished)


def test_the_utd_flag_changes_one_setting_only():
    """Every setting `--utd 4` changes is the schedule's ratio (it rewrote agent.actor_every too, before)."""
    base = cfg_for(RUN, "R").to_dict()
    flagged = cfg_for([*RUN, "--utd", "4"], "R").to_dict()
    changed = {(section, k) for section, d in base.items() if isinstance(d, dict)
               for k in d if d[k] != flagged[section][k]}
    assert changed == {("schedule", "utd_ratio")}

