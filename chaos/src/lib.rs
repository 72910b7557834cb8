//! The chaos runner's library: ottla-testkit's chaos harness
//! ([`ottla_testkit::chaos`]), re-exported so that the `chaos` program and
//! `tests/chaos.rs` keep their paths. The run, the seeded fault plan and the checks
//! live in the kit, where users run them on their own handlers; the program runs the
//! kit's synthetic application ([`ottla_testkit::chaos::app::synthetic`]).

pub use ottla_testkit::chaos::*;
