"""The console in a real browser (issue 47 item 1): Debian's Chromium driven by Playwright opens the page of a short
HIL run (`relive train ... --console`), sees frames arrive, holds a key, resumes the run, lets go, and the intervened
rows are in the buffer's demonstration segment with the key's action. `.ci/run` installs Chromium; the test extra
installs Playwright (its own browser download is not used: it launches /usr/bin/chromium)."""

from __future__ import annotations

import shutil
import socket
import threading
from pathlib import Path

import numpy as np
import pytest

from relive.replay import ReplayBuffer
from relive.train.trainer import train
from relive.types import INTERVENTION
from tests.train.test_trainer import TINY, cfg_for

pytest.importorskip("fastapi", reason="the console extra (fastapi, uvicorn, websockets) is not installed")
pytest.importorskip("websockets", reason="the console extra (websockets) is not installed")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra)")
CHROMIUM = next((p for p in ("/usr/bin/chromium", shutil.which("chromium") or "", shutil.which("chromium-browser")
                             or "") if p and Path(p).is_file()), None)
if CHROMIUM is None:
    pytest.skip("no Chromium (/usr/bin/chromium: apt-get install chromium, as .ci/run does)", allow_module_level=True)

HELD = 25  # env steps the key is held for (at least)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_a_person_takes_over_from_the_browser_and_their_rows_become_demonstrations(tmp_path):
    port = free_port()
    run_dir = tmp_path / "run"
    cfg = cfg_for(["hil_rlpd", "--env", "Pendulum-v1", "--set", "env.max_episode_steps=40", "--warmup", "0",
                   "--online-steps", "120", "--utd", "1", "--capacity", "400", "--log-every", "40",
                   "--eval-every", "1000", "--console", "--console-port", str(port),
                   "--set", "run.save_final_buffer=true", "--set", "intervention.demo_capacity=200", *TINY], run_dir)
    assert cfg.intervention.kind == "console" and cfg.intervention.console_start_paused
    errors: list[BaseException] = []

    def run():
        try:
            train(cfg)
        except BaseException as e:  # (reported by the test thread)
            errors.append(e)

    trainer = threading.Thread(target=run, daemon=True)
    trainer.start()
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            for _ in range(600):  # the server starts once the run is built (no timing asserted: a bounded retry)
                if errors or not trainer.is_alive():
                    break
                try:
                    page.goto(f"http://127.0.0.1:{port}/")
                    break
                except sync_api.Error:
                    page.wait_for_timeout(100)
            assert not errors, errors
            wait = {"timeout": 60_000}
            # the paused first frame and the first status (two messages, in either order: a frame may come first)
            page.wait_for_function("Number(document.body.dataset.frames) >= 1 && document.body.dataset.paused "
                                   "!== undefined", **wait)
            assert page.evaluate("document.body.dataset.paused") == "true"  # a console run starts paused
            assert page.locator("#bindings").inner_text().count("→") == 1  # Pendulum: one dimension, ← / →
            page.keyboard.down("ArrowRight")
            page.wait_for_function("document.querySelector('kbd.down') !== null", **wait)  # the server has it
            page.click("#pause")  # Resume
            page.wait_for_function(f"Number(document.body.dataset.intervened) >= {HELD}", **wait)
            assert page.evaluate("document.body.dataset.engaged") == "true"
            frames = int(page.evaluate("document.body.dataset.frames"))
            page.keyboard.up("ArrowRight")
            page.wait_for_function(f"Number(document.body.dataset.frames) > {frames}", **wait)  # live frames
            trainer.join(120)
        finally:
            browser.close()
    assert not trainer.is_alive() and not errors, errors
    buf = ReplayBuffer.load(run_dir / "buffer_final")
    st = buf.storage
    demos = slice(st.num_before_online, st.num_offline)
    n = st.num_offline - st.num_before_online
    ring = st.columns["intervened"][st.ring_base:st.ring_base + st.num_online]
    assert n >= HELD and n == int(ring.sum())  # every intervened step joined the segment
    assert st.columns["intervened"][demos].all() and (st.meta["origin"][demos] == INTERVENTION).all()
    assert np.allclose(st.columns["action"][demos], 2.0)  # → held: Pendulum's high bound, whatever the agent proposed
    assert not np.allclose(st.columns["proposed_action"][demos], 2.0)
