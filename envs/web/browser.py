"""A Playwright driver of the system Chromium that renders pages as WebArena's accessibility tree.

``Browser`` is not thread-safe and must be used from one thread (Playwright's sync API is bound to the
thread that started it); ``envs.web.env`` gives each env its own worker thread for that.

The tree is Chromium's full accessibility tree (CDP ``Accessibility.getFullAXTree``, as WebArena reads
it), printed depth-first with one node per line: ``[id] role 'name' property: value``. Nodes that only
wrap others (generic containers, unnamed paragraphs and list items, ignored nodes) are left out and their
children lifted, as is text that repeats its parent's name. Ids count from 1 in print order, so the same
page always reads the same; they are valid until the next observation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from playwright.sync_api import CDPSession, Page, Playwright, sync_playwright
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import TimeoutError as PlaywrightTimeout

_SKIPPED_ROLES = frozenset({"none", "generic", "InlineTextBox", "LineBreak", "ListMarker", "presentation"})
_SKIPPED_WHEN_UNNAMED = frozenset(
    {"paragraph", "listitem", "list", "group", "Section", "LabelText", "strong", "emphasis", "form", "row", "cell"}
)
_SHOWN_PROPERTIES = ("focused", "checked", "selected", "expanded", "disabled", "required", "pressed")
# Marks the element an action targets, so Playwright's actionability checks and waits apply to it.
_TARGET_ATTRIBUTE = "data-agentgym-target"
_MARK_TARGET = (
    "function() { const el = this.nodeType === 1 ? this : (this.nodeType === 9 ? this.documentElement : "
    f"this.parentElement); document.querySelectorAll('[{_TARGET_ATTRIBUTE}]').forEach("
    f"e => e.removeAttribute('{_TARGET_ATTRIBUTE}')); if (el) el.setAttribute('{_TARGET_ATTRIBUTE}', '1'); }}"
)
LAUNCH_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    # Only loopback resolves: a page or a `goto` can never reach beyond the bundled sites.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
)


class ActionFailed(Exception):
    """The action could not be carried out on this page (unknown id, element not editable, ...)."""


@dataclass(frozen=True)
class Element:
    """A numbered node of the last rendered tree."""

    backend_id: int
    role: str
    name: str


@dataclass(frozen=True)
class Snapshot:
    """What the active tab shows: tab titles line, the tree, the URL, and the numbered elements."""

    tabs: str
    tree: str
    url: str
    elements: dict[int, Element]


def render_tree(
    nodes: list[dict], max_chars: int, in_view: Callable[[int], bool] | None = None
) -> tuple[str, dict[int, Element]]:
    """Print CDP accessibility nodes as WebArena's tree (module docstring); cut after ``max_chars``.

    ``in_view(backend_node_id)``, when given, leaves out nodes outside the viewport (their children
    are still considered), as WebArena's ``current_viewport_only`` does.
    """
    by_id = {node["nodeId"]: node for node in nodes}
    roots = [node for node in nodes if not node.get("parentId")]
    if not roots:
        return "", {}
    lines: list[str] = []
    elements: dict[int, Element] = {}
    size = 0
    stack: list[tuple[str, int, str]] = [(roots[0]["nodeId"], 0, "")]
    while stack:
        node_id, depth, parent_name = stack.pop()
        node = by_id.get(node_id)
        if node is None:
            continue
        role = str(node.get("role", {}).get("value", ""))
        name = " ".join(str(node.get("name", {}).get("value", "") or "").split())
        shown = not (
            node.get("ignored")
            or node.get("backendDOMNodeId") is None
            or role in _SKIPPED_ROLES
            or (role in _SKIPPED_WHEN_UNNAMED and not name)
            or (role == "StaticText" and (not name or name == parent_name))
            or (in_view is not None and not in_view(node["backendDOMNodeId"]))
        )
        if shown:
            props = {p["name"]: p.get("value", {}).get("value") for p in node.get("properties", [])}
            extra = "".join(f" {key}: {props[key]}" for key in _SHOWN_PROPERTIES if key in props)
            line = "\t" * depth + f"[{len(elements) + 1}] {role} {name!r}{extra}"
            if size + len(line) + 1 > max_chars:
                lines.append("... (the rest of the page is cut off)")
                break
            elements[len(elements) + 1] = Element(node["backendDOMNodeId"], role, name)
            lines.append(line)
            size += len(line) + 1
            depth, parent_name = depth + 1, name
        stack.extend((child, depth, parent_name) for child in reversed(node.get("childIds", [])))
    return "\n".join(lines), elements


class Browser:
    """One Chromium process with one context per episode; tabs are the context's pages."""

    def __init__(
        self, chromium_path: str, *, viewport: tuple[int, int], navigation_timeout: float, action_timeout: float
    ) -> None:
        self.chromium_path = chromium_path
        self.viewport = viewport
        self.navigation_timeout_ms = navigation_timeout * 1000
        self.action_timeout_ms = action_timeout * 1000
        self._playwright: Playwright | None = None
        self._browser = None
        self._context = None
        self._active = 0
        self._cdp: dict[Page, CDPSession] = {}
        self.last_status: int | None = None

    # ------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Launch Chromium (and Playwright's driver) if they are not running."""
        if self._browser is not None:
            return
        self._playwright = sync_playwright().start()
        self._browser = self._playwright.chromium.launch(executable_path=self.chromium_path, args=list(LAUNCH_ARGS))

    def alive(self) -> bool:
        """Whether the browser process still answers (a killed Chromium reads as not alive)."""
        if self._browser is None:
            return False
        if self._context is not None and self._context.pages:
            # A round trip: the driver learns of a dead browser only when it next talks to it, and a dead
            # driver only shows as a closed connection.
            try:
                self.page.evaluate("1")
            except PlaywrightError as exc:
                if "connection closed" in str(exc).lower():
                    return False
        return self._browser.is_connected()

    def close(self) -> None:
        """Close the context, the browser and the driver; safe to call twice or after a crash."""
        # After a crash these fail in several ways (closed target, closed driver connection); there is
        # nothing left to release then, so every failure is ignored.
        for closeable in (self._context, self._browser):
            if closeable is not None:
                with contextlib.suppress(Exception):
                    closeable.close()
        if self._playwright is not None:
            with contextlib.suppress(Exception):
                self._playwright.stop()
        self._playwright = self._browser = self._context = None
        self._cdp.clear()

    def new_episode(self, url: str) -> None:
        """Drop the previous episode's tabs and cookies; open ``url`` in a fresh context."""
        self.start()
        if self._context is not None:
            with contextlib.suppress(PlaywrightError):
                self._context.close()
        self._cdp.clear()
        width, height = self.viewport
        self._context = self._browser.new_context(viewport={"width": width, "height": height})
        self._context.set_default_timeout(self.action_timeout_ms)
        self._context.set_default_navigation_timeout(self.navigation_timeout_ms)
        self._context.on("page", self._watch)
        self._context.new_page()
        self._active = 0
        self.goto(url)

    # ---------------------------------------------------------------------------------- tabs

    @property
    def page(self) -> Page:
        """The active tab."""
        return self._context.pages[self._active]

    def _watch(self, page: Page) -> None:
        page.on("dialog", lambda dialog: dialog.dismiss())
        page.on("response", lambda response: self._record(page, response))

    def _record(self, page: Page, response) -> None:
        if response.request.is_navigation_request() and response.frame == page.main_frame:
            self.last_status = response.status

    def new_tab(self) -> None:
        """Open a blank tab and make it active."""
        self._context.new_page()
        self._active = len(self._context.pages) - 1

    def focus_tab(self, index: int) -> None:
        """Make tab ``index`` active."""
        if not 0 <= index < len(self._context.pages):
            raise ActionFailed(f"there is no tab {index}; open tabs are 0 to {len(self._context.pages) - 1}")
        self._active = index
        self.page.bring_to_front()

    def close_tab(self) -> None:
        """Close the active tab; the last one left becomes active (a blank tab when none is left)."""
        self._cdp.pop(self.page, None)
        self.page.close()
        if not self._context.pages:
            self._context.new_page()
        self._active = len(self._context.pages) - 1

    # ------------------------------------------------------------------------------- actions

    def goto(self, url: str) -> None:
        """Load ``url`` in the active tab; raises PlaywrightTimeout after the navigation timeout."""
        self.page.goto(url)

    def locate(self, element: Element):
        """A Playwright locator for a tree element (marks its DOM node, see ``_MARK_TARGET``)."""
        cdp = self._session()
        try:
            remote = cdp.send("DOM.resolveNode", {"backendNodeId": element.backend_id})
            cdp.send(
                "Runtime.callFunctionOn",
                {"objectId": remote["object"]["objectId"], "functionDeclaration": _MARK_TARGET},
            )
        except PlaywrightError as exc:
            raise ActionFailed(f"the element {element.role} {element.name!r} is no longer on the page") from exc
        return self.page.locator(f"[{_TARGET_ATTRIBUTE}]")

    def settle(self) -> None:
        """Wait for a navigation an action started to load (bounded by the navigation timeout)."""
        self.page.wait_for_load_state("load")

    def stop_loading(self) -> None:
        """Stop a page that is still loading, so the next action starts from a quiet page."""
        with contextlib.suppress(PlaywrightError):
            self._session().send("Page.stopLoading")

    def scroll(self, direction: str) -> None:
        """Scroll the active tab one viewport up or down."""
        sign = "-" if direction == "up" else ""
        self.page.evaluate(f"window.scrollBy(0, {sign}window.innerHeight)")

    def go(self, direction: str) -> bool:
        """History back or forward; False when there is no such page."""
        before = self.page.url
        self.page.go_back() if direction == "back" else self.page.go_forward()
        # Both return None for pages without a response (about:blank), so compare URLs instead.
        return self.page.url != before

    # ------------------------------------------------------------------------------- observe

    def snapshot(self, max_chars: int, shown: Callable[[str], str], viewport_only: bool = False) -> Snapshot:
        """Render the active tab; ``shown`` maps local addresses in titles, tree and URL to those the agent sees.

        ``viewport_only`` keeps only the nodes whose layout box meets the visible part of the page.
        """
        titles = []
        for index, page in enumerate(self._context.pages):
            try:
                title = page.title()
            except PlaywrightError:
                title = ""
            titles.append(f"Tab {index} (current): {title}" if index == self._active else f"Tab {index}: {title}")
        try:
            nodes = self._session().send("Accessibility.getFullAXTree")["nodes"]
        except PlaywrightError:
            nodes = []
        in_view = self._in_view() if viewport_only and nodes else None
        tree, elements = render_tree(nodes, max_chars, in_view)
        return Snapshot(tabs=shown(" | ".join(titles)), tree=shown(tree), url=shown(self.page.url), elements=elements)

    def _in_view(self) -> Callable[[int], bool] | None:
        """A test of backend node ids against the viewport, from one DOM snapshot with layout boxes."""
        try:
            snap = self._session().send("DOMSnapshot.captureSnapshot", {"computedStyles": []})
        except PlaywrightError:
            return None
        document = snap["documents"][0]
        backend_ids = document["nodes"]["backendNodeId"]
        top = document.get("scrollOffsetY", 0)
        left = document.get("scrollOffsetX", 0)
        width, height = self.viewport
        boxes = {
            backend_ids[index]: bounds
            for index, bounds in zip(document["layout"]["nodeIndex"], document["layout"]["bounds"], strict=True)
        }

        def in_view(backend_id: int) -> bool:
            box = boxes.get(backend_id)
            if box is None:  # no layout box of its own (e.g. display: contents): judged by its children
                return True
            x, y, w, h = box
            return x < left + width and x + w > left and y < top + height and y + h > top

        return in_view

    def screenshot(self, path: str) -> None:
        """Save a PNG of the active tab's viewport to ``path``."""
        self.page.screenshot(path=path)

    def _session(self) -> CDPSession:
        page = self.page
        if page not in self._cdp:
            self._cdp[page] = self._context.new_cdp_session(page)
        return self._cdp[page]


__all__ = ["ActionFailed", "Browser", "Element", "PlaywrightError", "PlaywrightTimeout", "Snapshot", "render_tree"]
