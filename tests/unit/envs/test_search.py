"""Deep Search: synthetic data, loaders, BM25 retrieval, protocol, rewards, oracle and robustness."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pydantic
import pytest

from agentgym_rl.envs import registry
from agentgym_rl.envs.base import EnvError, StepResult
from agentgym_rl.envs.search import (
    BM25Retriever,
    Passage,
    SearchEnv,
    exact_match,
    f1_score,
    generate,
    load_corpus,
    load_questions,
    normalize_answer,
)
from agentgym_rl.envs.search.env import NO_ACTION_FOUND
from agentgym_rl.envs.search.generate import GENERATOR_VERSION


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("search-cache")


@pytest.fixture(scope="module")
def env(cache_dir: Path) -> SearchEnv:
    return SearchEnv(cache_dir=cache_dir)


# ---------------------------------------------------------------------------- generator


def test_generator_is_deterministic_and_multi_hop() -> None:
    passages, questions = generate(0)
    again_passages, again_questions = generate(0)
    assert passages == again_passages and questions == again_questions
    assert generate(1)[1] != questions
    assert len(questions) == 1200 and len({q.question for q in questions}) == 1200
    assert {len(q.hops) for q in questions} == {2, 3, 4}
    titles = {p.id: p.title for p in passages}
    for question in questions[:200]:
        # Every hop starts from the previous hop's entity and ends at the answer.
        starts = [titles[hop.passage_id] for hop in question.hops]
        assert starts[1:] == [hop.entity for hop in question.hops[:-1]]
        assert question.hops[-1].entity == question.answers[0]


def test_generated_files_are_written_once_and_reused(env: SearchEnv, cache_dir: Path) -> None:
    folder = cache_dir / f"synthetic-v{GENERATOR_VERSION}-seed0"
    corpus, questions = folder / "corpus.jsonl", folder / "questions.jsonl"
    assert corpus.is_file() and questions.is_file()
    mtime = corpus.stat().st_mtime_ns
    again = SearchEnv(cache_dir=cache_dir)
    assert corpus.stat().st_mtime_ns == mtime and again.questions == env.questions
    assert load_questions(questions) == generate(0)[1]


def test_every_gold_hop_passage_is_retrieved_first(env: SearchEnv) -> None:
    for question in env.questions:
        for hop in question.hops:
            assert env.retriever.search(hop.query, 3)[0].id == hop.passage_id, hop.query


# ------------------------------------------------------------------------------ loaders


def test_loaders_read_wiki_and_nq_formats(tmp_path: Path) -> None:
    wiki = tmp_path / "wiki.jsonl"
    wiki.write_text(
        json.dumps({"id": "0", "contents": '"Ada Lovelace"\nAda Lovelace wrote the first program.'})
        + "\n\n"
        + json.dumps({"title": "Charles Babbage", "text": "Babbage designed the Analytical Engine."})
        + "\n"
    )
    passages = load_corpus(wiki)
    assert passages == [
        Passage(id="0", title="Ada Lovelace", text="Ada Lovelace wrote the first program."),
        Passage(id="3", title="Charles Babbage", text="Babbage designed the Analytical Engine."),
    ]
    qa = tmp_path / "qa.jsonl"
    rows = [
        {"question": "who wrote the first program?", "golden_answers": ["Ada Lovelace", "Lovelace"]},
        {"id": "h1", "question": "who designed the engine?", "answer": "Charles Babbage"},
        {"question": "q", "answers": ["a"]},
    ]
    qa.write_text("".join(json.dumps(row) + "\n" for row in rows))
    questions = load_questions(qa)
    assert [q.answers for q in questions] == [["Ada Lovelace", "Lovelace"], ["Charles Babbage"], ["a"]]
    assert [q.id for q in questions] == ["1", "h1", "3"]
    env = SearchEnv(corpus=wiki, questions=qa, test_size=1)
    env.reset(1)
    assert "Charles Babbage" in env.step("<search>analytical engine</search>").observation
    assert env.step("<answer>charles babbage.</answer>").info["success"]
    with pytest.raises(EnvError, match="no gold hops"):
        env.oracle_actions(0)


@pytest.mark.parametrize(
    ("line", "message"),
    [("{not json", "not valid JSON"), ('["a"]', "JSON object"), ('{"id": 1}', "needs 'title' and 'text'")],
)
def test_bad_corpus_lines_are_named(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(EnvError, match=message):
        load_corpus(path)


def test_missing_files_and_answers_are_named(tmp_path: Path) -> None:
    with pytest.raises(EnvError, match="file not found"):
        load_corpus(tmp_path / "nope.jsonl")
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"question": "q", "answers": []}) + "\n")
    with pytest.raises(EnvError, match="non-empty 'answers'"):
        load_questions(path)


def test_retriever_ranks_by_bm25_and_skips_unrelated_passages() -> None:
    passages = [
        Passage(id="a", title="Red", text="apples are red"),
        Passage(id="b", title="Green", text="pears are green and apples are green"),
        Passage(id="c", title="Blue", text="the sky"),
    ]
    retriever = BM25Retriever(passages)
    assert [p.id for p in retriever.search("red apples", 5)] == ["a", "b"]
    assert retriever.search("???", 5) == [] and retriever.search("zebra", 5) == []


# ----------------------------------------------------------------------------- rewards


@pytest.mark.parametrize(
    ("prediction", "answers", "em", "f1"),
    [
        ("The Eiffel Tower!", ["eiffel tower"], 1.0, 1.0),
        ("eiffel", ["Eiffel Tower"], 0.0, 2 / 3),
        ("Paris, France", ["London", "paris"], 0.0, 2 / 3),
        ("an apple", ["apple"], 1.0, 1.0),
        ("", ["x"], 0.0, 0.0),
    ],
)
def test_exact_match_and_f1(prediction: str, answers: list[str], em: float, f1: float) -> None:
    assert exact_match(prediction, answers) == em
    assert f1_score(prediction, answers) == pytest.approx(f1)


def test_normalize_answer() -> None:
    assert normalize_answer("  The  Quick, brown FOX. ") == "quick brown fox"


# ------------------------------------------------------------------------- protocol, oracle


def test_splits_are_seeded_disjoint_and_complete(env: SearchEnv) -> None:
    test, train = list(env.tasks("test")), list(env.tasks("train"))
    assert len(test) == 200 and test == sorted(test)
    assert sorted(test + train) == list(range(1200))
    with pytest.raises(EnvError, match="valid splits"):
        env.tasks("validation")


def test_oracle_answers_twenty_test_questions(env: SearchEnv) -> None:
    for task_id in env.tasks("test")[:20]:
        obs = env.reset(task_id)
        assert obs.text == f"Question: {env.questions[task_id].question}"
        question = env.questions[task_id]
        for hop, action in zip(question.hops, env.oracle_actions(task_id), strict=False):
            result = env.step(f"I should look this up. {action}")
            assert result.observation.startswith("<information>Doc 1 (Title: ")
            assert hop.entity in result.observation and not result.done
        result = env.step(env.oracle_actions(task_id)[-1])
        assert result.done and result.reward == 1.0 and result.info["success"] and result.info["f1"] == 1.0


def test_oracle_action_follows_the_turns(env: SearchEnv) -> None:
    task_id = env.tasks("test")[1]
    env.reset(task_id)
    replies = []
    while True:
        replies.append(env.oracle_action())
        result = env.step(replies[-1])
        if result.done:
            break
    assert replies == env.oracle_actions(task_id) and result.info["success"]
    with pytest.raises(EnvError, match="episode is over"):
        env.oracle_action()


def test_wrong_answer_ends_without_reward_and_f1_option(cache_dir: Path) -> None:
    env = SearchEnv(cache_dir=cache_dir, reward="f1")
    env.reset(0)
    answer = env.questions[0].answers[0]
    result = env.step(f"<answer>{answer} Extra</answer>")
    assert result.done and not result.info["success"] and result.info["em"] == 0.0
    assert result.reward == pytest.approx(2 / 3)


def test_turn_limit_ends_the_episode(cache_dir: Path) -> None:
    env = SearchEnv(cache_dir=cache_dir, max_turns=2)
    env.reset(0)
    assert not env.step("<search>mayor</search>").done
    result = env.step("no tags")
    assert result.done and result.reward == 0.0 and "no answer within 2 turns" in result.observation
    with pytest.raises(EnvError, match="episode is over; call reset"):
        env.step("<answer>x</answer>")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<search> capital  of\nX </search>", "search: capital of X"),
        ("<ANSWER>Y</ANSWER> <search>z</search>", "answer: Y"),
        ("think <search>a</search> then <answer>b</answer>", "search: a"),
    ],
)
def test_parse_action_takes_the_first_complete_tag(env: SearchEnv, text: str, expected: str) -> None:
    assert env.parse_action(text) == expected


def test_random_policy_never_raises(env: SearchEnv) -> None:
    rng = random.Random(5)
    garbage = [
        "",
        "search for it",
        "<search></search>",
        "<answer>   </answer>",
        "<search>" + "q " * 600_000 + "</search>",
    ]
    garbage += ["\udcff", "\x00\xff", "<search>\x00\xff</search>", "<search>\udcff</search>", "<answer>unclosed"]
    env.reset(env.tasks("test")[0])
    for _ in range(25):
        use_valid = rng.random() < 0.5
        text = (
            f"<search>{rng.choice(['mayor', 'capital of', 'Labs founder'])}</search>"
            if use_valid
            else rng.choice(garbage)
        )
        result = env.step(text)
        assert isinstance(result, StepResult) and result.observation
        if not result.info["action_valid"]:
            assert NO_ACTION_FOUND.split(".")[0] in result.observation or "characters" in result.observation
        if result.done:
            env.reset(env.tasks("test")[0])


@pytest.mark.parametrize(
    ("task_id", "message"),
    [(1200, "out of range; this question set has ids 0..1199"), (-1, "out of range"), (1.0, "integer")],
)
def test_bad_task_ids_raise(env: SearchEnv, task_id: object, message: str) -> None:
    with pytest.raises(EnvError, match=message):
        env.reset(task_id)


def test_step_before_reset_raises(cache_dir: Path) -> None:
    with pytest.raises(EnvError, match="call reset first"):
        SearchEnv(cache_dir=cache_dir).step("<search>x</search>")


@pytest.mark.parametrize(
    ("options", "named"),
    [({"top_k": 0}, "top_k"), ({"reward": "bleu"}, "reward"), ({"corpus": "c.jsonl"}, "both corpus and questions")],
)
def test_bad_options_raise(options: dict, named: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=named):
        SearchEnv(**options)


def test_registered_as_search(cache_dir: Path) -> None:
    assert isinstance(registry.make("search", {"cache_dir": str(cache_dir), "top_k": 5}), SearchEnv)
