"""Deep Search: answer questions by searching a local corpus (the SearchQA / Search-R1 protocol).

Data
    By default the synthetic multi-hop world of ``envs.search.generate`` (seed ``synthetic_seed``),
    generated on first use into ``cache_dir/synthetic-v<GENERATOR_VERSION>-seed<seed>`` (default
    ``cache_dir``: ``~/.cache/agentgym-rl/search``) and read from there afterwards. Users with
    public data set ``corpus`` (wiki JSONL) and ``questions`` (NQ / HotpotQA-style JSONL); see
    ``envs.search.corpus`` for the formats.

Tasks and splits (deterministic)
    Task id ``i`` is the ``i``-th question of the file. ``test`` holds ``test_size`` ids (default
    200) drawn with ``random.Random(split_seed)``, ascending; ``train`` every other id, ascending.
    Evaluation reports a task under its question's gold hop count (``N hops``).

Protocol
    ``reset`` returns ``Question: <question>``. Each reply holds one tag; the first complete one
    counts: ``<search>query</search>`` returns the top ``top_k`` BM25 passages as
    ``<information>Doc 1 (Title: ...) text ...</information>``; ``<answer>text</answer>`` ends the
    episode. A reply with neither, an empty query or a query over 1000 characters comes back as an
    observation saying so. After ``max_turns`` replies without an answer the episode ends, reward 0.

Reward
    On the answer, exact match or token F1 against the best accepted answer, both after
    normalising (lowercase, punctuation and the articles a/an/the removed, whitespace collapsed);
    the ``reward`` option picks which is paid, ``info`` carries both, and success means exact match.

Oracle
    ``oracle_actions(task_id)`` searches each gold hop's query in turn, then answers the first
    accepted answer; it needs questions with gold hops (the synthetic ones have them).
    ``oracle_action()`` is the reply of that script for the current turn.
"""

from __future__ import annotations

import random
import re
import string
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from typing_extensions import override

from agentgym_rl.envs.base import EnvError, InvalidAction, Observation, StepResult, TextEnv
from agentgym_rl.envs.search.corpus import BM25Retriever, Question, load_corpus, load_questions
from agentgym_rl.envs.search.generate import GENERATOR_VERSION, ensure_generated
from agentgym_rl.envs.tools import Function, ToolCall

_TAG = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL | re.IGNORECASE)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_MAX_QUERY_CHARS = 1000
NO_ACTION_FOUND = "No action found. Reply with <search>query</search> to search or <answer>text</answer> to answer."

_INSTRUCTION = (
    "Answer the question. You can search a document collection as often as you need: write "
    "<search>your query</search> and the top results come back between <information> and "
    "</information>. Reason about what you read before each step. When you know the answer, write "
    "<answer>the answer</answer> with just the answer, no explanation. Each reply must contain "
    "exactly one <search> or one <answer>."
)

_TOOL_INSTRUCTION = (
    "Answer the question. You can search a document collection as often as you need: call search with a query "
    "and the top results come back. Reason about what you read before each step. When you know the answer, call "
    "answer with just the answer, no explanation. Make exactly one call per turn."
)


def _text_argument(name: str, description: str) -> dict[str, Any]:
    properties = {name: {"type": "string", "pattern": "\\S", "maxLength": _MAX_QUERY_CHARS, "description": description}}
    return {"type": "object", "properties": properties, "required": [name], "additionalProperties": False}


FUNCTIONS: tuple[Function, ...] = (
    Function(
        name="search",
        description="Search the document collection; returns the top passages.",
        parameters=_text_argument("query", "What to search for."),
    ),
    Function(
        name="answer",
        description="Give the final answer; ends the episode.",
        parameters=_text_argument("text", "Just the answer, no explanation."),
    ),
)
_ARGUMENT = {"search": "query", "answer": "text"}


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation and the articles a/an/the, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, answers: Sequence[str]) -> float:
    """1.0 if the normalised prediction equals a normalised answer, else 0.0."""
    return float(any(normalize_answer(prediction) == normalize_answer(answer) for answer in answers))


def f1_score(prediction: str, answers: Sequence[str]) -> float:
    """Best token-level F1 of the normalised prediction against the normalised answers."""
    predicted = normalize_answer(prediction).split()
    best = 0.0
    for answer in answers:
        gold = normalize_answer(answer).split()
        common = sum((Counter(predicted) & Counter(gold)).values())
        if common:
            precision, recall = common / len(predicted), common / len(gold)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


class SearchEnv(TextEnv):
    """Question answering with a local BM25 search tool."""

    name = "search"
    default_max_turns = 30  # the paper's Deep Search evaluation

    class Options(BaseModel):
        """Options of the Deep Search environment."""

        model_config = ConfigDict(extra="forbid")

        corpus: Path | None = Field(default=None, description="Corpus JSONL; None uses the synthetic corpus.")
        questions: Path | None = Field(default=None, description="Questions JSONL; None uses the synthetic questions.")
        cache_dir: Path = Field(
            default=Path("~/.cache/agentgym-rl/search"), description="Where the synthetic data is generated."
        )
        synthetic_seed: int = Field(default=0, description="Seed of the synthetic world.")
        top_k: int = Field(default=3, ge=1, le=50, description="Passages returned per search.")
        max_turns: int = Field(default=30, ge=1, description="Replies allowed before the episode ends unanswered.")
        reward: Literal["em", "f1"] = Field(default="em", description="Answer reward: exact match or token F1.")
        test_size: int = Field(default=200, ge=1, description="Questions held out for the test split.")
        split_seed: int = Field(default=0, description="Seed of the draw that picks the test questions.")

        @model_validator(mode="after")
        def _both_or_neither(self) -> SearchEnv.Options:
            if (self.corpus is None) != (self.questions is None):
                raise ValueError("set both corpus and questions, or neither (for the synthetic data)")
            return self

    def __init__(self, **options: Any) -> None:
        self.options = self.Options(**options)
        corpus_path, questions_path = self.options.corpus, self.options.questions
        if corpus_path is None or questions_path is None:
            name = f"synthetic-v{GENERATOR_VERSION}-seed{self.options.synthetic_seed}"
            folder = self.options.cache_dir.expanduser() / name
            corpus_path, questions_path = ensure_generated(folder, self.options.synthetic_seed)
        self.retriever = BM25Retriever(load_corpus(corpus_path))
        self.questions: list[Question] = load_questions(questions_path)
        if self.options.test_size >= len(self.questions):
            raise EnvError(f"test_size {self.options.test_size} must be below the {len(self.questions)} questions")
        self._question: Question | None = None
        self._task_id = -1
        self._turns = 0
        self._done = False
        self._seen: tuple[str, ...] = ()  # ids of the passages the episode's searches returned, sorted

    @property
    def instruction(self) -> str:
        """System prompt: the search / answer tag protocol."""
        return _INSTRUCTION

    def tasks(self, split: str) -> Sequence[int]:
        """Ids of ``split`` ("train" or "test"), ascending."""
        total = len(self.questions)
        test = sorted(random.Random(self.options.split_seed).sample(range(total), self.options.test_size))
        if split == "test":
            return test
        if split == "train":
            held_out = set(test)
            return [task_id for task_id in range(total) if task_id not in held_out]
        raise EnvError(f"unknown split {split!r}; valid splits: train, test")

    @property
    @override
    def tool_instruction(self) -> str:
        """System prompt in ``env.action_format: tools``: the question-answering task with search and answer calls."""
        return _TOOL_INSTRUCTION

    @override
    def functions(self) -> list[Function]:
        """``search(query)`` and ``answer(text)``."""
        return list(FUNCTIONS)

    @override
    def action_text(self, call: ToolCall) -> str:
        """``<search>query</search>`` or ``<answer>text</answer>``."""
        return f"<{call.name}>{call.arguments[_ARGUMENT[call.name]]}</{call.name}>"

    @override
    def call_of_action(self, action: str) -> ToolCall | None:
        """The call of a reply's first complete tag (``<search>query</search>``); None when it has none."""
        parsed = self.parse_action(action)
        if isinstance(parsed, InvalidAction):
            return None
        name, _, content = parsed.partition(": ")
        return ToolCall(id="call_0", name=name, arguments={_ARGUMENT[name]: content})

    @override
    def task_category(self, task_id: int) -> str:
        """``N hops``: the gold hop count of question ``task_id`` (``0 hops`` for questions without hops)."""
        return f"{len(self._question_of(task_id).hops)} hops"

    def reset(self, task_id: int) -> Observation:
        """Start answering question ``task_id``."""
        self._question = self._question_of(task_id)
        self._task_id = task_id
        self._turns = 0
        self._done = False
        self._seen = ()
        return Observation(
            text=f"Question: {self._question.question}",
            info={"task_id": task_id, "question_id": self._question.id, "hops": len(self._question.hops)},
        )

    def parse_action(self, model_text: str) -> str | InvalidAction:
        """``search: <query>`` or ``answer: <text>`` from the first complete tag, or InvalidAction."""
        match = _TAG.search(model_text)
        if match is None:
            return InvalidAction(reason=NO_ACTION_FOUND)
        kind, content = match.group(1).lower(), " ".join(match.group(2).split())
        if not content:
            return InvalidAction(reason=f"The <{kind}> tag is empty. {NO_ACTION_FOUND}")
        if len(content) > _MAX_QUERY_CHARS:
            return InvalidAction(reason=f"The <{kind}> text is longer than {_MAX_QUERY_CHARS} characters.")
        return f"{kind}: {content}"

    def step(self, action_text: str) -> StepResult:
        """Run one search or take the answer; malformed replies come back as observations."""
        if self._question is None:
            raise EnvError("no episode has started; call reset first")
        if self._done:
            raise EnvError("episode is over; call reset")
        self._turns += 1
        action = self.parse_action(action_text)
        info: dict[str, Any] = {"success": False, "action_valid": not isinstance(action, InvalidAction)}
        reward = 0.0
        if isinstance(action, InvalidAction):
            text = action.reason
        elif action.startswith("answer: "):
            answer = action.removeprefix("answer: ")
            em, f1 = exact_match(answer, self._question.answers), f1_score(answer, self._question.answers)
            reward = em if self.options.reward == "em" else f1
            info.update(success=em == 1.0, em=em, f1=f1)
            self._done = True
            text = f"Your answer: {answer}"
        else:
            text = self._information(action.removeprefix("search: "))
        if not self._done and self._turns >= self.options.max_turns:
            self._done = True
            text += f"\nThe episode is over: no answer within {self.options.max_turns} turns."
        info["turns"] = self._turns
        return StepResult(observation=text, reward=reward, done=self._done, info=info)

    @override
    def state_key(self) -> tuple[str, ...] | None:
        """The passages the episode's searches have returned so far (what the agent has read; the question is the
        task's), as sorted ids; None before the first reset and once the answer is in."""
        return None if self._question is None or self._done else self._seen

    def oracle_actions(self, task_id: int) -> list[str]:
        """Replies that search every gold hop's query, then answer; EnvError without gold hops."""
        question = self._question_of(task_id)
        if not question.hops:
            raise EnvError(f"question {question.id} has no gold hops to follow")
        return [f"<search>{hop.query}</search>" for hop in question.hops] + [f"<answer>{question.answers[0]}</answer>"]

    @override
    def oracle_action(self) -> str:
        """The oracle script's reply for the current turn (hop searches by turn number, then the answer)."""
        if self._question is None:
            raise EnvError("no episode has started; call reset first")
        if self._done:
            raise EnvError("episode is over; call reset")
        script = self.oracle_actions(self._task_id)
        return script[min(self._turns, len(script) - 1)]

    def _question_of(self, task_id: int) -> Question:
        if isinstance(task_id, bool) or not isinstance(task_id, int):
            raise EnvError(f"task id must be an integer, got {task_id!r}")
        if not 0 <= task_id < len(self.questions):
            raise EnvError(f"task id {task_id} is out of range; this question set has ids 0..{len(self.questions) - 1}")
        return self.questions[task_id]

    def _information(self, query: str) -> str:
        found = self.retriever.search(query, self.options.top_k)
        self._seen = tuple(sorted({*self._seen, *(passage.id for passage in found)}))
        if not found:
            return "<information>No passage matches the query; try other words.</information>"
        docs = "\n".join(f"Doc {n} (Title: {p.title}) {p.text}" for n, p in enumerate(found, start=1))
        return f"<information>{docs}</information>"
