//! The README's "Chaos-testing your own handler" example is the testkit README's, which
//! the kit's doctests compile: the two stay the same code.

fn example(readme: &str, heading: &str, fence: &str) -> String {
    let Some(section) = readme.split(heading).nth(1) else {
        panic!("no section {heading:?}");
    };
    let Some(block) = section.split(fence).nth(1) else {
        panic!("no {fence:?} block in {heading:?}");
    };
    let block = block.split("```").next().unwrap_or_default();
    block
        .lines()
        .filter(|l| !l.starts_with("# ") && *l != "#")
        .collect::<Vec<_>>()
        .join("\n")
        .trim()
        .to_string()
}

#[test]
fn the_readmes_chaos_examples_are_the_same_code() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let read = |p: &str| {
        std::fs::read_to_string(format!("{root}/{p}")).unwrap_or_else(|e| panic!("{p}: {e}"))
    };
    let main = example(
        &read("README.md"),
        "### Chaos-testing your own handler",
        "```rust,ignore\n",
    );
    let kit = example(
        &read("testkit/README.md"),
        "## Chaos-testing your own handler",
        "```rust\n",
    );
    assert!(main.contains("Chaos::new("), "{main}");
    assert_eq!(main, kit);
}
