"""Passages, questions, their JSONL loaders, and the local BM25 retriever of the Deep Search env.

Formats read
    Corpus JSONL, one passage per line, either ``{"id", "title", "text"}`` (the synthetic corpus;
    ``id`` may be left out and becomes the line number) or the wiki dump format
    ``{"id", "contents"}`` whose first line is the title (quotes around it are dropped) and the
    rest the text. Questions JSONL in NQ / HotpotQA style: ``question`` plus the answers as
    ``answers`` or ``golden_answers`` (a list) or ``answer`` (a string); ``id`` and the gold
    ``hops`` are optional.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import bm25s
from pydantic import BaseModel, ConfigDict, Field

from agentgym_rl.envs.base import EnvError

_TOKEN = re.compile(r"\w+")


class Passage(BaseModel):
    """One retrievable passage."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="Passage id, unique in its corpus.")
    title: str = Field(description="Title (the entity or article name).")
    text: str = Field(description="Body text.")


class Hop(BaseModel):
    """One step of a question's gold reasoning chain."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(description="Search query that finds this hop's fact.")
    passage_id: str = Field(description="Id of the passage that states the fact.")
    entity: str = Field(description="The entity this hop yields (the last hop's is the answer).")


class Question(BaseModel):
    """A question with its accepted answers and, when known, its gold hops."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="Question id.")
    question: str = Field(description="The question text.")
    answers: list[str] = Field(min_length=1, description="Accepted answers; any one is correct.")
    hops: list[Hop] = Field(default_factory=list, description="Gold hop chain; empty when unknown.")


def _rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    if not path.is_file():
        raise EnvError(f"file not found: {path}")
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise EnvError(f"{path}:{number} is not valid JSON: {error}") from error
            if not isinstance(row, dict):
                raise EnvError(f"{path}:{number} must be a JSON object")
            rows.append((number, row))
    if not rows:
        raise EnvError(f"{path} holds no rows")
    return rows


def load_corpus(path: Path) -> list[Passage]:
    """Passages of a corpus JSONL file (``{"id","title","text"}`` or ``{"id","contents"}`` per line)."""
    passages = []
    for number, row in _rows(path):
        if "contents" in row:
            title, _, text = str(row["contents"]).partition("\n")
            title = title.strip().strip('"')
        elif "title" in row and "text" in row:
            title, text = str(row["title"]), str(row["text"])
        else:
            raise EnvError(f"{path}:{number} needs 'title' and 'text', or 'contents'; it has {sorted(row)}")
        passages.append(Passage(id=str(row.get("id", number)), title=title, text=text))
    return passages


def load_questions(path: Path) -> list[Question]:
    """Questions of an NQ / HotpotQA-style JSONL file: ``question`` plus the answers (see module docstring)."""
    questions = []
    for number, row in _rows(path):
        answers = row.get("answers", row.get("golden_answers", row.get("answer")))
        if isinstance(answers, str):
            answers = [answers]
        if "question" not in row or not answers:
            raise EnvError(f"{path}:{number} needs 'question' and a non-empty 'answers', 'golden_answers' or 'answer'")
        hops = [Hop(**hop) for hop in row.get("hops", [])]
        qid = str(row.get("id", number))
        questions.append(Question(id=qid, question=str(row["question"]), answers=[str(a) for a in answers], hops=hops))
    return questions


def tokenize(text: str) -> list[str]:
    """Lowercase word tokens (the retriever's analyser for passages and queries alike)."""
    return _TOKEN.findall(text.lower())


class BM25Retriever:
    """BM25 (``bm25s``, Lucene variant) over passages indexed as ``title + text``."""

    def __init__(self, passages: list[Passage]) -> None:
        if not passages:
            raise EnvError("the corpus is empty")
        self.passages = passages
        self._index = bm25s.BM25()
        self._index.index([tokenize(f"{p.title} {p.text}") for p in passages], show_progress=False)

    def search(self, query: str, k: int) -> list[Passage]:
        """The up to ``k`` best passages for ``query``, best first; passages sharing no word are left out."""
        tokens = tokenize(query)
        if not tokens:
            return []
        k = min(k, len(self.passages))
        ids, scores = self._index.retrieve([tokens], k=k, show_progress=False, n_threads=1)
        return [self.passages[int(i)] for i, score in zip(ids[0], scores[0], strict=True) if score > 0]
