//! What ottla's fuzz targets share: the input conventions each target reads, the
//! drivers that feed decoded input through ottla's own entry points and check the
//! promises those entry points make, and the committed seed corpus
//! (`cargo run --example seeds`).
//!
//! The targets in `fuzz_targets/` are one line each; the logic lives here so that the
//! seed writer and the targets agree on every input format.

pub mod batch;
pub mod group_ops;
pub mod input;
pub mod response;
pub mod seeds;
