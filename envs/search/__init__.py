"""Deep Search: question answering over a local BM25-indexed corpus (synthetic by default)."""

from agentgym_rl.envs.search.corpus import BM25Retriever, Hop, Passage, Question, load_corpus, load_questions
from agentgym_rl.envs.search.env import SearchEnv, exact_match, f1_score, normalize_answer
from agentgym_rl.envs.search.generate import ensure_generated, generate

__all__ = [
    "BM25Retriever",
    "Hop",
    "Passage",
    "Question",
    "SearchEnv",
    "ensure_generated",
    "exact_match",
    "f1_score",
    "generate",
    "load_corpus",
    "load_questions",
    "normalize_answer",
]
