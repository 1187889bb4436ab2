"""Deterministic generator of a synthetic multi-hop corpus and questions (the offline Deep Search data).

World
    Fictional countries, cities, companies and people with invented names (syllables drawn from a
    seeded ``random.Random``). Every relation is a function, so every question has one answer:
    a person's birthplace (city) and employer (company); a company's founder (person) and
    headquarters (city); a city's country and mayor (person); a country's capital (one of its
    own cities).

Corpus
    One passage per entity, titled with its name, stating each of its relations in a sentence that
    uses the relation's words ("The founder of Vexo Labs is Arin Dolmar."), so that a query such as
    "founder of Vexo Labs" retrieves it.

Questions
    2-4 hop chains from a random start entity through random relations, phrased as nested
    relations ("Who is the mayor of the birthplace of the founder of Vexo Labs?"). Each stores its
    gold hops: the query to search, the passage that answers it and the entity it yields; the last
    hop's entity is the answer. Chains that revisit an entity, and repeated questions, are redrawn.

``generate(seed)`` returns the same passages and questions for the same seed on every machine;
``ensure_generated(folder, seed)`` writes them once as ``corpus.jsonl`` and ``questions.jsonl``.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from agentgym_rl.envs.search.corpus import Hop, Passage, Question

# Part of the cache folder name: bump it whenever the generated data changes.
GENERATOR_VERSION = 2
# entity kind -> how many the world holds
_SIZES = {"country": 24, "city": 96, "company": 120, "person": 240}
# relation -> (subject kind, object kind, sentence template, question phrase)
_RELATIONS: dict[str, tuple[str, str, str, str]] = {
    "birthplace": ("person", "city", "The birthplace of {s} is {o}.", "the birthplace of {s}"),
    "employer": ("person", "company", "The employer of {s} is {o}.", "the employer of {s}"),
    "founder": ("company", "person", "The founder of {s} is {o}.", "the founder of {s}"),
    "headquarters": ("company", "city", "The headquarters of {s} are in {o}.", "the headquarters city of {s}"),
    "country": ("city", "country", "The country of {s} is {o}.", "the country of {s}"),
    "mayor": ("city", "person", "The mayor of {s} is {o}.", "the mayor of {s}"),
    "capital": ("country", "city", "The capital of {s} is {o}.", "the capital of {s}"),
}
_WH = {"person": "Who is", "city": "Which city is", "company": "Which company is", "country": "Which country is"}
_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "th", "sh", "qu"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "io", "ou"]
_CODAS = ["", "", "n", "r", "l", "s", "th", "x", "m"]
_COMPANY_SUFFIXES = ["Labs", "Works", "Systems", "Holdings", "Foundry", "Dynamics"]
_COUNTRY_SUFFIXES = ["ia", "land", "stan", "mark"]


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)).title()


def _name(rng: random.Random, kind: str) -> str:
    if kind == "person":
        return f"{_word(rng, 2)} {_word(rng, 2)}"
    if kind == "company":
        return f"{_word(rng, 2)} {rng.choice(_COMPANY_SUFFIXES)}"
    if kind == "country":
        return _word(rng, 2) + rng.choice(_COUNTRY_SUFFIXES)
    return _word(rng, 3)


def generate(seed: int = 0, questions: int = 1200) -> tuple[list[Passage], list[Question]]:
    """The synthetic world for ``seed``: its passages and ``questions`` multi-hop questions."""
    rng = random.Random(seed)
    used: set[str] = set()
    entities: dict[str, list[str]] = {}
    for kind, size in _SIZES.items():
        names = []
        while len(names) < size:
            name = _name(rng, kind)
            # Names must not repeat, nor be a word of another name (that would blur retrieval).
            if name not in used and not any(part in used for part in name.split()):
                used.add(name)
                names.append(name)
        entities[kind] = names
    facts: dict[str, dict[str, str]] = {name: {} for names in entities.values() for name in names}
    for relation, (subject_kind, object_kind, _, _) in _RELATIONS.items():
        for subject in entities[subject_kind]:
            facts[subject][relation] = rng.choice(entities[object_kind])
    # Geography stays consistent: every country has a city (the first cities are dealt round robin),
    # and its capital is one of its own cities.
    countries = entities["country"]
    for index, city in enumerate(entities["city"][: len(countries)]):
        facts[city]["country"] = countries[index]
    for country in countries:
        facts[country]["capital"] = rng.choice([c for c in entities["city"] if facts[c]["country"] == country])
    kind_of = {name: kind for kind, names in entities.items() for name in names}
    passages = []
    for name, relations in facts.items():
        sentences = [_RELATIONS[relation][2].format(s=name, o=obj) for relation, obj in relations.items()]
        text = f"{name} is a {kind_of[name]}. " + " ".join(sentences)
        passages.append(Passage(id=f"syn-{len(passages)}", title=name, text=text))
    passage_of = {passage.title: passage.id for passage in passages}
    by_subject: dict[str, list[str]] = {}
    for relation, (subject_kind, _, _, _) in _RELATIONS.items():
        by_subject.setdefault(subject_kind, []).append(relation)

    drawn: list[Question] = []
    seen: set[str] = set()
    while len(drawn) < questions:
        hops_wanted = 2 + len(drawn) % 3  # 2, 3, 4 hops in turn
        start = rng.choice(sorted(facts))
        chain, entity, phrase, hops = [start], start, start, []
        for _ in range(hops_wanted):
            relation = rng.choice(by_subject[kind_of[entity]])
            target = facts[entity][relation]
            query = f"{relation} of {entity}"
            hops.append(Hop(query=query, passage_id=passage_of[entity], entity=target))
            phrase = _RELATIONS[relation][3].format(s=phrase)
            chain.append(target)
            entity = target
        if len(set(chain)) < len(chain):
            continue
        text = f"{_WH[kind_of[entity]]} {phrase}?"
        if text in seen:
            continue
        seen.add(text)
        drawn.append(Question(id=f"synq-{len(drawn)}", question=text, answers=[entity], hops=hops))
    return passages, drawn


def ensure_generated(folder: Path, seed: int = 0) -> tuple[Path, Path]:
    """Write ``corpus.jsonl`` and ``questions.jsonl`` for ``seed`` into ``folder`` unless present.

    Returns their paths. Files are written under temporary names and renamed, so a crash or a
    concurrent writer never leaves a half-written file behind.
    """
    folder.mkdir(parents=True, exist_ok=True)
    corpus_path, questions_path = folder / "corpus.jsonl", folder / "questions.jsonl"
    if corpus_path.exists() and questions_path.exists():
        return corpus_path, questions_path
    passages, questions = generate(seed)
    for path, rows in ((corpus_path, passages), (questions_path, questions)):
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text("".join(json.dumps(row.model_dump()) + "\n" for row in rows))
        tmp.replace(path)
    return corpus_path, questions_path
