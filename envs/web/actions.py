"""WebArena's id-based action space, parsed from a model reply.

A reply holds its action in a fenced block, as WebArena's prompts ask ("In summary, the next action I
will perform is ```click [12]```"); the first block counts. A reply with no fenced block may give the
action on an ``Action:`` line instead (this project's generic reply format). Actions:

``click [id]``, ``type [id] [text] [0|1]`` (``1``, the default, presses Enter after typing),
``hover [id]``, ``press [keys]`` (e.g. ``Control+a``), ``scroll [up|down]`` (WebArena's
``scroll [direction=down]`` too), ``goto [url]``, ``go_back``, ``go_forward``, ``new_tab``,
``tab_focus [n]``, ``close_tab``, ``stop [answer]`` (``stop`` alone answers nothing).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from agentgym_rl.envs.base import InvalidAction

ActionKind = Literal[
    "click", "type", "hover", "press", "scroll", "goto", "go_back", "go_forward", "new_tab", "tab_focus",
    "close_tab", "stop",
]  # fmt: skip

ACTION_SYNTAX = (
    "click [id], type [id] [text] [0|1], hover [id], press [keys], scroll [up|down], goto [url], go_back, "
    "go_forward, new_tab, tab_focus [tab index], close_tab, stop [answer]"
)
NO_ACTION = (
    "No action found. End your reply with the next action in a fenced block, e.g. "
    "'In summary, the next action I will perform is ```click [12]```'."
)

_FENCED = re.compile(r"```((?:.|\n)*?)```")
_MARKER = re.compile(r"action\s*:", re.IGNORECASE)
_NO_ARGUMENT = ("go_back", "go_forward", "new_tab", "close_tab")
_ID_ONLY = ("click", "hover")
_TYPE_WITH_FLAG = re.compile(r"type\s*\[\s*(\d+)\s*\]\s*\[(.*)\]\s*\[\s*([01])\s*\]", re.DOTALL)
_TYPE = re.compile(r"type\s*\[\s*(\d+)\s*\]\s*\[(.*)\]", re.DOTALL)
_BRACKETED = re.compile(r"(\w+)\s*\[(.*)\]", re.DOTALL)


@dataclass(frozen=True)
class WebAction:
    """A parsed action; ``str()`` gives its canonical text."""

    kind: ActionKind
    element: int | None = None
    text: str = ""
    enter: bool = False

    def __str__(self) -> str:
        if self.kind in _NO_ARGUMENT:
            return self.kind
        if self.kind in _ID_ONLY:
            return f"{self.kind} [{self.element}]"
        if self.kind == "type":
            return f"type [{self.element}] [{self.text}] [{int(self.enter)}]"
        if self.kind == "tab_focus":
            return f"tab_focus [{self.element}]"
        return f"{self.kind} [{self.text}]"


def extract_action_text(reply: str) -> str | None:
    """The action text of a reply: the first fenced block, else the line after the last ``Action:``."""
    fenced = _FENCED.search(reply)
    if fenced:
        return fenced.group(1).strip()
    markers = list(_MARKER.finditer(reply))
    if not markers:
        return None
    lines = (line.strip() for line in reply[markers[-1].end() :].splitlines())
    return next((line for line in lines if line), None)


def parse_web_action(text: str) -> WebAction | InvalidAction:
    """Parse one action (no fences) into a ``WebAction``; an InvalidAction names what is wrong."""
    text = text.strip().strip("`").strip()
    if text in _NO_ARGUMENT:
        return WebAction(kind=text)  # type: ignore[arg-type]
    if text == "stop":
        return WebAction(kind="stop")
    if text.startswith("type"):
        match = _TYPE_WITH_FLAG.fullmatch(text) or _TYPE.fullmatch(text)
        if match is None:
            return InvalidAction(reason=f"Cannot parse {text!r}: write type [id] [text] [0|1].")
        enter = match.group(3) != "0" if match.lastindex == 3 else True
        return WebAction(kind="type", element=int(match.group(1)), text=match.group(2), enter=enter)
    match = _BRACKETED.fullmatch(text)
    if match is None:
        return InvalidAction(reason=f"Unknown action {text[:200]!r}. Valid actions: {ACTION_SYNTAX}.")
    kind, argument = match.group(1), match.group(2).strip()
    if kind in _ID_ONLY or kind == "tab_focus":
        if not argument.isdigit():
            what = "a tab index" if kind == "tab_focus" else "an element id from the page"
            return InvalidAction(reason=f"{kind} needs {what} in brackets, got [{argument[:100]}].")
        return WebAction(kind=kind, element=int(argument))  # type: ignore[arg-type]
    if kind == "scroll":
        direction = argument.removeprefix("direction=").strip()
        if direction not in ("up", "down"):
            return InvalidAction(reason=f"scroll takes [up] or [down], got [{argument[:100]}].")
        return WebAction(kind="scroll", text=direction)
    if kind in ("press", "goto"):
        if not argument:
            return InvalidAction(reason=f"{kind} needs an argument in brackets.")
        return WebAction(kind=kind, text=argument)  # type: ignore[arg-type]
    if kind == "stop":
        return WebAction(kind="stop", text=argument)
    return InvalidAction(reason=f"Unknown action {kind!r}. Valid actions: {ACTION_SYNTAX}.")


def parse_reply(reply: str) -> WebAction | InvalidAction:
    """The action of a model reply (see the module docstring)."""
    text = extract_action_text(reply)
    if not text:
        return InvalidAction(reason=NO_ACTION)
    return parse_web_action(text)
