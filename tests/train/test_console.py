"""The browser console (issue 47 item 1): key / gamepad mapping, the intervener it drives, its server (FastAPI
TestClient: token, host and origin checks, frames, key events, pause / resume) and the intervention registry that
makes it (and a plug-in's device) ``intervention.kind``."""

from __future__ import annotations

import io
import json
import socket
import threading

import numpy as np
import pytest

from relive.config import ExperimentConfig, InterventionConfig, override
from relive.envs import EnvSpec
from relive.registry import INTERVENERS, InterventionBuild, intervener_entry
from relive.train.intervention import DeviceIntervener, DeviceState, build_intervener, register_device, renders

fastapi = pytest.importorskip("fastapi", reason="the console extra (fastapi) is not installed")
pytest.importorskip("PIL", reason="the console extra (Pillow) is not installed")
from fastapi.testclient import TestClient  # noqa: E402
from starlette.websockets import WebSocketDisconnect  # noqa: E402

from relive.train.console import ConsoleIntervener, ConsoleServer, KeyMap, MetricsTail, create_app  # noqa: E402

LOCAL = "http://127.0.0.1:8765"
WS = "ws://127.0.0.1:8765/ws"  # (TestClient's websockets take the whole URL: their host is checked)


def box(low, high) -> EnvSpec:
    low, high = np.asarray(low, np.float32), np.asarray(high, np.float32)
    return EnvSpec("Box-v0", (3,), False, low.shape, 0, low, high, None)


PENDULUM = box([-2.0], [2.0])


class FakeEnv:
    """render() returns a frame of one colour and counts the calls."""

    def __init__(self, colour=(200, 30, 30)):
        self.colour, self.renders = colour, 0

    def render(self):
        self.renders += 1
        frame = np.zeros((48, 64, 3), np.uint8)
        frame[:] = self.colour
        return frame


def console(spec=PENDULUM, host="127.0.0.1", start_paused=False, env=None, run_dir=None) -> ConsoleIntervener:
    return ConsoleIntervener(env or FakeEnv(), spec, host=host, run_dir=run_dir, start_paused=start_paused,
                             serve=False)


def test_keys_drive_each_dimension_to_its_bound_and_the_pad_scales_its_axes_to_the_box():
    km = KeyMap(box([0.0, -1.0], [1.0, 3.0]))
    assert km.action(set(), None) == (False, None)
    assert km.action({"KeyZ"}, None) == (False, None)  # not bound: no takeover
    taken, a = km.action({"ArrowRight"}, None)
    assert taken and a.tolist() == [1.0, 1.0]  # dim 0 to its high bound, dim 1 at its middle
    assert km.action({"ArrowDown"}, None)[1].tolist() == [0.5, -1.0]
    assert km.action({"ArrowLeft", "ArrowRight", "ArrowUp"}, None)[1].tolist() == [0.5, 3.0]  # both: the middle
    assert km.action({"Space"}, None)[1].tolist() == [0.5, 1.0]  # take over, hold the middle
    assert km.action({"ArrowUp"}, None, gain=0.5)[1].tolist() == [0.5, 2.0]  # half way from the middle
    assert km.action(set(), {"engaged": True, "axes": [0.5, -1.0, 0.9]})[1].tolist() == [0.75, -1.0]
    assert km.action(set(), {"engaged": True, "axes": [7.0]})[1].tolist() == [1.0, 1.0]  # clipped; missing axis 0
    assert km.action(set(), {"engaged": False, "axes": [1.0, 1.0]}) == (False, None)
    assert km.action({"ArrowLeft"}, {"engaged": True, "axes": [1.0, 1.0]})[1].tolist() == [0.0, 1.0]  # keys win
    assert [b.get("low_key") for b in km.bindings()] == ["ArrowLeft", "ArrowDown", None]


def test_discrete_actions_are_the_digit_keys():
    km = KeyMap(EnvSpec("D-v0", (4,), True, (), 3, None, None, None))
    assert km.action({"Digit2"}, None)[1].item() == 2
    assert km.action({"Digit2", "Digit1"}, None)[1].item() == 1  # the lowest held
    assert km.action({"Digit5"}, None) == (False, None)  # no action 5
    assert [b["key"] for b in km.bindings()] == ["Digit0", "Digit1", "Digit2"]


def test_the_console_intervener_executes_the_held_keys_and_counts_episodes():
    c = console(box([-1.0, -1.0], [1.0, 1.0]))
    proposed = np.array([0.3, -0.2], np.float32)
    assert c(None, proposed)[0] is False
    c.state.set_keys(["ArrowLeft", "ArrowUp", "not a key", 3])
    taken, action = c(None, proposed)
    assert taken and action.tolist() == [-1.0, 1.0] and action.dtype == np.float32
    c.state.release()
    assert c(None, proposed) == (False, pytest.approx(proposed))
    c.on_episode_start()  # 1 of 3 steps intervened
    assert c.state.episode_rates[-1] == pytest.approx(1 / 3) and c.state.episodes == 1
    assert c.state.steps == 3 and c.state.intervened_steps == 1
    assert c.state_dict() == {}


def test_a_console_bound_elsewhere_refuses_requests_without_its_token():
    c = console(host="0.0.0.0")
    assert c.token and len(c.token) >= 24
    client = TestClient(create_app(c), base_url="http://192.0.2.7:8765")
    refused = client.get("/status")
    assert refused.status_code == 401 and "token" in refused.json()["detail"]
    wrong = c.token[:-1] + ("y" if c.token.endswith("x") else "x")  # (one character off; a token may end in "x")
    assert client.get("/status", params={"token": wrong}).status_code == 401
    assert client.get("/", params={"token": c.token}).status_code == 200
    assert client.get("/status", headers={"Authorization": f"Bearer {c.token}"}).status_code == 200
    assert client.post("/pause").status_code == 401 and not c.state.paused
    with pytest.raises(WebSocketDisconnect) as e, client.websocket_connect("ws://192.0.2.7:8765/ws"):
        pass
    assert e.value.code == 1008 and "token" in e.value.reason
    with client.websocket_connect(f"ws://192.0.2.7:8765/ws?token={c.token}") as ws:
        assert "bindings" in json.loads(ws.receive_text())


def test_a_local_console_needs_no_token_but_refuses_other_hosts_and_origins():
    c = console()
    assert c.token is None and c.url.endswith(":0/")
    client = TestClient(create_app(c), base_url=LOCAL)
    assert client.get("/status").status_code == 200
    assert client.get("/status", headers={"Host": "evil.example:8765"}).status_code == 401  # DNS rebinding
    with pytest.raises(WebSocketDisconnect) as e, client.websocket_connect(WS, headers={"Origin": "http://evil.example"}):
        pass
    assert "origin" in e.value.reason
    with client.websocket_connect(WS, headers={"Origin": LOCAL}) as ws:
        assert json.loads(ws.receive_text())["clients"] == 1


def test_the_frames_endpoint_serves_the_last_rendered_frame_as_jpeg():
    from PIL import Image

    c = console(env=FakeEnv((200, 30, 30)))
    client = TestClient(create_app(c), base_url=LOCAL)
    assert client.get("/frame").status_code == 204  # nothing rendered yet
    c(None, np.zeros(1, np.float32))  # the training thread renders (a frame is wanted)
    c(None, np.zeros(1, np.float32))  # (and not again until a page took it)
    assert c.env.renders == 1
    r = client.get("/frame")
    assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg"
    img = np.asarray(Image.open(io.BytesIO(r.content)))
    assert img.shape == (48, 64, 3) and np.abs(img.astype(int) - [200, 30, 30]).max() < 12


def test_key_events_over_the_websocket_become_the_executed_action_and_a_closed_page_lets_go():
    c = console()
    client = TestClient(create_app(c), base_url=LOCAL)
    with client.websocket_connect(WS) as ws:
        ws.send_text(json.dumps({"type": "keys", "down": ["ArrowRight"]}))
        ws.send_text(json.dumps({"type": "gain", "value": 0.25}))
        ws.send_text("not json")  # ignored
        for _ in range(1000):  # status messages until the server has read the events (frames are bytes)
            msg = ws.receive()
            if msg.get("text") and json.loads(msg["text"])["gain"] == 0.25:
                break
        status = json.loads(msg["text"])
        assert status["held"] == ["ArrowRight"] and status["bindings"][0]["high_key"] == "ArrowRight"
        assert c(None, np.zeros(1, np.float32)) == (True, pytest.approx([0.5]))  # 0 + 0.25 * 2
    assert c.state.held == set() and c(None, np.zeros(1, np.float32))[0] is False  # the page left


def test_pause_blocks_the_training_thread_at_its_next_step_until_resume():
    c = console(start_paused=True)
    client = TestClient(create_app(c), base_url=LOCAL)
    out: list = []
    step = threading.Thread(target=lambda: out.append(c(None, np.zeros(1, np.float32))))
    step.start()
    for _ in range(10_000):  # entering the pause renders the frame it stands at
        if c.env.renders:
            break
        step.join(0.001)
    assert c.env.renders == 1 and step.is_alive() and out == []  # waiting for Resume
    assert client.get("/status").json()["paused"] is True
    assert client.post("/resume").json() == {"paused": False}
    step.join(10)
    assert not step.is_alive() and out[0][0] is False
    client.post("/pause")
    assert c.state.paused and not c.state.resumed.is_set()


def test_metrics_are_read_from_whole_online_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"env_step": 0, "phase": "offline", "train/episode_return": 1.0}) + "\n"
                    + json.dumps({"env_step": 50, "phase": "online", "train/episode_return": -3.0,
                                  "collect/intervention_rate": float("nan"), "replay/offline_fraction": 0.5}) + "\n"
                    + '{"env_step": 100, "phase": "onl')  # a line still being written
    tail = MetricsTail(path)
    assert tail.read() == [{"env_step": 50, "train/episode_return": -3.0, "collect/intervention_rate": None,
                            "replay/offline_fraction": 0.5}]
    with open(path, "a") as f:
        f.write('ine", "train/episode_return": -1.0}\n')
    assert [r["env_step"] for r in tail.read()] == [50, 100]


def test_a_port_in_use_is_a_clear_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        with pytest.raises(ValueError, match="console_port"):
            ConsoleServer(create_app(console()), "127.0.0.1", taken.getsockname()[1])


def test_intervention_kinds_come_from_the_registry():
    assert [intervener_entry(n).name for n in ("none", "scripted", "device", "console")] == [
        "none", "scripted", "device", "console"]
    assert {"none", "scripted", "device", "console"} <= set(INTERVENERS)
    assert intervener_entry("console").renders and not intervener_entry("scripted").renders
    with pytest.raises(ValueError, match=r"intervention.kind 'gamepad9' is not registered; known: .*console"):
        InterventionConfig(kind="gamepad9")
    with pytest.raises(ValueError, match="console_port"):
        InterventionConfig(kind="console", console_port=70_000)
    cfg = override(ExperimentConfig(), ["intervention.kind=console", "intervention.console_port=0"])
    assert renders(cfg) == "rgb_array" and renders(ExperimentConfig()) is None


@register_device("test_console_pad")
class AlwaysLeft:
    """A device that always holds its button with the action at -10 (clipped to the box)."""

    def __init__(self, spec):
        self.dim = int(np.prod(spec.action_shape))

    def read(self) -> DeviceState:
        return DeviceState(True, np.full(self.dim, -10.0, np.float32))


def test_a_registered_device_is_an_intervention_kind():
    cfg = override(ExperimentConfig(), ["intervention.kind=test_console_pad"])
    intervener = build_intervener(cfg, PENDULUM, None)
    assert isinstance(intervener, DeviceIntervener)
    assert intervener(None, np.zeros(1, np.float32)) == (True, pytest.approx([-2.0]))
    assert build_intervener(ExperimentConfig(), PENDULUM, None) is None
    entry = intervener_entry("test_console_pad")
    assert "always holds" in entry.doc and isinstance(entry.build(InterventionBuild(cfg, PENDULUM, None)),
                                                      DeviceIntervener)


PLUGIN = '''
import numpy as np
from relive.train.intervention import DeviceState, register_device


@register_device("plugin_pad")
class PluginPad:
    """Holds its button on every other step, with the action at the box's high bound."""

    def __init__(self, spec):
        self.dim, self.reads = int(np.prod(spec.action_shape)), 0

    def read(self):
        self.reads += 1
        return DeviceState(self.reads % 2 == 1, np.full(self.dim, 100.0, np.float32))
'''


def test_a_plugin_device_drives_a_run_from_the_command_line(tmp_path):
    from relive import cli
    from relive.replay import ReplayBuffer

    (tmp_path / "pad.py").write_text(PLUGIN)
    run = tmp_path / "run"
    assert cli.main(["--plugin", str(tmp_path / "pad.py"), "train", "sac", "--env", "Pendulum-v1", "--set",
                     "env.max_episode_steps=20", "--replay", "symmetric", "--warmup", "0", "--online-steps", "40",
                     "--eval-every", "1000", "--capacity", "100", "--set", "intervention.kind=plugin_pad",
                     "--set", "intervention.demo_capacity=50", "--set", "run.save_final_buffer=true",
                     "--set", "agent.hidden=[8,8]", "--batch-size", "8",
                     "--eval-episodes", "1", "--no-progress", "--run-dir", str(run)]) == 0
    st = ReplayBuffer.load(run / "buffer_final").storage
    demos = slice(st.num_before_online, st.num_offline)
    assert st.num_offline - st.num_before_online == 20  # every other step of 40
    assert (st.columns["action"][demos] == 2.0).all() and st.columns["intervened"][demos].all()
    assert json.loads((run / "config.json").read_text())["intervention"]["kind"] == "plugin_pad"


def test_the_console_flags_set_the_intervention_section_and_may_change_on_resume():
    from relive.cli import build_parser
    from relive.train.cli import config_from_args, resume_settings

    args = build_parser().parse_args(["train", "hil_rlpd", "--env", "Pendulum-v1", "--console", "--console-host",
                                      "0.0.0.0", "--console-port", "0"])
    ic = config_from_args(args).intervention
    assert (ic.kind, ic.console_host, ic.console_port, ic.console_start_paused) == ("console", "0.0.0.0", 0, True)
    assert config_from_args(build_parser().parse_args(["train", "hil_rlpd"])).intervention.kind == "scripted"
    resumed = build_parser().parse_args(["train", "--resume", "RUN", "--console-port", "8800"])
    assert resume_settings(resumed) == ["intervention.console_port=8800"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "hil_rlpd", "--console-port", "70000"])


def test_page_messages_set_the_pad_the_gain_and_the_pause_and_malformed_ones_are_ignored():
    from relive.train.console import handle_message

    c = console(box([-1.0, -1.0], [1.0, 1.0]))
    for text in ('{"type": "pad", "engaged": true, "axes": [0.5, "x"]}', "[1, 2]", '{"type": "gain", "value": 5}',
                 '{"type": "keys", "down": "ArrowLeft"}', '{"type": "nothing"}'):
        handle_message(c.state, text)
    assert c.state.pad == {"engaged": True, "axes": []} and c.state.gain == 1.0 and c.state.held == set()
    assert c(None, np.full(2, 0.3, np.float32)) == (True, pytest.approx([0.0, 0.0]))  # pad engaged, no valid axes
    handle_message(c.state, '{"type": "pad", "engaged": true, "axes": [0.5, -0.25]}')
    assert c(None, np.zeros(2, np.float32))[1].tolist() == [0.5, -0.25]
    handle_message(c.state, '{"type": "pause"}')
    assert c.state.paused and not c.state.resumed.is_set()
    handle_message(c.state, '{"type": "resume"}')
    handle_message(c.state, '{"type": "release"}')
    assert not c.state.paused and c.state.pad is None
