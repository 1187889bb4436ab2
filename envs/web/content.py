"""Seeded content of the two bundled sites: a shop catalogue with past orders, and a forum.

Everything is generated from one integer seed with ``random.Random``, so the same seed gives the same
products, prices, posts and comments on every machine and in every process (the task catalogue in
``envs.web.tasks`` is derived from it). The content itself is immutable; the sites copy what they mutate.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

CATEGORIES: dict[str, tuple[str, ...]] = {
    "Home & Kitchen": ("Kettle", "Teapot", "Cutting Board", "Desk Lamp", "Coffee Grinder", "Toaster", "Blender"),
    "Electronics": ("Headphones", "Bluetooth Speaker", "USB Hub", "Webcam", "Power Bank", "Keyboard", "Monitor Stand"),
    "Sports & Outdoors": ("Yoga Mat", "Water Bottle", "Tent", "Hiking Backpack", "Jump Rope", "Camping Stove"),
    "Books": ("Cookbook", "Atlas", "Field Guide", "Poetry Collection", "Travel Journal", "Puzzle Book"),
    "Office Supplies": ("Notebook", "Fountain Pen", "Stapler", "Desk Organizer", "Sticky Notes", "Label Maker"),
    "Garden": ("Watering Can", "Pruning Shears", "Plant Pot", "Garden Hose", "Bird Feeder", "Seed Starter Kit"),
}
_ADJECTIVES = (
    "Aurora", "Basalt", "Cedar", "Drift", "Ember", "Fjord", "Granite", "Harbor", "Indigo", "Juniper",
    "Kestrel", "Lumen", "Meadow", "Nimbus", "Onyx", "Pebble", "Quartz", "Ridge", "Sierra", "Tundra",
)  # fmt: skip
_MATERIALS = ("Steel", "Bamboo", "Ceramic", "Recycled", "Compact", "Classic", "Pro", "Travel")

FORUMS: dict[str, tuple[str, str]] = {
    "gardening": ("Gardening", "Growing vegetables, flowers and houseplants."),
    "cycling": ("Cycling", "Bikes, routes, repairs and commuting."),
    "cooking": ("Cooking", "Recipes, techniques and kitchen tools."),
    "photography": ("Photography", "Cameras, lenses, editing and critique."),
    "boardgames": ("Board Games", "Reviews, rules questions and game nights."),
}
_TOPICS: dict[str, tuple[str, ...]] = {
    "gardening": ("tomato blight", "raised beds", "composting", "pruning roses", "winter mulch", "seed saving"),
    "cycling": ("tubeless tyres", "chain wear", "winter commuting", "saddle height", "gravel routes", "bike locks"),
    "cooking": ("sourdough starter", "cast iron care", "knife sharpening", "stock recipes", "meal prep", "spices"),
    "photography": ("prime lenses", "night sky shots", "film scanning", "tripod choice", "colour grading", "macro"),
    "boardgames": ("two-player games", "card sleeves", "teaching rules", "solo variants", "game storage", "co-ops"),
}
_TITLE_FORMS = (
    "Advice needed on {topic}",
    "My experience with {topic}",
    "Beginner question about {topic}",
    "What I learned about {topic} this year",
    "Is {topic} worth the effort?",
    "Show and tell: {topic}",
)
USERS = (
    "alex_rivera", "birchwood", "cobalt_fox", "dune_walker", "elm_street", "fern_gully", "gale_force",
    "hollow_oak", "iris_bloom", "jade_river", "kite_runner", "lark_song",
)  # fmt: skip
# The forum account the agent is logged in as, and the shop customer.
FORUM_USER = "alex_rivera"
SHOP_CUSTOMER = "Alex Rivera"
_COMMENT_FORMS = (
    "Thanks, this helped a lot.",
    "I had the same problem last spring.",
    "Have you tried asking at a local club?",
    "Great write-up, saving this for later.",
    "I disagree, but it depends on your budget.",
    "Could you share a photo of the result?",
    "This is the best advice in the thread.",
)


@dataclass(frozen=True)
class Product:
    """One catalogue item; ``price_cents`` avoids float rounding in answers."""

    id: int
    sku: str
    name: str
    category: str
    price_cents: int
    rating: float
    description: str


@dataclass(frozen=True)
class Order:
    """A placed order: ``items`` are (product id, quantity) pairs."""

    number: int
    date: str
    items: tuple[tuple[int, int], ...]
    status: str


@dataclass(frozen=True)
class Post:
    """A forum submission."""

    id: int
    forum: str
    title: str
    author: str
    body: str
    score: int
    date: str


@dataclass(frozen=True)
class Comment:
    """A comment under a post."""

    id: int
    post_id: int
    author: str
    body: str


@dataclass(frozen=True)
class Content:
    """All seeded content of both sites."""

    products: tuple[Product, ...]
    orders: tuple[Order, ...]
    posts: tuple[Post, ...]
    comments: tuple[Comment, ...]
    subscriptions: tuple[str, ...]


def price_text(cents: int) -> str:
    """``1234`` -> ``"$12.34"``, the way every page prints prices."""
    return f"${cents // 100}.{cents % 100:02d}"


def category_slug(category: str) -> str:
    """URL slug of a category name: ``"Home & Kitchen"`` -> ``"home-kitchen"``."""
    return "-".join(part for part in "".join(c if c.isalnum() else " " for c in category.lower()).split())


def generate(seed: int) -> Content:
    """The deterministic content of both sites for ``seed``."""
    rng = random.Random(seed)
    products: list[Product] = []
    for category, nouns in CATEGORIES.items():
        # Distinct prices within a category, so "the cheapest" always has one answer.
        prices = rng.sample(range(599, 19999, 37), len(nouns))
        for noun, price in zip(nouns, prices, strict=True):
            name = f"{rng.choice(_ADJECTIVES)} {rng.choice(_MATERIALS)} {noun}"
            pid = len(products) + 1
            products.append(
                Product(
                    id=pid,
                    sku=f"SKU-{1000 + pid * 7}",
                    name=name,
                    category=category,
                    price_cents=price,
                    rating=round(rng.uniform(2.5, 5.0), 1),
                    description=f"A {name.lower()} for everyday use, from our {category.lower()} range.",
                )
            )
    orders = []
    for k in range(6):
        items = tuple(sorted((p.id, rng.randint(1, 3)) for p in rng.sample(products, rng.randint(1, 3))))
        orders.append(
            Order(number=1001 + k, date=f"2024-0{k + 1}-1{k}", items=items, status=("Complete", "Shipped")[k % 2])
        )
    posts: list[Post] = []
    for slug, topics in _TOPICS.items():
        for topic, form in zip(topics, rng.sample(_TITLE_FORMS, len(topics)), strict=True):
            pid = len(posts) + 1
            author = rng.choice(USERS[1:])
            posts.append(
                Post(
                    id=pid,
                    forum=slug,
                    title=_capitalised(form.format(topic=topic)),
                    author=author,
                    body=f"I have been thinking about {topic} for a while and would like to hear from others.",
                    score=rng.randint(0, 60),
                    date=f"2024-{1 + pid % 12:02d}-{1 + pid % 27:02d}",
                )
            )
    comments = []
    for post in posts:
        for _ in range(rng.randint(0, 5)):
            author = rng.choice(USERS[1:])
            comments.append(
                Comment(id=len(comments) + 1, post_id=post.id, author=author, body=rng.choice(_COMMENT_FORMS))
            )
    return Content(
        products=tuple(products),
        orders=tuple(orders),
        posts=tuple(posts),
        comments=tuple(comments),
        subscriptions=("cooking",),
    )


def _capitalised(text: str) -> str:
    return text[:1].upper() + text[1:]
