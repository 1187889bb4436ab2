"""``WebEnv``: WebArena-style browser tasks on the two sites this project serves itself.

Sites
    An online shop (``http://shop.test``: search, categories, product pages, cart, orders) and a forum
    (``http://forum.test``: forums, posts, comments, votes, subscriptions), generated from a fixed seed
    (``envs.web.content``) and served per env instance on free ``127.0.0.1`` ports in threads. As in
    WebArena's prompts, the agent sees stable URLs (``http://shop.test/...``) that the env maps to the
    local ports and back. ``reset`` restores both sites' seeded data.

Tasks
    ``envs.web.tasks``: 105 tasks from 14 templates, ids in template order; ``test`` holds the ids
    divisible by 5, ``train`` the rest. Evaluators are WebArena's kinds (exact / must-include answer,
    URL match, site-state check), applied when the agent sends ``stop [answer]`` or at ``max_steps``.

Observations
    WebArena's prompt layout: ``OBSERVATION:`` (tab titles, then the accessibility tree with numbered
    ids, see ``envs.web.browser``; the whole page, or with ``viewport_only`` only what is on screen, as
    AgentGym's WebArena server shows it), ``URL:``, ``OBJECTIVE:``, ``PREVIOUS ACTION:``. A step whose action
    could not be parsed or carried out, or whose page failed (an HTTP error, a load that timed out), puts
    a sentence saying so before that layout.

Actions
    WebArena's id-based space (``envs.web.actions``), parsed from the first fenced block of the reply.
    ``type`` replaces the field's content. ``goto`` only opens the bundled sites.

Browser
    One Chromium per env instance (the system binary, launched through Playwright's sync API on a
    thread owned by the env), a fresh context per episode, closed by ``close``. A browser that died
    (its process killed) is relaunched on the next ``reset`` or ``step``, which reopens the last page.

Oracle
    ``oracle_action`` follows the task's plan, resolving each step's element by role and name on the
    current page (with ``viewport_only``, scrolling down to it first); it advises only while the
    episode follows that plan.
"""

from __future__ import annotations

import numbers
import os
import shutil
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import override

from agentgym_rl.envs.base import EnvError, InvalidAction, Observation, StepResult, TextEnv
from agentgym_rl.envs.web.actions import ACTION_SYNTAX, WebAction, parse_reply
from agentgym_rl.envs.web.browser import ActionFailed, Browser, PlaywrightError, PlaywrightTimeout, Snapshot
from agentgym_rl.envs.web.forum import ForumSite
from agentgym_rl.envs.web.server import SiteServer
from agentgym_rl.envs.web.shop import ShopSite
from agentgym_rl.envs.web.tasks import CONTENT, FORUM_HOME, SHOP_HOME, SPLITS, TASKS, Sites, Task

T = TypeVar("T")

INSTRUCTION = (
    "You are an autonomous agent browsing the web to accomplish a task. Two websites are available: an online "
    f"shop at {SHOP_HOME} and a discussion forum at {FORUM_HOME}. Every turn you receive the page's "
    "accessibility tree, where each element has a numeric id in square brackets, the current URL, the "
    "objective and your previous action.\n"
    f"Actions: {ACTION_SYNTAX}.\n"
    "click/hover act on the element with that id; type replaces the content of a field and presses Enter "
    "afterwards unless the last argument is [0]; press takes a key combination such as [Control+a]; "
    "tab_focus takes a tab index. When the task is done, or it asks for an answer, issue stop with the answer "
    "in brackets (stop [] when no answer is needed).\n"
    "Think step by step, then give exactly one action in a fenced block, e.g. "
    "'In summary, the next action I will perform is ```click [12]```'."
)
_ORACLE_MAX_SCROLLS = 10  # viewport_only: scrolls the oracle tries before it gives up on an element
_BROWSER_RESTARTED = "The browser had stopped and was restarted on the last page; other tabs were lost."


def find_chromium() -> str | None:
    """The system Chromium on PATH (``chromium``, then ``chromium-browser``), or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


class WebEnv(TextEnv):
    """WebArena's observation and action space on a bundled shop and forum, driven by a real Chromium."""

    name = "web"
    default_max_turns = 15  # the paper's WebArena evaluation

    class Options(BaseModel):
        """Options of the web environment."""

        model_config = ConfigDict(extra="forbid")

        chromium_path: str | None = Field(
            default=None, description="Chromium binary; None finds `chromium` or `chromium-browser` on PATH."
        )
        max_steps: int = Field(
            default=30, ge=0, description="End (and evaluate) the episode after this many steps; 0: no limit."
        )
        navigation_timeout: float = Field(
            default=10.0, gt=0, description="Seconds a page load may take before the step reports a timeout."
        )
        action_timeout: float = Field(
            default=5.0, gt=0, description="Seconds an action waits for its element to be actionable."
        )
        max_tree_chars: int = Field(
            default=16_000, ge=200, description="Cut the accessibility tree after this many characters."
        )
        viewport_only: bool = Field(
            default=False,
            description="Show only the elements inside the viewport, as AgentGym's WebArena server does "
            "(current_viewport_only); scroll then reveals the rest. False shows the whole page.",
        )
        viewport_width: int = Field(default=1280, ge=200, description="Browser viewport width in pixels.")
        viewport_height: int = Field(default=720, ge=200, description="Browser viewport height in pixels.")

    def __init__(self, **options: Any) -> None:
        self.options = self.Options(**options)
        path = self.options.chromium_path or find_chromium()
        if path is None or not os.access(path, os.X_OK):
            raise EnvError(
                f"no Chromium binary at {path or 'chromium/chromium-browser on PATH'}; install the OS package "
                "(`apt-get install chromium`, as ./install.sh does) or set the chromium_path option"
            )
        self._chromium = path
        self._worker: ThreadPoolExecutor | None = None
        self._servers: dict[str, SiteServer] = {}
        self._sites: Sites | None = None
        self._browser: Browser | None = None
        self._task: Task | None = None
        self._snapshot: Snapshot | None = None
        self._previous = "None"
        self._steps = 0
        self._done = False
        self._oracle_index = 0
        self._oracle_pending: str | None = None
        self._oracle_advances = True  # whether the pending oracle action is a plan step (not a scroll)
        self._oracle_scrolls = 0
        self._oracle_deviated = False

    # ----------------------------------------------------------------------------- protocol

    @property
    def instruction(self) -> str:
        """System prompt: the two sites, the action space and the fenced-block reply format."""
        return INSTRUCTION

    def tasks(self, split: str) -> Sequence[int]:
        """Task ids of ``split``: ``test`` (ids divisible by 5) or ``train`` (the rest), ascending."""
        if split not in SPLITS:
            raise EnvError(f"unknown split {split!r}; valid splits: {', '.join(sorted(SPLITS))}")
        return list(SPLITS[split])

    def parse_action(self, model_text: str) -> str | InvalidAction:
        """The canonical text of the reply's action (first fenced block, else an ``Action:`` line)."""
        action = parse_reply(model_text)
        return action if isinstance(action, InvalidAction) else str(action)

    def reset(self, task_id: int) -> Observation:
        """Restore both sites' data and open task ``task_id``'s start page in a fresh browser context."""
        if isinstance(task_id, bool) or not isinstance(task_id, numbers.Integral) or not 0 <= task_id < len(TASKS):
            raise EnvError(f"task id must be an integer in 0..{len(TASKS) - 1}, got {task_id!r}")
        return self._run(self._reset, TASKS[int(task_id)])

    def step(self, action_text: str) -> StepResult:
        """Parse and carry out one action; ``stop`` (or the step limit) ends and evaluates the episode."""
        if self._task is None:
            raise EnvError("no episode has started; call reset first")
        if self._done:
            raise EnvError("the episode is over; call reset to start another")
        return self._run(self._step, action_text)

    def close(self) -> None:
        """Close the browser, its driver and the site servers."""
        if self._worker is not None:
            if self._browser is not None:
                self._worker.submit(self._browser.close).result()
            self._worker.shutdown(wait=True)
        for server in self._servers.values():
            server.close()
        self._worker, self._browser, self._servers, self._sites, self._task = None, None, {}, None, None

    def state_key(self) -> tuple[str, str, str] | None:
        """The active tab's URL, the tab line and the accessibility tree shown (element ids are numbered in
        page order, so equal pages give equal keys); None before the first reset."""
        if self._snapshot is None:
            return None
        return (self._snapshot.url, self._snapshot.tabs, self._snapshot.tree)

    # ------------------------------------------------------------------------------- extras

    @property
    def sites(self) -> Sites:
        """The live site states (for evaluators and tests)."""
        self._start()
        return self._sites

    def screenshot(self, path: str) -> None:
        """Save a PNG of the active tab to ``path``."""
        if self._task is None:
            raise EnvError("no episode has started; call reset first")
        self._run(lambda: self._browser.screenshot(path))

    @override
    def oracle_action(self) -> str:
        """The task plan's next action on the current page (raises EnvError off the plan or when done)."""
        if self._task is None or self._done:
            raise EnvError("the oracle advises only during an episode; call reset first")
        if self._oracle_deviated:
            raise EnvError("the oracle follows its own plan only, and this episode has left it")
        step = self._task.plan[self._oracle_index]
        if step.kind == "stop":
            action = WebAction(kind="stop", text=step.text)
        else:
            element = next(
                (i for i, el in self._snapshot.elements.items() if (el.role, el.name) == (step.role, step.name)), None
            )
            if element is None and self.options.viewport_only and self._oracle_scrolls < _ORACLE_MAX_SCROLLS:
                # The element may lie below the viewport: scroll without advancing the plan.
                self._oracle_pending, self._oracle_advances = "scroll [down]", False
                return self._oracle_pending
            if element is None:
                raise EnvError(f"the oracle cannot find {step.role} {step.name!r} on {self._snapshot.url}")
            action = WebAction(kind=step.kind, element=element, text=step.text, enter=step.enter)
        self._oracle_pending, self._oracle_advances = str(action), True
        return self._oracle_pending

    def oracle_episode(self, task_id: int) -> list[str]:
        """Reset to ``task_id``, play the oracle to the end, and return its actions."""
        self.reset(task_id)
        actions: list[str] = []
        while not self._done:
            actions.append(self.oracle_action())
            self.step(f"```{actions[-1]}```")
        return actions

    # ---------------------------------------------------------------------------- internals

    def _run(self, fn: Callable[..., T], *args: Any) -> T:
        # Playwright's sync API is bound to the thread that started it; callers (Ray, the HTTP server's
        # thread pool) may use any thread, so every browser call runs on this env's own worker.
        self._start()
        return self._worker.submit(fn, *args).result()

    def _start(self) -> None:
        if self._worker is not None:
            return
        self._sites = Sites(shop=ShopSite(CONTENT), forum=ForumSite(CONTENT))
        self._servers = {
            SHOP_HOME.rstrip("/"): SiteServer(self._sites.shop),
            FORUM_HOME.rstrip("/"): SiteServer(self._sites.forum),
        }
        self._browser = Browser(
            self._chromium,
            viewport=(self.options.viewport_width, self.options.viewport_height),
            navigation_timeout=self.options.navigation_timeout,
            action_timeout=self.options.action_timeout,
        )
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="web-browser")

    def _shown(self, text: str) -> str:
        """``text`` with the sites' local addresses replaced by the URLs the agent sees."""
        for alias, server in self._servers.items():
            text = text.replace(server.base_url, alias)
        return text

    def _real_url(self, url: str) -> str | None:
        if url == "about:blank":
            return url
        for alias, server in self._servers.items():
            for base in (alias, server.base_url):
                if url == base or url.startswith((base + "/", base + "?")):
                    return server.base_url + url[len(base) :]
        return None

    def _restart_browser(self, url: str) -> None:
        self._browser.close()
        self._browser.new_episode(url)

    def _reset(self, task: Task) -> Observation:
        self._sites.shop.reset()
        self._sites.forum.reset()
        start = self._real_url(task.start_url)
        note = ""
        try:
            self._browser.new_episode(start)
        except PlaywrightTimeout:
            self._browser.stop_loading()
            note = f"The start page did not finish loading within {self.options.navigation_timeout:g} s."
        except PlaywrightError:
            if self._browser.alive():
                raise
            self._restart_browser(start)  # the browser had died since the last episode
        self._task, self._previous, self._steps, self._done = task, "None", 0, False
        self._oracle_index, self._oracle_pending, self._oracle_deviated, self._oracle_scrolls = 0, None, False, 0
        self._snapshot = self._observe()
        # `sites` and `intent` as WebArena's task configs name them (AgentGym's /reset returns both).
        info = {
            "task_id": task.id,
            "template": task.template,
            "sites": [task.template.split("/")[0]],
            "intent": task.intent,
        }
        return Observation(text=self._prompt(note), info=info)

    def _step(self, action_text: str) -> StepResult:
        task = self._task
        self._steps += 1
        notes: list[str] = []
        if not self._browser.alive():
            self._restart_browser(self._real_url(self._snapshot.url) or self._real_url(task.start_url))
            notes.append(_BROWSER_RESTARTED)
        action = parse_reply(action_text)
        valid = isinstance(action, WebAction)
        if isinstance(action, WebAction) and str(action) == self._oracle_pending:
            self._oracle_index += self._oracle_advances
            self._oracle_scrolls = 0 if self._oracle_advances else self._oracle_scrolls + 1
        else:
            self._oracle_deviated = True
        self._oracle_pending = None
        if isinstance(action, InvalidAction):
            notes.append(action.reason)
            self._previous = f"{' '.join(action_text.split())[:200]} (not a valid action)"
        else:
            self._previous = str(action)
            self._browser.last_status = None
            try:
                notes.extend(self._execute(action))
            except ActionFailed as exc:
                valid = False
                notes.append(f"The action {action} failed: {exc}.")
            except PlaywrightTimeout:
                self._browser.stop_loading()
                notes.append(f"The page did not finish loading within {self.options.navigation_timeout:g} s.")
            except PlaywrightError as exc:
                if self._browser.alive():
                    valid = False
                    notes.append(f"The action {action} failed: {str(exc).splitlines()[0]}")
                else:
                    self._restart_browser(self._real_url(self._snapshot.url) or self._real_url(task.start_url))
                    notes.append(_BROWSER_RESTARTED)
            if self._browser.last_status is not None and self._browser.last_status >= 400:
                notes.append(f"The page answered with HTTP status {self._browser.last_status}.")
        self._snapshot = self._observe()
        stopped = isinstance(action, WebAction) and action.kind == "stop"
        self._done = stopped or (self.options.max_steps > 0 and self._steps >= self.options.max_steps)
        success = False
        if self._done:
            answer = action.text if stopped else ""
            success = task.evaluate(answer, self._snapshot.url, self._sites)
        info = {
            "task_id": task.id,
            "action_valid": valid,
            "success": success,
            "url": self._snapshot.url,
            "steps": self._steps,
        }
        return StepResult(observation=self._prompt(" ".join(notes)), reward=float(success), done=self._done, info=info)

    def _execute(self, action: WebAction) -> list[str]:
        """Carry out ``action`` on the active tab; returns notes for the observation."""
        browser = self._browser
        if action.kind in ("click", "hover", "type"):
            element = self._snapshot.elements.get(action.element)
            if element is None:
                raise ActionFailed(
                    f"there is no element [{action.element}] on the page; use an id from the observation"
                )
            target = browser.locate(element)
            try:
                if action.kind == "click":
                    target.click(trial=True)  # actionability only, within the action timeout
                elif action.kind == "hover":
                    target.hover()
                else:
                    target.fill(action.text)
            except PlaywrightTimeout as exc:
                timeout = self.options.action_timeout
                raise ActionFailed(f"{element.role} {element.name!r} could not be used within {timeout:g} s") from exc
            except PlaywrightError as exc:
                raise ActionFailed(f"{element.role} {element.name!r}: {str(exc).splitlines()[0]}") from exc
            # Clicks and Enter wait for the navigation they start; that wait is bounded by the navigation
            # timeout, and a timeout here is a slow page (reported as such), not a failed action.
            if action.kind == "click":
                target.click(timeout=browser.navigation_timeout_ms)
            elif action.kind == "type" and action.enter:
                target.press("Enter", timeout=browser.navigation_timeout_ms)
            if action.kind != "hover":
                browser.settle()
        elif action.kind == "press":
            browser.page.keyboard.press(action.text)
            browser.settle()
        elif action.kind == "scroll":
            browser.scroll(action.text)
        elif action.kind == "goto":
            url = self._real_url(action.text)
            if url is None:
                raise ActionFailed(f"goto can only open the bundled sites, {SHOP_HOME} and {FORUM_HOME}")
            browser.goto(url)
        elif action.kind in ("go_back", "go_forward"):
            if not browser.go("back" if action.kind == "go_back" else "forward"):
                return [f"There is no page to go {'back' if action.kind == 'go_back' else 'forward'} to."]
        elif action.kind == "new_tab":
            browser.new_tab()
        elif action.kind == "tab_focus":
            browser.focus_tab(action.element)
        elif action.kind == "close_tab":
            browser.close_tab()
        return []

    def _observe(self) -> Snapshot:
        return self._browser.snapshot(self.options.max_tree_chars, self._shown, self.options.viewport_only)

    def _prompt(self, note: str) -> str:
        snap = self._snapshot
        text = (
            f"OBSERVATION:\n{snap.tabs}\n\n{snap.tree}\nURL: {snap.url}\n"
            f"OBJECTIVE: {self._task.intent}\nPREVIOUS ACTION: {self._previous}"
        )
        return f"{note}\n\n{text}" if note else text
