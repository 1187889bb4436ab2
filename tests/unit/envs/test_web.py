"""Tests of the web env: the real bundled sites, driven by the system Chromium through Playwright."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
from collections import Counter
from pathlib import Path

import playwright
import psutil
import pytest

from agentgym_rl.envs.base import EnvError, InvalidAction
from agentgym_rl.envs.registry import make
from agentgym_rl.envs.web import WebEnv
from agentgym_rl.envs.web.actions import NO_ACTION, WebAction, parse_reply
from agentgym_rl.envs.web.content import generate
from agentgym_rl.envs.web.tasks import SPLITS, TASKS, build_tasks

pytestmark = pytest.mark.skipif(
    shutil.which("chromium") is None and shutil.which("chromium-browser") is None,
    reason="no system Chromium: install the OS package (./install.sh does, as root)",
)


@pytest.fixture(scope="module")
def env() -> WebEnv:
    environment = WebEnv(action_timeout=3.0)
    yield environment
    environment.close()


def fenced(action: str) -> str:
    return f"Let's think step by step. In summary, the next action I will perform is ```{action}```"


def element_id(observation: str, role: str, name: str) -> int:
    """The id of the first ``[id] role 'name'`` line of an observation."""
    for line in observation.splitlines():
        stripped = line.strip()
        if stripped.startswith("[") and f"] {role} {name!r}" in stripped:
            return int(stripped[1 : stripped.index("]")])
    raise AssertionError(f"no {role} {name!r} in:\n{observation}")


# ------------------------------------------------------------------------------- task catalogue


def test_catalogue_is_deterministic_and_split_cleanly() -> None:
    assert len(TASKS) >= 100
    again = build_tasks(generate(0))
    assert [(t.id, t.intent, t.reference) for t in again] == [(t.id, t.intent, t.reference) for t in TASKS]
    assert [t.id for t in TASKS] == list(range(len(TASKS)))
    test, train = set(SPLITS["test"]), set(SPLITS["train"])
    assert not test & train and test | train == set(range(len(TASKS)))
    for split in (test, train):
        assert {TASKS[i].start_url for i in split} == {"http://shop.test/", "http://forum.test/"}
    assert set(Counter(t.evaluator for t in TASKS)) == {"exact_match", "must_include", "url_match", "state"}
    assert len({t.intent for t in TASKS}) == len(TASKS)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("In summary, the next action I will perform is ```click [12]```", "click [12]"),
        ("```type [3] [red lamp] [0]``` then ```click [4]```", "type [3] [red lamp] [0]"),
        ("```type [3] [a [nested] text]```", "type [3] [a [nested] text] [1]"),
        ("```\nscroll [direction=down]\n```", "scroll [down]"),
        ("```press [Control+a]```", "press [Control+a]"),
        ("```goto [http://forum.test/f/cycling]```", "goto [http://forum.test/f/cycling]"),
        ("```go_back```", "go_back"),
        ("```tab_focus [1]```", "tab_focus [1]"),
        ("```stop [$12.00]```", "stop [$12.00]"),
        ("```stop```", "stop []"),
        ("Thought: easy.\nAction: hover [7]", "hover [7]"),
    ],
)
def test_webarena_replies_parse(reply: str, expected: str) -> None:
    action = parse_reply(reply)
    assert isinstance(action, WebAction) and str(action) == expected
    assert parse_reply(f"```{action}```") == action  # the canonical text parses back to the same action


@pytest.mark.parametrize(
    ("reply", "words"),
    [
        ("I will click the search box.", NO_ACTION),
        ("```jump [3]```", "Unknown action"),
        ("```click [search box]```", "element id"),
        ("```scroll [left]```", "[up] or [down]"),
        ("```type [x] [hello]```", "type [id] [text]"),
        ("```goto []```", "needs an argument"),
    ],
)
def test_bad_replies_say_what_is_wrong(reply: str, words: str) -> None:
    action = parse_reply(reply)
    assert isinstance(action, InvalidAction) and words in action.reason


def test_missing_chromium_and_bad_task_ids_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(EnvError, match="no Chromium binary.*chromium_path"):
        WebEnv(chromium_path=str(tmp_path / "chromium"))
    env = WebEnv()
    with pytest.raises(EnvError, match="unknown split 'dev'"):
        env.tasks("dev")
    for bad in (-1, len(TASKS), "3", True):
        with pytest.raises(EnvError, match="task id must be"):
            env.reset(bad)
    with pytest.raises(EnvError, match="call reset first"):
        env.step("```click [1]```")
    env.close()
    with pytest.raises(EnvError, match="base_url"):
        make("webarena-remote")


# ------------------------------------------------------------------------------ episodes


def test_observation_uses_webarena_prompt_layout(env: WebEnv) -> None:
    text = env.reset(0).text
    assert text.startswith(
        "OBSERVATION:\nTab 0 (current): Home - One Stop Shop\n\n[1] RootWebArea 'Home - One Stop Shop'"
    )
    assert "\nURL: http://shop.test/\n" in text and f"\nOBJECTIVE: {TASKS[0].intent}\n" in text
    assert text.endswith("PREVIOUS ACTION: None")
    assert "127.0.0.1" not in text  # the local port never shows
    search = element_id(text, "searchbox", "Search products")
    result = env.step(fenced(f"type [{search}] [kettle] [1]"))
    assert result.info["action_valid"] and not result.done
    assert "URL: http://shop.test/search?q=kettle" in result.observation
    assert result.observation.endswith(f"PREVIOUS ACTION: type [{search}] [kettle] [1]")
    assert env.reset(0).text == text  # same page, same ids


@pytest.mark.slow
def test_every_task_oracle_succeeds(env: WebEnv) -> None:
    failures = []
    for task in TASKS:
        env.reset(task.id)
        while True:
            result = env.step(fenced(env.oracle_action()))
            assert result.info["action_valid"], result.observation
            if result.done:
                break
        if not (result.reward == 1.0 and result.info["success"]):
            failures.append(task.id)
    assert failures == []


@pytest.mark.parametrize("task_id", [0, 13, 22, 60, 92, 102])  # must_include, exact, state, exact, state, url
def test_evaluators_reject_wrong_outcomes(env: WebEnv, task_id: int) -> None:
    env.reset(task_id)
    result = env.step(fenced("stop [I do not know]"))
    assert result.done and result.reward == 0.0 and result.info["success"] is False


def test_site_data_is_restored_by_reset(env: WebEnv) -> None:
    for action in env.oracle_episode(35):  # a purchase: a new order exists afterwards
        assert action
    shop = env.sites.shop
    assert len(shop.orders) == 7 and not shop.cart
    env.oracle_episode(90)  # a new forum post
    assert len(env.sites.forum.posts) == 31
    env.reset(1)
    assert len(shop.orders) == 6 and len(env.sites.forum.posts) == 30


def test_bad_actions_come_back_as_observations(env: WebEnv) -> None:
    text = env.reset(60).text
    forums = element_id(text, "link", "Forums")
    cases = [
        ("I am not sure what to do.", "No action found"),
        (fenced("click [999]"), "there is no element [999]"),
        (fenced("goto [https://example.com/]"), "only open the bundled sites"),
        (fenced("tab_focus [4]"), "there is no tab 4"),
        (fenced(f"type [{forums}] [hello] [0]"), "failed"),
        (fenced("press [NoSuchKey]"), "failed"),
    ]
    for reply, words in cases:
        result = env.step(reply)
        assert words in result.observation and not result.done, result.observation
        assert result.info["action_valid"] is False
        assert "\nOBJECTIVE: " in result.observation  # the page is still shown
    assert env.step(fenced(f"click [{forums}]")).info["action_valid"]


def test_404_and_slow_pages_are_observations(env: WebEnv) -> None:
    env.reset(60)
    missing = env.step(fenced("goto [http://forum.test/no/such/page]"))
    assert "HTTP status 404" in missing.observation and "heading '404 Not Found'" in missing.observation
    impatient = WebEnv(navigation_timeout=3.0)
    impatient.reset(60)
    slow = impatient.step(fenced("goto [http://shop.test/slow?seconds=20]"))
    assert "did not finish loading within 3 s" in slow.observation and not slow.done
    assert "127.0.0.1" not in slow.observation  # a loading tab's title shows the agent's URL too
    back = impatient.step(fenced("goto [http://shop.test/]"))
    impatient.close()
    assert back.info["action_valid"] and "URL: http://shop.test/\n" in back.observation
    assert "Welcome, Alex Rivera" in back.observation


def test_tabs_and_history(env: WebEnv) -> None:
    env.reset(60)
    assert "URL: about:blank" in env.step(fenced("new_tab")).observation
    opened = env.step(fenced("goto [http://shop.test/orders]")).observation
    assert opened.startswith("OBSERVATION:\nTab 0: Forums - Forum | Tab 1 (current): My Orders - One Stop Shop")
    assert "URL: http://forum.test/\n" in env.step(fenced("tab_focus [0]")).observation
    env.step(fenced("tab_focus [1]"))
    closed = env.step(fenced("close_tab")).observation
    assert closed.startswith("OBSERVATION:\nTab 0 (current): Forums - Forum\n")
    text = env.step(fenced("scroll [down]")).observation
    env.step(fenced(f"click [{element_id(text, 'link', 'Cycling')}]"))
    assert "URL: http://forum.test/\n" in env.step(fenced("go_back")).observation
    assert "URL: http://forum.test/f/cycling\n" in env.step(fenced("go_forward")).observation
    assert "no page to go forward to" in env.step(fenced("go_forward")).observation


def test_random_actions_never_crash(env: WebEnv) -> None:
    rng = random.Random(0)
    kinds = [
        "click [{i}]", "hover [{i}]", "type [{i}] [{w}] [{b}]", "press [{k}]", "scroll [{d}]", "goto [{u}]",
        "go_back", "go_forward", "new_tab", "tab_focus [{n}]", "close_tab", "stop [{w}]", "{w}", "```",
    ]  # fmt: skip
    urls = ["http://shop.test/cart", "http://forum.test/f/cooking", "http://shop.test/x", "ftp://a", "about:blank"]
    steps = 0
    for _ in range(6):
        env.reset(rng.choice(TASKS).id)
        for _ in range(15):
            action = rng.choice(kinds).format(
                i=rng.randint(0, 40), w=rng.choice(["lamp", "", "]]", "héllo ☃"]), b=rng.randint(0, 1),
                k=rng.choice(["Enter", "Tab", "Control+a", "Bogus"]), d=rng.choice(["up", "down"]),
                u=rng.choice(urls), n=rng.randint(0, 3),
            )  # fmt: skip
            result = env.step(fenced(action) if rng.random() < 0.9 else action)
            steps += 1
            assert result.observation.count("OBJECTIVE: ") == 1
            if result.done:
                break
    assert steps >= 30


def test_screenshot_of_a_bundled_site_is_a_real_render(env: WebEnv, tmp_path: Path) -> None:
    from PIL import Image

    env.reset(1)
    path = tmp_path / "shop_home.png"
    env.screenshot(str(path))
    print(f"screenshot of the shop's home page: {path}")
    assert path.stat().st_size > 5_000
    with Image.open(path) as image:
        image.load()
        assert image.size == (1280, 720)
        colours = image.convert("RGB").getcolors(maxcolors=1_000_000)
    assert colours is not None and len(colours) > 10  # text, header bar, buttons: not a blank page


def browser_processes(pid: int, kind: str) -> list[psutil.Process]:
    """``kind`` "chromium": Chromium's processes below ``pid``; "driver": Playwright's driver (its bundled
    node). Nothing else is picked: this process's other children include the session's Ray processes."""
    driver = str((Path(playwright.__file__).parent / "driver").resolve())  # exe() is the resolved path
    found = []
    for process in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if (
                kind == "chromium"
                and "chrom" in process.name().lower()
                or kind == "driver"
                and process.exe().startswith(driver)
            ):
                found.append(process)
    return found


@pytest.mark.parametrize("kind", ["chromium", "driver"])
def test_a_killed_browser_is_restarted_on_the_next_step(env: WebEnv, kind: str) -> None:
    env.reset(60)
    first = env.step(fenced(env.oracle_action()))
    victims = browser_processes(os.getpid(), kind)
    assert victims, f"the env should run its {kind} as a child of this process"
    for process in victims:
        with contextlib.suppress(psutil.NoSuchProcess):  # killing the main process takes its helpers along
            process.kill()
    psutil.wait_procs(victims, timeout=10)
    result = env.step(fenced("scroll [down]"))
    assert "restarted" in result.observation and "URL: http://forum.test/f/" in result.observation
    assert first.info["url"] == result.info["url"]
    env.reset(60)  # the episode after a crash runs on the new browser, to success
    result = env.step(fenced(env.oracle_action()))
    while not result.done:
        result = env.step(fenced(env.oracle_action()))
    assert result.reward == 1.0


def test_viewport_only_shows_what_is_on_screen_and_scroll_reveals_the_rest() -> None:
    env = WebEnv(viewport_only=True, viewport_height=300)
    env.reset(76)  # a comment task: the comment form lies below a 300-pixel viewport
    top = env.step(fenced("goto [http://forum.test/post/3]")).observation
    assert "link 'Forums'" in top and "button 'Post Comment'" not in top
    scrolled = top
    for _ in range(5):
        scrolled = env.step(fenced("scroll [down]")).observation
        if "button 'Post Comment'" in scrolled:
            break
    assert "button 'Post Comment'" in scrolled and "link 'Forums'" not in scrolled
    env.reset(76)  # the oracle scrolls to the elements it needs
    actions = []
    while not (result := env.step(fenced(action := env.oracle_action()))).done:
        actions.append(action)
    env.close()
    assert "scroll [down]" in actions and result.reward == 1.0
