//! A user's crate depends on ottla by path, with no `[patch]` of its own, and meets a
//! broker that answers Metadata with absurd array counts. ottla must return a typed
//! decode error, not abort the process on a huge allocation.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::time::Duration;

use ottla::error::{ApiKey, RequestError, WireError};
use ottla::{ClientConfig, Consumer, Error};
use ottla_downstream_check::{Lie, LyingBroker};

const CASES: [Lie; 4] = [
    Lie {
        metadata_max_version: 8,
        count: i32::MAX,
        padding: 1 << 20,
    },
    Lie {
        metadata_max_version: 8,
        count: i32::MAX,
        padding: 0,
    },
    Lie {
        metadata_max_version: 12,
        count: -2,
        padding: 1 << 20,
    },
    Lie {
        metadata_max_version: 12,
        count: i32::MAX,
        padding: 0,
    },
];

/// The build fails at bootstrap: the one broker's Metadata answer cannot decode, and
/// that decode error is kept typed.
fn is_metadata_decode_error(err: &Error) -> bool {
    let request = match err {
        Error::Request(e) => e,
        Error::Bootstrap { last: Some(e), .. } => e,
        _ => return false,
    };
    matches!(
        request,
        RequestError::Wire {
            source: WireError::Decode {
                api: ApiKey::Metadata,
                ..
            },
            ..
        }
    )
}

#[tokio::test]
async fn absurd_metadata_array_counts_are_typed_errors_in_a_dependent_crate() {
    for lie in CASES {
        let broker = LyingBroker::start(lie).await.expect("listen");
        let config =
            ClientConfig::new(&broker.bootstrap()).with_request_timeout(Duration::from_secs(2));
        let built = tokio::time::timeout(
            Duration::from_secs(60),
            Consumer::builder(&broker.bootstrap())
                .client_config(config)
                .group_id("downstream")
                .topics(["orders"])
                .build(),
        )
        .await
        .unwrap_or_else(|_| panic!("{lie:?}: build did not finish in 60 s"));
        let err = match built {
            Ok(_) => {
                panic!("{lie:?}: a consumer was built on a broker whose metadata cannot decode")
            }
            Err(err) => err,
        };
        assert!(
            is_metadata_decode_error(&err),
            "{lie:?}: expected a Metadata decode error, got {err:?}"
        );
        println!("{lie:?}: {err}");
    }
}

/// The control: the same bytes abort a program that decodes them with the unpatched
/// registry crate, so the test above would fail (the process would die) if ottla's
/// build used it. The child runs under a 4 GiB address-space limit, so the huge
/// reservation fails the same way whatever the machine's overcommit setting.
#[test]
fn the_same_bytes_abort_the_unpatched_registry_crate() {
    let output = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 4194304 && exec \"$0\"")
        .arg(env!("CARGO_BIN_EXE_decode-unpatched"))
        .output()
        .expect("run the child");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.signal(),
        Some(6),
        "expected SIGABRT from the unpatched decoder; status {:?}, stdout {:?}, stderr {stderr:?}",
        output.status,
        String::from_utf8_lossy(&output.stdout)
    );
    assert!(stderr.contains("memory allocation of"), "stderr: {stderr}");
}
