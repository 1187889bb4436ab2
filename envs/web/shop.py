"""The bundled online shop ("One Stop Shop"): search, categories, product pages, cart and orders.

Routes: ``/`` (search box and categories), ``/search?q=``, ``/category/<slug>?sort=price|name``,
``/product/<id>``, ``POST /cart/add`` (``product_id``, ``qty``), ``/cart``, ``POST /cart/remove``,
``POST /checkout``, ``/orders``, ``/orders/<number>``. One customer is logged in; ``reset`` restores
the seeded cart (empty) and order history.
"""

from __future__ import annotations

from agentgym_rl.envs.web.content import SHOP_CUSTOMER, Content, Order, Product, category_slug, price_text
from agentgym_rl.envs.web.server import Request, Response, esc, not_found, page

TITLE = "One Stop Shop"


class ShopSite:
    """State and pages of the shop; ``cart`` maps product id -> quantity."""

    name = TITLE

    def __init__(self, content: Content) -> None:
        self.content = content
        self.products = {p.id: p for p in content.products}
        self.categories = {category_slug(p.category): p.category for p in content.products}
        self.cart: dict[int, int] = {}
        self.orders: list[Order] = []
        self.reset()

    def reset(self) -> None:
        """Back to the seeded state: empty cart, the seeded order history."""
        self.cart = {}
        self.orders = list(self.content.orders)

    def order_total(self, order: Order) -> int:
        """Total of ``order`` in cents."""
        return sum(self.products[pid].price_cents * qty for pid, qty in order.items)

    def search(self, query: str) -> list[Product]:
        """Products whose name holds every word of ``query`` (any case), in catalogue order."""
        words = query.lower().split()
        return [p for p in self.content.products if words and all(w in p.name.lower() for w in words)]

    # ------------------------------------------------------------------------------------ routes

    def handle(self, request: Request) -> Response:
        """Route one request."""
        parts = [part for part in request.path.split("/") if part]
        if request.method == "POST":
            return self._post(parts, request)
        if not parts:
            return self._home()
        if parts == ["search"]:
            return self._search(request.query.get("q", ""))
        if len(parts) == 2 and parts[0] == "category" and parts[1] in self.categories:
            return self._category(parts[1], request.query.get("sort", "name"))
        if len(parts) == 2 and parts[0] == "product" and parts[1].isdigit() and int(parts[1]) in self.products:
            return self._product(self.products[int(parts[1])])
        if parts == ["cart"]:
            return self._cart()
        if parts == ["orders"]:
            return self._orders()
        if len(parts) == 2 and parts[0] == "orders" and parts[1].isdigit():
            order = next((o for o in self.orders if o.number == int(parts[1])), None)
            if order is not None:
                return self._order(order)
        return not_found(TITLE, self._nav(), request.path)

    def _post(self, parts: list[str], request: Request) -> Response:
        if parts == ["cart", "add"]:
            pid, qty = _int(request.form.get("product_id")), _int(request.form.get("qty"))
            if pid not in self.products or qty is None or not 1 <= qty <= 99:
                return self._render("Cannot add to cart", "<h1>Cannot add to cart</h1><p>Quantity must be 1 to 99.</p>")
            self.cart[pid] = min(self.cart.get(pid, 0) + qty, 99)
            return Response(location="/cart")
        if parts == ["cart", "remove"]:
            self.cart.pop(_int(request.form.get("product_id")) or 0, None)
            return Response(location="/cart")
        if parts == ["checkout"] and self.cart:
            number = max(o.number for o in self.orders) + 1
            self.orders.append(
                Order(number=number, date="2024-07-01", items=tuple(sorted(self.cart.items())), status="Pending")
            )
            self.cart = {}
            return Response(location=f"/orders/{number}")
        return not_found(TITLE, self._nav(), request.path)

    # ------------------------------------------------------------------------------------- pages

    def _nav(self) -> list[tuple[str, str]]:
        return [("/", "Home"), ("/cart", f"Cart ({sum(self.cart.values())})"), ("/orders", "My Orders")]

    def _render(self, title: str, body: str, status: int = 200) -> Response:
        return Response(status=status, body=page(TITLE, title, self._nav(), body))

    def _home(self) -> Response:
        categories = "".join(
            f'<li><a href="/category/{slug}">{esc(name)}</a></li>' for slug, name in sorted(self.categories.items())
        )
        body = (
            f"<h1>Welcome, {esc(SHOP_CUSTOMER)}</h1>"
            '<form action="/search" method="get" role="search">'
            '<input type="search" name="q" aria-label="Search products" placeholder="Search products">'
            "<button type='submit'>Search</button></form>"
            f"<h2>Shop by category</h2><ul>{categories}</ul>"
        )
        return self._render("Home", body)

    def _listing(self, products: list[Product]) -> str:
        return "".join(
            f'<div class="card"><a href="/product/{p.id}">{esc(p.name)}</a> '
            f'<span class="price">{price_text(p.price_cents)}</span></div>'
            for p in products
        )

    def _search(self, query: str) -> Response:
        found = self.search(query)
        body = f"<h1>Search results for '{esc(query)}'</h1><p>{len(found)} products found</p>{self._listing(found)}"
        return self._render(f"Search: {query}", body)

    def _category(self, slug: str, sort: str) -> Response:
        name = self.categories[slug]
        items = [p for p in self.content.products if p.category == name]
        items.sort(key=(lambda p: p.price_cents) if sort == "price" else (lambda p: p.name))
        body = (
            f"<h1>{esc(name)}</h1><p>Sort by: <a href='/category/{slug}?sort=price'>Price: low to high</a> "
            f"<a href='/category/{slug}?sort=name'>Name</a></p>{self._listing(items)}"
        )
        return self._render(name, body)

    def _product(self, p: Product) -> Response:
        body = (
            f"<h1>{esc(p.name)}</h1><p class='price'>{price_text(p.price_cents)}</p>"
            f"<p>SKU: {esc(p.sku)}</p><p>Rating: {p.rating} out of 5</p><p>{esc(p.description)}</p>"
            f"<p>Category: <a href='/category/{category_slug(p.category)}'>{esc(p.category)}</a></p>"
            "<form action='/cart/add' method='post'>"
            f"<input type='hidden' name='product_id' value='{p.id}'>"
            "<label>Quantity <input type='number' name='qty' value='1' min='1' max='99'></label> "
            "<button type='submit'>Add to Cart</button></form>"
        )
        return self._render(p.name, body)

    def _cart(self) -> Response:
        if not self.cart:
            return self._render("Shopping Cart", "<h1>Shopping Cart</h1><p>Your cart is empty.</p>")
        rows = "".join(
            f"<tr><td>{esc(self.products[pid].name)}</td><td>{qty}</td>"
            f"<td>{price_text(self.products[pid].price_cents * qty)}</td><td>"
            f"<form action='/cart/remove' method='post'><input type='hidden' name='product_id' value='{pid}'>"
            f"<button type='submit' aria-label='Remove {esc(self.products[pid].name)}'>Remove</button></form></td></tr>"
            for pid, qty in sorted(self.cart.items())
        )
        total = sum(self.products[pid].price_cents * qty for pid, qty in self.cart.items())
        body = (
            "<h1>Shopping Cart</h1><table><tr><th>Product</th><th>Quantity</th><th>Subtotal</th><th></th></tr>"
            f"{rows}</table><p>Total: {price_text(total)}</p>"
            "<form action='/checkout' method='post'><button type='submit'>Place Order</button></form>"
        )
        return self._render("Shopping Cart", body)

    def _orders(self) -> Response:
        rows = "".join(
            f"<tr><td><a href='/orders/{o.number}'>Order #{o.number}</a></td><td>{o.date}</td>"
            f"<td>{price_text(self.order_total(o))}</td><td>{o.status}</td></tr>"
            for o in reversed(self.orders)
        )
        body = (
            f"<h1>My Orders</h1><table><tr><th>Order</th><th>Date</th><th>Total</th><th>Status</th></tr>{rows}</table>"
        )
        return self._render("My Orders", body)

    def _order(self, order: Order) -> Response:
        rows = "".join(
            f"<li>{esc(self.products[pid].name)} x {qty}: {price_text(self.products[pid].price_cents * qty)}</li>"
            for pid, qty in order.items
        )
        body = (
            f"<h1>Order #{order.number}</h1><p>Placed on {order.date}. Status: {order.status}</p>"
            f"<ul>{rows}</ul><p>Order total: {price_text(self.order_total(order))}</p>"
        )
        return self._render(f"Order #{order.number}", body)


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
