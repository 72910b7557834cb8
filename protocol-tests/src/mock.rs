//! The librdkafka mock cluster: [`ottla_testkit::mock`] (whose documentation lists the
//! mock's quirks), re-exported with the kit's error codes and API keys so the suites
//! keep their `protocol_tests::mock` paths.

pub use ottla_testkit::codes::{ErrorCode, api_key};
pub use ottla_testkit::mock::*;
