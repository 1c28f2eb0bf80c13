"""A browser console for a person in the loop (HIL-SERL, Luo et al. 2024): ``intervention.kind = "console"``,
``relive train hil_rlpd ... --console``.

The page shows the env's live frames (``env.render()``, ``rgb_array``, sent as JPEG over a websocket), the action
the person commands and whether they hold control, the intervention rate per episode, the return and the offline /
demonstration share of the batches (read from the run's ``metrics.jsonl``), and pause / resume. Holding a bound key
takes over (or button 0 of a gamepad, read by the browser's Gamepad API); letting go gives control back.

Threads: the server (uvicorn, FastAPI, websockets) runs in a daemon thread of the training process; the training
thread never waits for the browser. They share one :class:`ConsoleState` under a lock: the training thread reads
the person's command once per env step and renders a frame only when the browser has taken the previous one (at
most ``MAX_FPS`` a second), so a slow browser gets fewer frames, never a slower run. Pause blocks the training
thread at its next env step (the online phase) until Resume.

Local only by default: bound to 127.0.0.1, requests must name this machine as their host (no DNS rebinding) and a
websocket's origin must be the page's own. Bound to another address, the console generates a token, prints the URL
with it once, and refuses every HTTP and websocket request without it (401 / close 1008).

Why FastAPI + uvicorn + websockets: frames out and key events in both want a websocket, which an ASGI server
handles with asyncio in one thread beside training; the three are small, widely used, typed, and FastAPI's
TestClient tests the endpoints in-process. The page is one HTML file with plain JavaScript (no build step).
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import secrets
import socket
import threading
import time
from collections import deque
from importlib import resources
from pathlib import Path

import numpy as np

from relive.registry import InterventionBuild, register_intervener

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
MAX_FPS = 20.0  # frames rendered per second at most (each env.render() costs the training thread: Pendulum ~25 ms)
STATUS_EVERY_S = 0.2  # a status message to each page this often
#: continuous action dimension i: (key that drives it to its low bound, key to its high bound), KeyboardEvent.code
AXIS_KEYS = (("ArrowLeft", "ArrowRight"), ("ArrowDown", "ArrowUp"), ("KeyA", "KeyD"), ("KeyS", "KeyW"),
             ("KeyJ", "KeyL"), ("KeyK", "KeyI"), ("KeyF", "KeyH"), ("KeyG", "KeyT"))
HOLD_KEY = "Space"  # take over and hold the middle of the action box (zero for a symmetric box)
DIGIT_KEYS = tuple(f"Digit{i}" for i in range(10))  # discrete actions 0-9
#: the run's metrics.jsonl columns the page plots (when present)
PLOTTED = ("train/episode_return", "collect/intervention_rate", "replay/offline_fraction",
           "replay/demonstration_fraction")
MAX_MESSAGE_BYTES = 4096  # a key / pad / control message from the page is small; a larger one is dropped


class KeyMap:
    """Keys and gamepad axes to an action in the env's box. Continuous: dimension i follows :data:`AXIS_KEYS`
    ``[i]`` (low key: ``low``, high key: ``high``, neither or both: the middle; ``gain`` in (0, 1] scales the
    distance from the middle) and a gamepad's axis i (in [-1, 1], scaled to the box); :data:`HOLD_KEY` takes over at
    the middle. Discrete: ``Digit0`` .. ``Digit9`` pick the action (the lowest held). Any bound key held, or the
    gamepad's button 0 pressed, is a takeover."""

    def __init__(self, spec):
        self.discrete = bool(spec.discrete)
        self.shape = tuple(spec.action_shape)
        if self.discrete:
            self.num_actions = int(spec.num_actions)
            self.keys = DIGIT_KEYS[: min(self.num_actions, 10)]
        else:
            self.low = np.asarray(spec.action_low, np.float64).reshape(-1)
            self.high = np.asarray(spec.action_high, np.float64).reshape(-1)
            self.axes = AXIS_KEYS[: self.low.size]
            self.keys = tuple(k for pair in self.axes for k in pair) + (HOLD_KEY,)

    def bindings(self) -> list[dict]:
        """What the page shows: per action dimension (or discrete action) its keys and range."""
        if self.discrete:
            return [{"action": i, "key": k} for i, k in enumerate(self.keys)]
        out = [{"dim": i, "low_key": lo, "high_key": hi, "low": float(self.low[i]), "high": float(self.high[i])}
               for i, (lo, hi) in enumerate(self.axes)]
        return out + [{"dim": None, "hold_key": HOLD_KEY}]

    def action(self, held: set[str], pad: dict | None, gain: float = 1.0) -> tuple[bool, np.ndarray | None]:
        """``(take over?, action)`` for the held keys and the gamepad's last state (``{"engaged", "axes"}``);
        keys win over the pad. The action is None when not taken over."""
        held = held & set(self.keys)
        if self.discrete:
            if held:
                return True, np.full(self.shape, min(int(k[5:]) for k in held), np.int64)
            return False, None
        mid, half = (self.low + self.high) / 2, (self.high - self.low) / 2
        if held:
            direction = np.array([float(hi in held) - float(lo in held) for lo, hi in self.axes]
                                 + [0.0] * (self.low.size - len(self.axes)))
            return True, (mid + gain * half * direction).reshape(self.shape)
        if pad and pad.get("engaged"):
            axes = np.zeros(self.low.size)
            given = np.clip(np.nan_to_num(np.asarray(pad.get("axes", []), np.float64)[: self.low.size]), -1, 1)
            axes[: given.size] = given
            return True, (mid + half * axes).reshape(self.shape)
        return False, None


class ConsoleState:
    """What the server thread and the training thread share (every field under ``lock``)."""

    def __init__(self, keymap: KeyMap, start_paused: bool):
        self.lock = threading.Lock()
        self.keymap = keymap
        self.held: set[str] = set()
        self.pad: dict | None = None
        self.gain = 1.0
        self.paused = bool(start_paused)
        self.resumed = threading.Event()  # set while not paused (the training thread waits on it)
        if not start_paused:
            self.resumed.set()
        self.frame: np.ndarray | None = None  # the last rendered frame and its number
        self.frame_seq = 0
        self.want_frame = True  # a page took the last frame (the training thread renders the next one)
        self.last_render = -math.inf
        self.clients = 0
        self.engaged = False
        self.action: list | None = None  # the last executed takeover action
        self.steps = self.intervened_steps = self.episodes = 0
        self.episode_interventions = self.episode_length = 0
        self.episode_rates: deque[float] = deque(maxlen=500)  # intervened share of each finished episode
        self.closed = False

    # -- from the page (server thread) --
    def set_keys(self, keys: list) -> None:
        with self.lock:
            self.held = {k for k in keys if isinstance(k, str)} & set(self.keymap.keys)

    def set_pad(self, engaged, axes) -> None:
        with self.lock:
            ok = isinstance(axes, list) and all(isinstance(a, int | float) and not isinstance(a, bool) for a in axes)
            self.pad = {"engaged": bool(engaged), "axes": [float(a) for a in axes] if ok else []}

    def set_gain(self, gain) -> None:
        if isinstance(gain, int | float) and not isinstance(gain, bool) and 0 < gain <= 1:
            with self.lock:
                self.gain = float(gain)

    def release(self) -> None:
        """Nothing held (a page left or lost focus): control goes back to the agent."""
        with self.lock:
            self.held, self.pad = set(), None

    def set_paused(self, paused: bool) -> None:
        with self.lock:
            self.paused = bool(paused)
            (self.resumed.clear if self.paused else self.resumed.set)()

    def take_frame(self, after: int) -> tuple[int, np.ndarray | None]:
        """The newest frame if it is newer than ``after`` (and ask the training thread for the next)."""
        with self.lock:
            if self.frame_seq > after:
                self.want_frame = True
                return self.frame_seq, self.frame
            self.want_frame = True
            return after, None

    def status(self) -> dict:
        with self.lock:
            recent = list(self.episode_rates)
            return {"paused": self.paused, "engaged": self.engaged, "action": self.action, "gain": self.gain,
                    "held": sorted(self.held), "pad": self.pad is not None, "steps": self.steps,
                    "intervened_steps": self.intervened_steps, "episodes": self.episodes,
                    "episode_interventions": self.episode_interventions, "episode_length": self.episode_length,
                    "episode_rates": recent[-200:], "clients": self.clients, "frame": self.frame_seq}


class ConsoleIntervener:
    """The person at the console: while they hold a bound key (or the gamepad's button 0) their action is executed,
    clipped to the action box. Serves the console (:class:`ConsoleServer`) unless ``serve=False`` (tests)."""

    def __init__(self, env, spec, host: str = "127.0.0.1", port: int = 8765, run_dir: Path | None = None,
                 start_paused: bool = True, serve: bool = True, announce=print):
        self.env, self.spec = env, spec
        self.keymap = KeyMap(spec)
        self.state = ConsoleState(self.keymap, start_paused)
        self.metrics = MetricsTail(Path(run_dir) / "metrics.jsonl" if run_dir is not None else None)
        self.low = None if spec.discrete else np.asarray(spec.action_low)
        self.high = None if spec.discrete else np.asarray(spec.action_high)
        self.host = host
        self.token = None if host in LOCAL_HOSTS else secrets.token_urlsafe(24)
        self.server: ConsoleServer | None = None
        if serve:
            self.server = ConsoleServer(create_app(self), host, port)
            self.server.start()
            announce(f"console: {self.url}" + (" (paused: press Resume on the page to start the online phase)"
                                               if start_paused else ""))

    @property
    def url(self) -> str:
        port = self.server.port if self.server is not None else 0
        host = socket.gethostname() if self.host in ("0.0.0.0", "::") else self.host  # (every address: this machine)
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}/" + (f"?token={self.token}" if self.token else "")

    def __call__(self, obs, proposed: np.ndarray) -> tuple[bool, np.ndarray]:
        st = self.state
        if not st.resumed.is_set():  # paused: show where it stands, then wait for Resume
            self._render(force=True)
            while not st.resumed.wait(0.1) and not st.closed:
                pass
        self._render()
        with st.lock:
            taken, action = self.keymap.action(st.held, st.pad, st.gain)
        proposed = np.asarray(proposed)
        if taken and action is not None:
            out = action.astype(proposed.dtype).reshape(proposed.shape)
            if not self.spec.discrete:
                out = np.clip(out, self.low, self.high).astype(proposed.dtype)
        else:
            out = proposed
        with st.lock:
            st.engaged, st.action = bool(taken), np.asarray(out).tolist() if taken else None
            st.steps += 1
            st.intervened_steps += int(taken)
            st.episode_interventions += int(taken)
            st.episode_length += 1
        return bool(taken), out

    def _render(self, force: bool = False) -> None:
        st = self.state
        now = time.monotonic()
        with st.lock:
            due = force or (st.want_frame and now - st.last_render >= 1.0 / MAX_FPS)
        if not due:
            return
        frame = self.env.render()
        if frame is None:
            return
        with st.lock:
            st.frame, st.want_frame, st.last_render = np.asarray(frame), False, now
            st.frame_seq += 1

    def on_episode_start(self) -> None:
        st = self.state
        with st.lock:
            if st.episode_length:
                st.episode_rates.append(st.episode_interventions / st.episode_length)
                st.episodes += 1
            st.episode_interventions = st.episode_length = 0

    def state_dict(self) -> dict:  # (a person is not replayed: nothing to restore)
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def close(self) -> None:
        """Stop the server (and let a paused training thread go on)."""
        self.state.closed = True
        self.state.resumed.set()
        if self.server is not None:
            self.server.stop()


@register_intervener("console", renders=True)
def _console(ctx: InterventionBuild) -> ConsoleIntervener:
    """A person in a browser: the env's frames, hold a key (or a gamepad's button) to take over, pause / resume."""
    ic = ctx.config.intervention
    if ctx.env is None:
        raise ValueError("intervention.kind = 'console' needs an env in this process")
    return ConsoleIntervener(ctx.env, ctx.spec, ic.console_host, ic.console_port, ctx.run_dir,
                             ic.console_start_paused)


class MetricsTail:
    """The plotted columns of a run's ``metrics.jsonl`` (online rows), read incrementally (whole lines only)."""

    def __init__(self, path: Path | None, keep: int = 1000):
        self.path, self.offset = path, 0
        self.rows: deque[dict] = deque(maxlen=keep)
        self.num_read = 0  # rows read so far (a page is sent the rows again only when this grew)
        self.lock = threading.Lock()

    def read(self) -> list[dict]:
        with self.lock:
            if self.path is not None and self.path.is_file():
                with open(self.path, "rb") as f:
                    f.seek(self.offset)
                    data = f.read()
                end = data.rfind(b"\n") + 1
                self.offset += end
                for line in data[:end].splitlines():
                    try:
                        row = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(row, dict) and row.get("phase") == "online":
                        self.rows.append({k: _finite(row.get(k)) for k in ("env_step", *PLOTTED) if k in row})
                        self.num_read += 1
            return list(self.rows)


def _finite(v):
    return v if isinstance(v, int | float) and math.isfinite(v) else None


def encode_jpeg(frame: np.ndarray, quality: int = 80) -> bytes:
    """An ``rgb_array`` frame (H, W, 3 uint8) as JPEG bytes (Pillow)."""
    from PIL import Image  # (the console extra: only a run with a console encodes frames)

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(frame, np.uint8)).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


# -- the web app --------------------------------------------------------------------------------------------------
def create_app(console: ConsoleIntervener):
    """The FastAPI app: ``/`` the page, ``/frame`` the newest frame (JPEG; 204 before the first), ``/status`` the
    counters, bindings and plotted metrics (JSON), ``POST /pause`` and ``/resume``, ``/ws`` the websocket (binary
    messages: JPEG frames; text: status JSON; from the page: ``{"type": "keys", "down": [codes]}``,
    ``{"type": "pad", "engaged", "axes"}``, ``{"type": "gain", "value"}``, ``{"type": "release"}``,
    ``{"type": "pause"}``, ``{"type": "resume"}``)."""
    from fastapi import FastAPI, WebSocket, WebSocketDisconnect
    from fastapi.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import WebSocketRoute

    st = console.state
    app = FastAPI(title="relive console", docs_url=None, redoc_url=None, openapi_url=None)
    page = resources.files("relive.train").joinpath("console_static/index.html").read_text(encoding="utf-8")

    def status(with_metrics: bool = True) -> dict:
        out = st.status() | {"bindings": console.keymap.bindings(), "discrete": console.keymap.discrete}
        return out | {"metrics": console.metrics.read()} if with_metrics else out

    @app.get("/")
    def index() -> HTMLResponse:
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    @app.get("/status")
    def get_status() -> JSONResponse:
        return JSONResponse(status())

    @app.get("/frame")
    def get_frame() -> Response:
        _, frame = st.take_frame(-1)
        if frame is None:
            return Response(status_code=204)
        return Response(encode_jpeg(frame), media_type="image/jpeg", headers={"Cache-Control": "no-store"})

    @app.post("/pause")
    def pause() -> JSONResponse:
        st.set_paused(True)
        return JSONResponse({"paused": True})

    @app.post("/resume")
    def resume() -> JSONResponse:
        st.set_paused(False)
        return JSONResponse({"paused": False})

    async def ws(socket_: WebSocket) -> None:  # (a Starlette route: FastAPI would resolve its annotations)
        await socket_.accept()
        with st.lock:
            st.clients += 1
        sender = asyncio.create_task(_send_loop(socket_, console, status))
        try:
            while True:
                text = await socket_.receive_text()
                if len(text) <= MAX_MESSAGE_BYTES:
                    handle_message(st, text)
        except WebSocketDisconnect:
            pass
        finally:
            sender.cancel()
            st.release()  # a page that left holds nothing
            with st.lock:
                st.clients -= 1

    app.router.routes.append(WebSocketRoute("/ws", ws))
    return Guard(app, console.token, local=console.host in LOCAL_HOSTS)


async def _send_loop(socket_, console: ConsoleIntervener, status_fn) -> None:
    """A page's outgoing messages: each new frame (JPEG, encoded off the event loop), a status every
    ``STATUS_EVERY_S`` (with the plotted rows when new ones were logged)."""
    st = console.state
    seq, last_status, rows_sent = 0, -math.inf, -1
    try:
        while True:
            seq, frame = st.take_frame(seq)
            if frame is not None:
                await socket_.send_bytes(await asyncio.to_thread(encode_jpeg, frame))
            now = time.monotonic()
            if now - last_status >= STATUS_EVERY_S:
                console.metrics.read()  # (the plotted rows go out again only when new ones were logged)
                fresh = console.metrics.num_read != rows_sent
                rows_sent = console.metrics.num_read
                await socket_.send_text(json.dumps(status_fn(fresh)))
                last_status = now
            await asyncio.sleep(1.0 / (2 * MAX_FPS))
    except (asyncio.CancelledError, RuntimeError, OSError):
        pass
    except Exception as e:  # (a closed socket: websockets / starlette raise their own types)
        if type(e).__name__ not in ("WebSocketDisconnect", "ConnectionClosed", "ConnectionClosedOK",
                                    "ConnectionClosedError"):
            raise


def handle_message(st: ConsoleState, text: str) -> None:
    """One message from the page (a malformed one is ignored)."""
    try:
        msg = json.loads(text)
    except ValueError:
        return
    if not isinstance(msg, dict):
        return
    kind = msg.get("type")
    if kind == "keys" and isinstance(msg.get("down"), list):
        st.set_keys(msg["down"])
    elif kind == "pad":
        st.set_pad(msg.get("engaged", False), msg.get("axes", []))
    elif kind == "gain":
        st.set_gain(msg.get("value"))
    elif kind == "release":
        st.release()
    elif kind in ("pause", "resume"):
        st.set_paused(kind == "pause")


class Guard:
    """ASGI middleware in front of the app, for HTTP and websockets alike: with a ``token`` every request must carry
    it (``?token=`` or ``Authorization: Bearer``), else 401 / websocket close 1008; bound locally, the Host header
    must name this machine (a page of another site resolved to 127.0.0.1 is refused: DNS rebinding) and a
    websocket's Origin must be the page's own host (another site's page cannot drive the console)."""

    def __init__(self, app, token: str | None, local: bool):
        self.app, self.token, self.local = app, token, local

    def refusal(self, scope) -> str | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = headers.get("host", "")
        if self.local and _hostname(host) not in LOCAL_HOSTS:
            return f"relive console: host {host!r} refused (the console is local: open it as 127.0.0.1)"
        origin = headers.get("origin")
        if scope["type"] == "websocket" and origin and origin.split("://", 1)[-1] != host:
            return f"relive console: websocket from origin {origin!r} refused (not this console's page)"
        if self.token is not None:
            query = dict(p.split("=", 1) for p in scope.get("query_string", b"").decode("latin-1").split("&")
                         if "=" in p)
            given = query.get("token") or headers.get("authorization", "").removeprefix("Bearer ").strip()
            if not given or not secrets.compare_digest(given.encode(), self.token.encode()):
                return ("relive console: this console is bound to another address than 127.0.0.1 and needs its "
                        "token: open the URL printed when the run started (ending ?token=...)")
        return None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        reason = self.refusal(scope)
        if reason is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            body = json.dumps({"detail": reason}).encode()
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
        else:
            await receive()  # (websocket.connect)
            await send({"type": "websocket.close", "code": 1008, "reason": reason[:120]})


def _hostname(host: str) -> str:
    """``host[:port]`` -> host (``[::1]:8765`` -> ``::1``)."""
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class ConsoleServer:
    """uvicorn serving ``app`` in a daemon thread on a socket bound now (a port in use fails here, with the setting's
    name); ``port`` is the bound one (``console_port = 0``: a free port)."""

    def __init__(self, app, host: str, port: int):
        import uvicorn  # (the console extra: only a run with a console starts a server)

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, int(port)))
        except OSError as e:
            self.sock.close()
            raise ValueError(f"intervention.console_host / console_port: cannot listen on {host}:{port} "
                             f"({e.strerror or e}); pick another --console-port (0: any free port)") from None
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        config = uvicorn.Config(app, log_level="warning", lifespan="off", ws="websockets-sansio",
                                ws_max_size=MAX_MESSAGE_BYTES * 4)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._run, name="relive-console", daemon=True)

    def _run(self) -> None:
        self.server.run(sockets=[self.sock])

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()

