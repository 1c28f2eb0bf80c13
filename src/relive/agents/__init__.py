"""Reference agents, one file per algorithm: SAC (with the RLPD options), Cal-QL, Double DQN."""
