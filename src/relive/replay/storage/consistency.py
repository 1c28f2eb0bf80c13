"""One consistency check of a loaded storage: every invariant its writers keep, checked once after a checkpoint's
fields were each read and range-checked (``Storage.load_state_dict``), before anything reads them.

A checkpoint whose hashes match can still contradict itself (an edited file, re-hashed; a bug): an open episode
that the table says is finished, a flag that ends a row in the middle of an episode, a stamp no write could have
made. Each field alone is in range; together they are not, and the next write would build on the contradiction (and
write a checkpoint that can never load again). Every loader -- ``ReplayBuffer.load`` / ``from_state_dict`` for the
host and device buffers, the TorchRL and SB3 adapters, a run's ``--resume`` -- goes through
``Storage.load_state_dict``, which ends with :func:`check_loaded`; so no loaded buffer skips it.

The invariants (each refusal a ValueError naming the field, and the slot / episode / lane at fault):

- **stamps**: an offline row was written once (generation 1); an empty demonstration slot never (0); an online slot
  at most as often as the ring's clock has passed it (while no stamp can have wrapped).
- **lanes**: each stream's stored rows are one run of consecutive positions, oldest first in ring order, ending at
  its newest row and starting at its eviction bound (``lane_evicted``; one stream: the clock minus the ring).
- **episode table vs rows**: the live episodes cover every stored row exactly once, each with at least one row (one
  stream), with the row's ``episode_id`` and consecutive steps (legacy checkpoints' stored copies checked too); a
  live online episode ends within the positions its stream has written (a start moved by a multiple of the ring
  would map onto the same slots).
- **open episodes**: the episodes still receiving rows (``open_offline``, ``open_online``, ``open_lanes``) are
  unfinished records of their lane that end at its newest row; every unfinished record is one of them.
- **flags**: a row flagged terminated / truncated is the last row of a finished episode; a finished online episode's
  last row is flagged (an offline one need not be: the dataset's last episode ends when online rows start).
- **next_obs copies** (``dedup_next_obs``): a row that is the last of its episode keeps an explicit copy (no
  successor to read it from), no empty slot has one, and a stream's tail (the row its next write may continue) is
  its newest row; no slot's generation is below the stamp a tail recorded for it (generations only grow).

Column values (finite floats, 0/1 flags) are checked where they are read (``Storage._load_columns``, ``NextObsStore``,
``state_checks.state_array``), with the rules of a write. All vectorized: a few NumPy passes over the stored rows.
"""

from __future__ import annotations

import numpy as np

from relive.replay.storage.bookkeeping import GEN_MAX
from relive.replay.storage.episodes import LANE_BITS
from relive.types import OFFLINE, ONLINE, ORIGIN_NAMES

OWNER = "storage state"


def check_loaded(st) -> None:
    """Every invariant a loaded :class:`~relive.replay.storage.Storage` must hold (see the module's docstring); a
    ValueError naming the first one broken."""
    _check_stamps(st)
    _check_lanes(st)
    view, slots = _check_cover(st)
    _check_open_episodes(st)
    _check_flags(st, view, slots)
    if st.dedup_next_obs:
        _check_next_obs(st, view, slots)


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _lane_ends(st) -> np.ndarray:
    """One past each lane's newest position."""
    lanes = np.arange(len(st.lanes), dtype=np.int64)
    return (lanes << LANE_BITS) + np.asarray(st.lane_written, np.int64)


def _check_stamps(st) -> None:
    gen = st._meta["generation"]
    size, k = st.size, st.num_offline
    where = f"{OWNER} meta field 'generation'"
    bad = gen[:k] != 1
    if bad.any():
        s = _first(bad)
        raise ValueError(f"{where} slot {s}: offline rows are written once (stamp 1), got {int(gen[s])}")
    if not st.num_online_written:
        return
    base, cap, written = st.ring_base, st.online_capacity, st.num_online_written
    bad = gen[k:base] != 0
    if bad.any():
        s = k + _first(bad)
        raise ValueError(f"{where} slot {s}: an empty slot of the demonstration segment has stamp {int(gen[s])}, "
                         "not 0 (never written)")
    j = np.arange(size - base, dtype=np.int64)
    stamps = gen[base:size].astype(np.int64)
    bad = stamps < 1
    if k + written < GEN_MAX:  # (no stamp can have wrapped): slot j was written at most once per pass of the clock
        bad |= stamps > (written - j + cap - 1) // cap
    if bad.any():
        s = _first(bad)
        raise ValueError(f"{where} slot {base + s}: stamp {int(stamps[s])} is not one the writes could have made "
                         f"({written} online rows written into a ring of {cap})")


def _check_lanes(st) -> None:
    where = f"{OWNER} episodes field 'lane_evicted'"
    evicted = st.episodes.lane_evicted
    nlanes = len(st.lanes)
    if evicted.size != max(nlanes, 1):
        raise ValueError(f"{where}: {evicted.size} eviction bounds for {nlanes} streams")
    ends = _lane_ends(st)
    if st._pos is None:  # one stream (or none): positions are the ring's clock
        expected = max(0, st.num_online_written - st.online_capacity)
        if int(evicted[0]) != expected:
            raise ValueError(f"{where}: stream {st.lanes[0] if st.lanes else 0}'s rows below position "
                             f"{int(evicted[0])} are recorded as overwritten, but a ring of {st.online_capacity} "
                             f"rows after {st.num_online_written} written holds them from {expected}")
        return
    # several streams: in ring order (oldest first) each lane's stored positions are consecutive, from its bound to
    # its newest row
    n = st.num_online
    clock = st.num_online_written
    pos = st._pos[st.ring_slot(np.arange(clock - n, clock, dtype=np.int64))]
    lane = pos >> LANE_BITS
    order = np.argsort(lane, kind="stable")
    lp, ll = pos[order], lane[order]
    same = ll[1:] == ll[:-1]
    bad = same & (np.diff(lp) != 1)
    if bad.any():
        i = _first(bad)
        raise ValueError(f"{OWNER} streams field 'position': stream {st.lanes[int(ll[i])]}'s stored rows are not "
                         f"consecutive in ring order (position {int(lp[i + 1]) & ((1 << LANE_BITS) - 1)} after "
                         f"{int(lp[i]) & ((1 << LANE_BITS) - 1)})")
    lo = ends.copy()  # a lane without stored rows: every row overwritten, its bound at its end
    hi = ends.copy()
    if ll.size:
        first = np.concatenate(([0], np.flatnonzero(~same) + 1))
        last = np.concatenate((first[1:] - 1, [ll.size - 1]))
        lo[ll[first]] = lp[first]
        hi[ll[last]] = lp[last] + 1
    bad = (lo != evicted[:nlanes]) | (hi != ends)
    if bad.any():
        i = _first(bad)
        raise ValueError(f"{where}: stream {st.lanes[i]} holds positions {int(lo[i]) - (i << LANE_BITS)} to "
                         f"{int(hi[i]) - (i << LANE_BITS)} of its {st.lane_written[i]} rows, but its bound says "
                         f"{int(evicted[i]) - (i << LANE_BITS)} (rows before it overwritten)")


def _check_cover(st):
    """The live episodes cover the stored rows exactly once, with their ids and steps; returns (the live episodes,
    their rows' slots in episode then time order)."""
    size, k, base = st.size, st.num_offline, st.ring_base if st.num_online_written else st.num_offline
    meta = st._meta
    if (meta["generation"][:k] < 1).any() or (meta["generation"][base:size] < 1).any():
        raise ValueError(f"{OWNER} meta field 'generation': a stored row has generation < 1")
    legacy, st._legacy_meta = st._legacy_meta, {}
    lo = st._legacy_meta_lo
    if "source" in legacy:
        src = legacy["source"]
        if (src[: max(k - lo, 0)] != OFFLINE).any() or (src[base - lo :] != ONLINE).any():
            raise ValueError(f"{OWNER} meta field 'source' disagrees with num_offline")
    if not np.isin(meta["origin"][:size], list(ORIGIN_NAMES)).all():
        raise ValueError(f"{OWNER} meta field 'origin': values must be in {ORIGIN_NAMES}")
    view = None
    try:
        view = st.episodes.live()
        short = view.length < (0 if st.episodes.multi else 1)  # (one stream: every live episode holds a row)
        if short.any():
            raise ValueError(f"{OWNER} field 'episodes': live episode {int(view.ids[_first(short)])} holds "
                             f"{int(view.length[_first(short)])} stored rows")
        slots = st.episode_slots(view.start, view.length, view.source)
        bad = slots.size != st.num_rows or (slots.size and (slots.min() < 0 or slots.max() >= size))
        if not bad:
            bad = (np.bincount(slots, minlength=size) != st.stored_mask()).any()
    except (IndexError, OverflowError):
        bad = True
    if bad:
        raise ValueError(f"{OWNER} field 'episodes': the live episodes do not cover the {st.num_rows} "
                         "stored rows exactly once (episode table inconsistent with the rows)")
    online = view.source == ONLINE  # positions past a stream's clock would alias its stored rows (slot = position
    if online.any():  # modulo the ring): every live online episode ends within the rows its stream has written
        start, end = view.start[online], view.start[online] + view.length[online]
        lane = start >> LANE_BITS
        ends = _lane_ends(st)
        known = lane < ends.size
        beyond = ~known
        beyond[known] = end[known] > ends[lane[known]]
        if beyond.any():
            i = _first(beyond)
            raise ValueError(f"{OWNER} field 'episodes': live episode {int(view.ids[online][i])} ends at position "
                             f"{int(end[i]) & ((1 << LANE_BITS) - 1)} of its stream, past the rows the stream has "
                             "written")
    ids = np.repeat(view.ids, view.length)
    wrong = st.episode_ids(slots) != ids
    if wrong.any():
        s = int(slots[_first(wrong)])
        raise ValueError(f"{OWNER} meta field 'episode_id' slot {s}: {int(st.episode_ids([s])[0])} disagrees with "
                         f"the episode table (episode {int(ids[_first(wrong)])} holds that slot)")
    for name, query in (("step_in_episode", st.step_of), ("stream", st.stream_of)):
        if name in legacy:  # an old checkpoint's stored copy: it must be what the rows say
            mine = slots >= lo
            if (legacy[name][slots[mine] - lo] != query(slots[mine])).any():
                what = "is not consecutive within its episodes" if name == "step_in_episode" else \
                    "disagrees with the streams' lanes"
                raise ValueError(f"{OWNER} meta field {name!r} {what}")
    return view, slots


def _check_open_episodes(st) -> None:
    ep = st.episodes
    n = ep._num_records
    rec = {name: arr[:n] for name, arr in ep._rec.items()}
    base = ep.id_base
    ids = np.arange(n, dtype=np.int64)
    ids[base:] += ep._shift
    ends = _lane_ends(st)
    opened = [("open_offline", ep._open[OFFLINE], -1), ("open_online", ep._open[ONLINE], 0)]
    opened += [(f"open_lanes (stream {st.lanes[lane] if lane < len(st.lanes) else lane})", eid, lane)
               for lane, eid in sorted(ep._open_lanes.items())]
    seen = set()
    for field, eid, lane in opened:
        if eid == -1:
            continue
        where = f"{OWNER} episodes field {field!r}"
        if eid in seen:
            raise ValueError(f"{where}: episode {eid} is open in two places")
        seen.add(eid)
        if lane == -1:
            if not 0 <= eid < ep.num_offline_episodes:
                raise ValueError(f"{where}: episode {eid} is not an offline episode")
            end = st.num_offline
        else:
            if lane >= len(st.lanes) or not max(base, ep.first_live_online_id) <= eid < ep.next_id:
                raise ValueError(f"{where}: episode {eid} is not a live online episode of a known stream")
            end = int(ends[lane])
        r = ep._row(eid)
        if rec["finished"][r]:
            raise ValueError(f"{where}: episode {eid} is recorded as still receiving rows, but the episode table "
                             "says it is finished")
        if (lane != -1 and int(rec["start"][r]) >> LANE_BITS != lane) or int(rec["start"][r] + rec["length"][r]) != end:
            raise ValueError(f"{where}: episode {eid} is recorded as still receiving rows, but it does not end at its "
                             "stream's newest row")
    unfinished = ids[~rec["finished"].astype(bool)]
    stray = unfinished[~np.isin(unfinished, list(seen))]
    if stray.size:
        raise ValueError(f"{OWNER} episodes field 'rec_finished': episode {int(stray[0])} is unfinished but no stream "
                         "is writing it (an unfinished episode must be its stream's open one)")


def _check_flags(st, view, slots) -> None:
    end = st.columns["terminated"].take(slots) | st.columns["truncated"].take(slots)
    last = np.zeros(slots.size, bool)
    nonempty = view.length > 0
    last[np.cumsum(view.length)[nonempty] - 1] = True
    finished = np.repeat(view.finished, view.length)
    bad = end & ~(last & finished)
    if bad.any():
        i = _first(bad)
        why = "it is not its episode's last row" if not last[i] else "its episode is unfinished (still open)"
        raise ValueError(f"{OWNER} columns 'terminated' / 'truncated' slot {int(slots[i])}: the row is flagged as an "
                         f"episode's end, but the episode table says {why}")
    must = last & finished & (np.repeat(view.source, view.length) == ONLINE)
    bad = must & ~end
    if bad.any():
        i = _first(bad)
        episode = int(np.repeat(view.ids, view.length)[i])
        raise ValueError(f"{OWNER} columns 'terminated' / 'truncated' slot {int(slots[i])}: the last row of finished "
                         f"online episode {episode} is flagged neither terminated nor truncated")


def _check_next_obs(st, view, slots) -> None:
    nx = st._nx
    where = f"{OWNER} next_obs_store"
    if st.has_gap:
        bad = nx.has(np.arange(st.num_offline, st.ring_base))
        if bad.any():
            raise ValueError(f"{where} field 'slots': empty slot {st.num_offline + _first(bad)} has a next_obs copy")
    last = np.zeros(slots.size, bool)
    nonempty = view.length > 0
    last[np.cumsum(view.length)[nonempty] - 1] = True
    bad = last & ~nx.has(slots)
    if bad.any():
        raise ValueError(f"{where} field 'slots': slot {int(slots[_first(bad)])} is the last stored row of its "
                         "episode but has no next_obs copy (there is no next row to read it from)")
    gen = st._meta["generation"]
    ends = _lane_ends(st)
    for key, (slot, stamp) in nx.tails.items():
        if not -1 <= key < len(st.lanes):
            raise ValueError(f"{where} field 'tails': stream lane {key} does not exist")
        if int(gen[slot]) < stamp:  # a slot's generation only grows (it wraps after 2^31 writes of that one slot)
            raise ValueError(f"{where} field 'tails': slot {slot} has generation {int(gen[slot])}, below the stamp "
                             f"{stamp} the tail recorded when that slot was written")
        if int(gen[slot]) != stamp:
            continue  # (the slot was written again since: the tail is inert)
        if key == -1:
            newest = st.num_offline - 1
        else:
            pos = int(ends[key]) - 1
            newest = int(st.online_slot(np.array([pos]))[0]) if pos >= int(st.episodes.lane_evicted[key]) else -1
        if slot != newest:
            raise ValueError(f"{where} field 'tails': slot {slot} (stamp {stamp}) is recorded as the newest row of "
                             f"{'the offline rows' if key == -1 else f'stream {st.lanes[key]}'}, which is not "
                             "where that row is")
