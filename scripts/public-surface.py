#!/usr/bin/env python3
"""Lists types that ottla's documented API names but that a user cannot reach through
ottla's documented paths: items only the hidden `driver` module holds, and items of the
sans-IO core (the crate `ottla-proto`, which ottla uses privately) that ottla does not
re-export (see README, "Stability").

Reads rustdoc's JSON output for ottla and for ottla-proto (nightly, hidden items
included: `cargo +nightly rustdoc -p ottla --lib --features tls,tls-webpki-roots -- -Z
unstable-options --document-hidden-items --output-format json`, and the same with `-p
ottla-proto`). Walks every item reachable from ottla's crate root without entering a
`#[doc(hidden)]` module, then, in the core's JSON, every core item that ottla
re-exports (its fields, variants and methods), and reports each item of either crate
that a visible signature, field or variant refers to but that is not itself reachable
(for the core's: not re-exported by ottla). Exit status 1 when there is any.

Usage: public-surface.py [OTTLA_JSON [CORE_JSON]]; by default target/doc/ottla.json and
the ottla_proto.json beside it."""
import json
import os
import sys

CORE = "ottla_proto"
ottla_json = sys.argv[1] if len(sys.argv) > 1 else "target/doc/ottla.json"
core_json = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(ottla_json), f"{CORE}.json")
doc = json.load(open(ottla_json))
core = json.load(open(core_json))
index, paths = doc["index"], doc["paths"]
# rustdoc numbers external crates per document: the core's number in ottla's.
core_crates = {int(k) for k, v in doc["external_crates"].items() if v["name"] == CORE}
visible = set()
# The core's items (by path) and modules (by path prefix) that a visible `pub use` of
# ottla re-exports. rustdoc does not copy them into ottla's JSON: they are walked in the
# core's.
reexported, reexported_modules = set(), set()


def is_hidden(item):
    """A `#[doc(hidden)]` item: not entered, and not visible, unless re-exported."""
    return any("doc(hidden)" in str(a).replace(" ", "") for a in item.get("attrs", []))


def is_reexported(path):
    path = tuple(path)
    return path in reexported or any(path[: len(m)] == m for m in reexported_modules)


def children_of(kind, body):
    """The items a visible item makes visible (a module's, a re-export's are apart)."""
    children = []
    if kind == "module":
        children = body["items"]
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
    return children


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
    if kind == "use" and body.get("id") is not None:
        known = paths.get(str(body["id"]))
        if str(body["id"]) not in index and known is not None and known["crate_id"] in core_crates:
            if body.get("is_glob") or known["kind"] == "module":
                reexported_modules.add(tuple(known["path"]))
            else:
                reexported.add(tuple(known["path"]))
            return
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
    if kind == "use":
        return
    for c in children_of(kind, body):
        visit(c)


visit(doc["root"])
leaks = {}


def refs(value, where, known_paths, check):
    """Records in `leaks` every item that `value` names and `check` finds unreachable."""
    if isinstance(value, dict):
        ref = value.get("id")
        if isinstance(value.get("path"), str) and ref is not None:
            leak = check(str(ref), value["path"], known_paths.get(str(ref)))
            if leak:
                leaks.setdefault(leak, set()).add(where)
        for k, v in value.items():
            if k not in ("docs", "links", "span", "attrs"):
                refs(v, where, known_paths, check)
    elif isinstance(value, list):
        for v in value:
            refs(v, where, known_paths, check)


def unreachable_from_ottla(ref, name, known):
    if known is None and ref not in visible:
        # rustdoc strips hidden items from `paths` too: a referenced id it does
        # not know is an item of this crate that only a hidden module holds.
        return name
    if known and known["crate_id"] == 0 and ref not in visible:
        return "::".join(known["path"])
    if known and known["crate_id"] in core_crates and known["kind"] != "module":
        if not is_reexported(known["path"]):
            return "::".join(known["path"])
    return None


def signatures(items, known_paths, check, label=lambda item_id, item: item.get("name") or "impl"):
    for item_id, item in items:
        kind = next(iter(item["inner"])) if isinstance(item["inner"], dict) else item["inner"]
        if kind in ("module", "use"):
            continue
        if kind == "impl" and item["inner"]["impl"].get("trait") is not None:
            # A trait impl adds no names of its own beyond the trait's.
            continue
        refs(item["inner"], label(item_id, item), known_paths, check)


signatures([(i, index[i]) for i in visible], paths, unreachable_from_ottla)

# The core's items that ottla re-exports, walked in the core's own JSON: what their
# fields, variants and methods name must be re-exported by ottla too.
core_index, core_paths = core["index"], core["paths"]
core_by_path = {tuple(v["path"]): k for k, v in core_paths.items() if v["crate_id"] == 0}
# Each visible core item's name, qualified by its owners' (`ProduceError::Connection::0`).
core_visible = {}


def visit_core(item_id, owner=None):
    item_id = str(item_id)
    if item_id in core_visible or item_id not in core_index:
        return
    item = core_index[item_id]
    if item.get("crate_id", 0) != 0 or is_hidden(item):
        return
    inner = item["inner"]
    kind, body = next(iter(inner.items())) if isinstance(inner, dict) else (inner, None)
    name = "::".join(n for n in (owner, item.get("name")) if n) or "impl"
    core_visible[item_id] = name
    if kind in ("module", "use"):
        return
    for c in children_of(kind, body):
        visit_core(c, owner if kind == "impl" else name)


for path in sorted(reexported):
    if path not in core_by_path:
        print(f"error: {'::'.join(path)}, re-exported by ottla, is not in {core_json}", file=sys.stderr)
        sys.exit(2)
    visit_core(core_by_path[path])
for id_, v in core_paths.items():
    if v["crate_id"] == 0 and v["kind"] != "module" and any(
        tuple(v["path"])[: len(m)] == m for m in reexported_modules
    ):
        visit_core(id_)


def unreachable_from_core(ref, name, known):
    if known and known["crate_id"] == 0 and known["kind"] != "module":
        if not is_reexported(known["path"]):
            return "::".join(known["path"])
    return None


signatures(
    [(i, core_index[i]) for i in core_visible],
    core_paths,
    unreachable_from_core,
    label=lambda item_id, item: core_visible[item_id],
)

for name in sorted(leaks):
    print(f"{name} (named by {', '.join(sorted(leaks[name]))})")
if leaks:
    print(f"{len(leaks)} types reachable only through hidden paths", file=sys.stderr)
    sys.exit(1)
print(
    f"ok: every type the documented API names is documented "
    f"({len(reexported)} of the core's items re-exported, their signatures included)"
)
