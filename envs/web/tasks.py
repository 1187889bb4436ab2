"""The task catalogue of the web env: intents, WebArena-kind evaluators and oracle plans.

Tasks are generated from the seeded content (``envs.web.content``, seed ``CONTENT_SEED``) by a fixed list
of templates, in a fixed order, so task ``i`` is the same task everywhere. Every template names its
evaluator kind, as WebArena's configs do:

``exact_match``   the ``stop [answer]`` equals the reference (case, surrounding space, quotes and a final
                  period ignored).
``must_include``  every reference string occurs in the answer (same normalisation).
``url_match``     the active tab's URL (as the agent sees it) has the reference path and query.
``state``         a check of the site's data after the episode (cart, orders, comments, subscriptions...).

An oracle plan is a list of ``PlanStep``s that name elements by accessibility role and name; the env
turns each into an id-based action against the current page.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from agentgym_rl.envs.web.content import FORUM_USER, FORUMS, Content, generate, price_text
from agentgym_rl.envs.web.forum import ForumSite
from agentgym_rl.envs.web.shop import ShopSite

CONTENT_SEED = 0
SHOP_HOME = "http://shop.test/"
FORUM_HOME = "http://forum.test/"

EvaluatorKind = Literal["exact_match", "must_include", "url_match", "state"]


@dataclass(frozen=True)
class PlanStep:
    """One oracle move: act on the first element with ``role`` and ``name``, or stop with ``text``."""

    kind: Literal["click", "type", "stop"]
    role: str = ""
    name: str = ""
    text: str = ""
    enter: bool = False


@dataclass(frozen=True)
class Sites:
    """The live site states an evaluator may inspect."""

    shop: ShopSite
    forum: ForumSite


@dataclass(frozen=True)
class Task:
    """One task: where it starts, what it asks, how it is judged and how the oracle solves it."""

    id: int
    template: str
    intent: str
    start_url: str
    evaluator: EvaluatorKind
    reference: tuple[str, ...]
    plan: tuple[PlanStep, ...]
    check: Callable[[Sites], bool] | None = field(default=None, compare=False)

    def evaluate(self, answer: str, url: str, sites: Sites) -> bool:
        """Whether the episode that ended with ``answer`` on page ``url`` solved this task."""
        if self.evaluator == "exact_match":
            return _normalise(answer) == _normalise(self.reference[0])
        if self.evaluator == "must_include":
            return all(_normalise(ref) in _normalise(answer) for ref in self.reference)
        if self.evaluator == "url_match":
            got, want = urllib.parse.urlsplit(url), urllib.parse.urlsplit(self.reference[0])
            same_query = urllib.parse.parse_qs(got.query) == urllib.parse.parse_qs(want.query)
            return (got.netloc, got.path.rstrip("/"), same_query) == (want.netloc, want.path.rstrip("/"), True)
        assert self.check is not None, "state tasks carry a check"
        return self.check(sites)


def _normalise(text: str) -> str:
    return " ".join(text.strip().strip("\"'`").strip().rstrip(".").strip().lower().split())


def _search_and_open(name: str) -> list[PlanStep]:
    return [
        PlanStep("type", "searchbox", "Search products", text=name, enter=True),
        PlanStep("click", "link", name),
    ]


def build_tasks(content: Content) -> tuple[Task, ...]:
    """All tasks for ``content``, ids counting up in template order."""
    drafts: list[dict] = []
    products, shop = content.products, ShopSite(content)

    def add(**draft) -> None:
        drafts.append(draft)

    for p in products[::3]:
        add(template="shop/price", intent=f"What is the price of the {p.name}?", start_url=SHOP_HOME,
            evaluator="must_include", reference=(price_text(p.price_cents),),
            plan=(*_search_and_open(p.name), PlanStep("stop", text=price_text(p.price_cents))))  # fmt: skip
    for category in sorted({p.category for p in products}):
        cheapest = min((p for p in products if p.category == category), key=lambda p: p.price_cents)
        add(template="shop/cheapest", intent=f"Which product in the {category} category is the cheapest? "
            "Answer with its name.", start_url=SHOP_HOME, evaluator="exact_match", reference=(cheapest.name,),
            plan=(PlanStep("click", "link", category), PlanStep("click", "link", "Price: low to high"),
                  PlanStep("stop", text=cheapest.name)))  # fmt: skip
    for p in products[1::4]:
        add(template="shop/add_to_cart", intent=f"Add the {p.name} to my shopping cart.", start_url=SHOP_HOME,
            evaluator="state", reference=(f"cart[{p.id}] >= 1",),
            check=lambda s, pid=p.id: s.shop.cart.get(pid, 0) >= 1,
            plan=(*_search_and_open(p.name), PlanStep("click", "button", "Add to Cart"), PlanStep("stop")))  # fmt: skip
    for k, p in enumerate(products[2::6]):
        qty = 2 + k % 4
        add(template="shop/quantity", intent=f"Put exactly {qty} units of the {p.name} in my shopping cart.",
            start_url=SHOP_HOME, evaluator="state", reference=(f"cart[{p.id}] == {qty}",),
            check=lambda s, pid=p.id, q=qty: s.shop.cart.get(pid, 0) == q,
            plan=(*_search_and_open(p.name), PlanStep("type", "spinbutton", "Quantity", text=str(qty)),
                  PlanStep("click", "button", "Add to Cart"), PlanStep("stop")))  # fmt: skip
    seeded_last = max(o.number for o in content.orders)
    for p in products[3::8]:
        add(template="shop/buy", intent=f"Buy one {p.name}: add it to the cart and place the order.",
            start_url=SHOP_HOME, evaluator="state", reference=(f"new order with product {p.id}",),
            check=lambda s, pid=p.id: any(o.number > seeded_last and pid in dict(o.items) for o in s.shop.orders),
            plan=(*_search_and_open(p.name), PlanStep("click", "button", "Add to Cart"),
                  PlanStep("click", "button", "Place Order"), PlanStep("stop")))  # fmt: skip
    for order in content.orders:
        total = price_text(shop.order_total(order))
        add(template="shop/order_total", intent=f"What was the total of my order #{order.number}?",
            start_url=SHOP_HOME, evaluator="must_include", reference=(total,),
            plan=(PlanStep("click", "link", "My Orders"), PlanStep("click", "link", f"Order #{order.number}"),
                  PlanStep("stop", text=total)))  # fmt: skip
    for p in products[4::8]:
        add(template="shop/open_product", intent=f"Open the product page of the {p.name}.", start_url=SHOP_HOME,
            evaluator="url_match", reference=(f"{SHOP_HOME}product/{p.id}",),
            plan=(*_search_and_open(p.name), PlanStep("stop")))  # fmt: skip

    posts, forum = content.posts, ForumSite(content)

    def open_post(post) -> list[PlanStep]:
        return [PlanStep("click", "link", FORUMS[post.forum][0]), PlanStep("click", "link", post.title)]

    for post in posts[::2]:
        add(template="forum/author", intent=f"Who submitted the post '{post.title}' in the {FORUMS[post.forum][0]} "
            "forum? Answer with the username.", start_url=FORUM_HOME, evaluator="exact_match",
            reference=(post.author,), plan=(*open_post(post), PlanStep("stop", text=post.author)))  # fmt: skip
    for post in posts[1::3]:
        count = str(len(forum.comments_of(post.id)))
        add(template="forum/comment_count", intent=f"How many comments does the post '{post.title}' have? "
            "Answer with a number.", start_url=FORUM_HOME, evaluator="exact_match", reference=(count,),
            plan=(*open_post(post), PlanStep("stop", text=count)))  # fmt: skip
    for k, post in enumerate(posts[2::4]):
        text = f"Thanks for sharing, this is reply number {k + 1}."
        add(template="forum/comment", intent=f"Reply to the post '{post.title}' with the comment '{text}'.",
            start_url=FORUM_HOME, evaluator="state", reference=(f"comment on post {post.id}: {text}",),
            check=lambda s, pid=post.id, t=text: any(
                c.post_id == pid and c.author == FORUM_USER and c.body == t for c in s.forum.comments),
            plan=(*open_post(post), PlanStep("type", "textbox", "Comment", text=text),
                  PlanStep("click", "button", "Post Comment"), PlanStep("stop")))  # fmt: skip
    for slug, (name, _) in FORUMS.items():
        subscribed = slug in content.subscriptions
        verb, button = ("Unsubscribe from", "Unsubscribe") if subscribed else ("Subscribe to", "Subscribe")
        add(template="forum/subscription", intent=f"{verb} the {name} forum.", start_url=FORUM_HOME,
            evaluator="state", reference=(f"subscribed to {slug}: {not subscribed}",),
            check=lambda s, slug=slug, want=not subscribed: (slug in s.forum.subscriptions) == want,
            plan=(PlanStep("click", "link", name), PlanStep("click", "button", button), PlanStep("stop")))  # fmt: skip
    for slug, (name, _) in FORUMS.items():
        title = f"Weekly {name.lower()} meetup thread"
        add(template="forum/create_post", intent=f"Create a post in the {name} forum titled '{title}'.",
            start_url=FORUM_HOME, evaluator="state", reference=(f"post in {slug} titled {title}",),
            check=lambda s, slug=slug, t=title: any(
                p.forum == slug and p.title == t and p.author == FORUM_USER for p in s.forum.posts.values()),
            plan=(PlanStep("click", "link", name), PlanStep("click", "link", "Submit a new post"),
                  PlanStep("type", "textbox", "Title", text=title), PlanStep("click", "button", "Create Post"),
                  PlanStep("stop")))  # fmt: skip
    for post in posts[3::5]:
        add(template="forum/upvote", intent=f"Upvote the post '{post.title}'.", start_url=FORUM_HOME,
            evaluator="state", reference=(f"post {post.id} upvoted",),
            check=lambda s, pid=post.id: pid in s.forum.upvoted,
            plan=(*open_post(post), PlanStep("click", "button", "Upvote"), PlanStep("stop")))  # fmt: skip
    for post in posts[::5]:
        add(template="forum/author_profile", intent=f"Open the profile page of the user who submitted the post "
            f"'{post.title}'.", start_url=FORUM_HOME, evaluator="url_match",
            reference=(f"{FORUM_HOME}user/{urllib.parse.quote(post.author)}",),
            plan=(*open_post(post), PlanStep("click", "link", post.author), PlanStep("stop")))  # fmt: skip
    return tuple(Task(id=i, **draft) for i, draft in enumerate(drafts))


CONTENT = generate(CONTENT_SEED)
TASKS: tuple[Task, ...] = build_tasks(CONTENT)
# Every fifth task is held out for testing: both sites and every template land in both splits.
SPLITS: dict[str, tuple[int, ...]] = {
    "test": tuple(t.id for t in TASKS if t.id % 5 == 0),
    "train": tuple(t.id for t in TASKS if t.id % 5 != 0),
}
