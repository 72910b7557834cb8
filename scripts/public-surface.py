#!/usr/bin/env python3
"""Lists types that ottla's documented API names but that a user can reach only through
the hidden `proto` and `driver` modules (see README, "Stability").

Reads rustdoc's JSON output (nightly, hidden items included: `cargo +nightly rustdoc -p ottla --lib
--features tls,tls-webpki-roots -- -Z unstable-options --document-hidden-items
--output-format json`), walks every item
reachable from the crate root without entering a `#[doc(hidden)]` module, and reports each
item of this crate that a visible signature, field or variant refers to but that is not
itself reachable. Exit status 1 when there is any."""
import json
import sys

doc = json.load(open(sys.argv[1] if len(sys.argv) > 1 else "target/doc/ottla.json"))
index, paths = doc["index"], doc["paths"]
visible = set()


def is_hidden(item):
    """A `#[doc(hidden)]` item: not entered, and not visible, unless re-exported."""
    return any("doc(hidden)" in str(a).replace(" ", "") for a in item.get("attrs", []))


def visit(item_id):
    item_id = str(item_id)
    if item_id in visible or item_id not in index:
        return
    item = index[item_id]
    if item.get("crate_id", 0) != 0 or is_hidden(item):
        return
    visible.add(item_id)
    inner = item["inner"]
    kind, body = next(iter(inner.items())) if isinstance(inner, dict) else (inner, None)
    children = []
    if kind == "module":
        children = body["items"]
    elif kind == "use" and body.get("id") is not None:
        # A re-export makes its target visible even when the target's module is hidden.
        target = index.get(str(body["id"]))
        if target is not None and str(body["id"]) not in visible:
            visible.add(str(body["id"]))
            saved = target.get("attrs")
            target["attrs"] = []
            visible.discard(str(body["id"]))
            visit(body["id"])
            target["attrs"] = saved
        return
    elif kind in ("struct", "union"):
        children = list(body.get("impls", []))
        k = body.get("kind")
        if isinstance(k, dict):
            fields = k.get("plain", {}).get("fields", []) if "plain" in k else k.get("tuple", [])
            children += [f for f in fields if f is not None]
    elif kind == "enum":
        children = body["variants"] + body.get("impls", [])
    elif kind == "variant":
        k = body["kind"]
        if isinstance(k, dict):
            fields = k["struct"]["fields"] if "struct" in k else k.get("tuple", [])
            children = [f for f in fields if f is not None]
    elif kind == "impl":
        children = body["items"]
    elif kind == "trait":
        children = body["items"] + body.get("implementations", [])
    for c in children:
        visit(c)


visit(doc["root"])
leaks = {}


def refs(value, where):
    if isinstance(value, dict):
        ref = value.get("id")
        if isinstance(value.get("path"), str) and ref is not None:
            ref = str(ref)
            known = paths.get(ref)
            if known is None and ref not in visible:
                # rustdoc strips hidden items from `paths` too: a referenced id it does
                # not know is an item of this crate that only a hidden module holds.
                leaks.setdefault(value["path"], set()).add(where)
            elif known and known["crate_id"] == 0 and ref not in visible:
                leaks.setdefault("::".join(known["path"]), set()).add(where)
        for k, v in value.items():
            if k not in ("docs", "links", "span", "attrs"):
                refs(v, where)
    elif isinstance(value, list):
        for v in value:
            refs(v, where)


for item_id in visible:
    item = index[item_id]
    kind = next(iter(item["inner"])) if isinstance(item["inner"], dict) else item["inner"]
    if kind in ("module", "use"):
        continue
    if kind == "impl" and item["inner"]["impl"].get("trait") is not None:
        # A trait impl adds no names of its own beyond the trait's.
        continue
    refs(item["inner"], item.get("name") or "impl")

for name in sorted(leaks):
    print(f"{name} (named by {', '.join(sorted(leaks[name]))})")
if leaks:
    print(f"{len(leaks)} types reachable only through hidden modules", file=sys.stderr)
    sys.exit(1)
print("ok: every type the documented API names is documented")
