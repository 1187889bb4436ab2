"""The bundled discussion forum ("Postmill"-like): forums, posts, comments, votes and subscriptions.

Routes: ``/`` (forum list), ``/f/<forum>``, ``POST /f/<forum>/subscribe`` (toggles),
``/f/<forum>/submit`` and ``POST`` to it (``title``, ``body``), ``/post/<id>``, ``POST /post/<id>/vote``,
``POST /post/<id>/comment`` (``body``), ``/user/<name>``, ``/subscriptions``. The agent is logged in as
``FORUM_USER``; ``reset`` restores the seeded posts, comments, scores and subscriptions.
"""

from __future__ import annotations

from dataclasses import replace

from agentgym_rl.envs.web.content import FORUM_USER, FORUMS, USERS, Comment, Content, Post
from agentgym_rl.envs.web.server import Request, Response, esc, not_found, page

TITLE = "Forum"


class ForumSite:
    """State and pages of the forum."""

    name = TITLE

    def __init__(self, content: Content) -> None:
        self.content = content
        self.posts: dict[int, Post] = {}
        self.comments: list[Comment] = []
        self.subscriptions: set[str] = set()
        self.upvoted: set[int] = set()
        self.reset()

    def reset(self) -> None:
        """Back to the seeded posts, comments, scores and subscriptions."""
        self.posts = {p.id: p for p in self.content.posts}
        self.comments = list(self.content.comments)
        self.subscriptions = set(self.content.subscriptions)
        self.upvoted = set()

    def comments_of(self, post_id: int) -> list[Comment]:
        """Comments under post ``post_id``, oldest first."""
        return [c for c in self.comments if c.post_id == post_id]

    # ------------------------------------------------------------------------------------ routes

    def handle(self, request: Request) -> Response:
        """Route one request."""
        parts = [part for part in request.path.split("/") if part]
        if request.method == "POST":
            return self._post(parts, request)
        if not parts:
            return self._home()
        if len(parts) == 2 and parts[0] == "f" and parts[1] in FORUMS:
            return self._forum(parts[1])
        if len(parts) == 3 and parts[0] == "f" and parts[1] in FORUMS and parts[2] == "submit":
            return self._submit_form(parts[1])
        if len(parts) == 2 and parts[0] == "post" and parts[1].isdigit() and int(parts[1]) in self.posts:
            return self._post_page(self.posts[int(parts[1])])
        if len(parts) == 2 and parts[0] == "user" and parts[1] in USERS:
            return self._user(parts[1])
        if parts == ["subscriptions"]:
            return self._subscriptions()
        return not_found(TITLE, self._nav(), request.path)

    def _post(self, parts: list[str], request: Request) -> Response:
        if len(parts) == 3 and parts[0] == "f" and parts[1] in FORUMS:
            slug = parts[1]
            if parts[2] == "subscribe":
                self.subscriptions ^= {slug}
                return Response(location=f"/f/{slug}")
            if parts[2] == "submit":
                title, body = request.form.get("title", "").strip(), request.form.get("body", "").strip()
                if not title:
                    return self._render("Submit", "<h1>Cannot submit</h1><p>A post needs a title.</p>")
                pid = max(self.posts) + 1
                self.posts[pid] = Post(pid, slug, title, FORUM_USER, body, 1, "2024-07-01")
                return Response(location=f"/post/{pid}")
        if len(parts) == 3 and parts[0] == "post" and parts[1].isdigit() and int(parts[1]) in self.posts:
            pid = int(parts[1])
            if parts[2] == "vote" and pid not in self.upvoted:
                self.upvoted.add(pid)
                self.posts[pid] = replace(self.posts[pid], score=self.posts[pid].score + 1)
                return Response(location=f"/post/{pid}")
            if parts[2] == "vote":
                return Response(location=f"/post/{pid}")
            if parts[2] == "comment" and request.form.get("body", "").strip():
                cid = max((c.id for c in self.comments), default=0) + 1
                self.comments.append(Comment(cid, pid, FORUM_USER, request.form["body"].strip()))
                return Response(location=f"/post/{pid}")
        return not_found(TITLE, self._nav(), request.path)

    # ------------------------------------------------------------------------------------- pages

    def _nav(self) -> list[tuple[str, str]]:
        return [("/", "Forums"), ("/subscriptions", "Subscriptions"), (f"/user/{FORUM_USER}", FORUM_USER)]

    def _render(self, title: str, body: str) -> Response:
        return Response(body=page(TITLE, title, self._nav(), body))

    def _home(self) -> Response:
        items = "".join(
            f'<li><a href="/f/{slug}">{esc(name)}</a> {esc(description)}</li>'
            for slug, (name, description) in FORUMS.items()
        )
        return self._render("Forums", f"<h1>All forums</h1><ul>{items}</ul>")

    def _listing(self, posts: list[Post]) -> str:
        return "".join(
            f'<div class="card"><a href="/post/{p.id}">{esc(p.title)}</a> '
            f"<span>submitted by {esc(p.author)}, {len(self.comments_of(p.id))} comments, score {p.score}</span></div>"
            for p in posts
        )

    def _forum(self, slug: str) -> Response:
        name, description = FORUMS[slug]
        label = "Unsubscribe" if slug in self.subscriptions else "Subscribe"
        posts = [p for p in self.posts.values() if p.forum == slug]
        body = (
            f"<h1>{esc(name)}</h1><p>{esc(description)}</p>"
            f"<form action='/f/{slug}/subscribe' method='post'><button type='submit'>{label}</button></form>"
            f"<p><a href='/f/{slug}/submit'>Submit a new post</a></p>{self._listing(posts)}"
        )
        return self._render(name, body)

    def _submit_form(self, slug: str) -> Response:
        body = (
            f"<h1>Submit to {esc(FORUMS[slug][0])}</h1><form action='/f/{slug}/submit' method='post'>"
            "<p><label>Title <input type='text' name='title'></label></p>"
            "<p><label>Body <textarea name='body'></textarea></label></p>"
            "<button type='submit'>Create Post</button></form>"
        )
        return self._render("Submit", body)

    def _post_page(self, post: Post) -> Response:
        comments = "".join(
            f"<div class='card'><a href='/user/{esc(c.author)}'>{esc(c.author)}</a><p>{esc(c.body)}</p></div>"
            for c in self.comments_of(post.id)
        )
        body = (
            f"<h1>{esc(post.title)}</h1><p>Submitted on {post.date} by "
            f"<a href='/user/{esc(post.author)}'>{esc(post.author)}</a> in "
            f"<a href='/f/{post.forum}'>{esc(FORUMS[post.forum][0])}</a></p><p>{esc(post.body)}</p>"
            f"<p>Score: {post.score}</p><form action='/post/{post.id}/vote' method='post'>"
            "<button type='submit'>Upvote</button></form>"
            f"<h2>{len(self.comments_of(post.id))} comments</h2>{comments}"
            f"<form action='/post/{post.id}/comment' method='post'>"
            "<label>Comment <textarea name='body'></textarea></label> "
            "<button type='submit'>Post Comment</button></form>"
        )
        return self._render(post.title, body)

    def _user(self, name: str) -> Response:
        posts = [p for p in self.posts.values() if p.author == name]
        count = sum(1 for c in self.comments if c.author == name)
        body = f"<h1>{esc(name)}</h1><p>{len(posts)} posts, {count} comments</p>{self._listing(posts)}"
        return self._render(name, body)

    def _subscriptions(self) -> Response:
        items = "".join(f"<li><a href='/f/{s}'>{esc(FORUMS[s][0])}</a></li>" for s in sorted(self.subscriptions))
        return self._render("Subscriptions", f"<h1>Your subscriptions</h1><ul>{items}</ul>")
