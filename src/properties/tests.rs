//! The shared machinery: lookup, suggestions, ignored keys, environment mapping,
//! value errors, and the table kept in step with the builders and the docs.

use super::*;
use crate::error::Error;
use crate::processor::ProcessorBuilder;
use crate::{ClientConfig, ConsumerBuilder, ProducerBuilder};

fn property_error(e: Error) -> PropertyError {
    match e {
        Error::Property(p) => p,
        other => panic!("expected a property error, got {other:?}"),
    }
}

#[test]
fn a_misspelt_key_is_refused_with_the_closest_name() {
    let err = ConsumerBuilder::new("h:1")
        .set("sesion.timeout.ms", "45000")
        .unwrap_err();
    assert!(
        err.to_string().contains("did you mean session.timeout.ms?"),
        "{err}"
    );
    assert_eq!(
        property_error(err),
        PropertyError::Unknown {
            key: "sesion.timeout.ms".into(),
            suggestion: Some("session.timeout.ms"),
        }
    );
    // librdkafka spellings are candidates too, and case is forgiven in the suggestion
    // (not in the match: names are case-sensitive, as in Java and librdkafka).
    assert_eq!(suggest("fetch.wait.max.mss"), Some("fetch.wait.max.ms"));
    assert_eq!(suggest("Linger.MS"), Some("linger.ms"));
    assert!(matches!(
        lookup("Linger.MS"),
        Err(PropertyError::Unknown { .. })
    ));
    assert_eq!(suggest("acs"), Some("acks"));
    // Nothing is suggested when nothing is close.
    let err = ProducerBuilder::new("h:1")
        .set("completely.unrelated", "1")
        .unwrap_err();
    assert_eq!(
        property_error(err),
        PropertyError::Unknown {
            key: "completely.unrelated".into(),
            suggestion: None,
        }
    );
}

#[test]
fn a_known_but_meaningless_key_is_recorded_and_never_silently_accepted() {
    let c = ClientConfig::new("h:1")
        .set("socket.nagle.disable", "true")
        .unwrap()
        .set("statistics.interval.ms", "5000")
        .unwrap()
        .set("socket.nagle.disable", "false")
        .unwrap();
    let keys: Vec<&str> = c
        .ignored_properties()
        .iter()
        .map(|i| i.key.as_str())
        .collect();
    assert_eq!(keys, ["socket.nagle.disable", "statistics.interval.ms"]);
    assert_eq!(
        c.ignored_properties()[0].reason,
        "ottla always turns Nagle off"
    );

    // A shared properties file: the consumer ignores the producer's settings and the
    // producer the consumer's, each saying where the key belongs.
    let shared = [
        ("bootstrap.servers", "h:1"),
        ("group.id", "g"),
        ("linger.ms", "20"),
        (
            "key.deserializer",
            "org.apache.kafka.common.serialization.StringDeserializer",
        ),
        ("enable.partition.eof", "true"),
    ];
    let consumer = ConsumerBuilder::from_properties(shared).unwrap();
    let ignored: Vec<(&str, &str)> = consumer
        .ignored_properties()
        .iter()
        .map(|i| (i.key.as_str(), i.reason))
        .collect();
    assert_eq!(
        ignored,
        [
            (
                "linger.ms",
                "a producer setting: give it to a ProducerBuilder or ProcessorBuilder"
            ),
            ("key.deserializer", "ottla hands out keys as bytes"),
            (
                "enable.partition.eof",
                "the consumer emits no end-of-partition events"
            ),
        ]
    );
    let producer = ProducerBuilder::from_properties(shared).unwrap();
    assert_eq!(producer.ignored_properties()[0].key, "group.id");
    assert!(
        producer.ignored_properties()[0]
            .reason
            .starts_with("a consumer setting"),
        "{:?}",
        producer.ignored_properties()
    );
    // A ClientConfig holds only connection settings: everything else is reported.
    let client = ClientConfig::from_properties(shared).unwrap();
    assert_eq!(client.ignored_properties().len(), 4);
    assert_eq!(client.bootstrap_servers, ["h:1"]);
    // Everything applied: nothing reported.
    let clean = ConsumerBuilder::new("h:1").set("group.id", "g").unwrap();
    assert!(clean.ignored_properties().is_empty());
}

#[test]
fn a_key_ottla_cannot_honour_is_refused() {
    let err = ProducerBuilder::new("h:1")
        .set("enable.gapless.guarantee", "true")
        .unwrap_err();
    let err = property_error(err);
    assert!(
        matches!(&err, PropertyError::Unsupported { key, .. } if key == "enable.gapless.guarantee"),
        "{err:?}"
    );
    assert!(err.to_string().contains("its own delivery future"), "{err}");
    // transactional.id was refused until the producer became transactional.
    assert!(
        ProducerBuilder::new("h:1")
            .set("transactional.id", "tx-1")
            .is_ok()
    );
}

#[test]
fn bad_values_name_the_key_and_the_value() {
    let cases: [(&str, &str, &str); 8] = [
        ("session.timeout.ms", "45s", "milliseconds"),
        ("enable.auto.commit", "yes", "true or false"),
        ("auto.offset.reset", "sometimes", "earliest"),
        ("isolation.level", "serializable", "read_committed"),
        ("fetch.max.bytes", "-1", "bytes"),
        ("fetch.wait.max.ms", "99999999999", "2147483647"),
        (
            "partition.assignment.strategy",
            "org.example.MyAssignor",
            "built-in",
        ),
        ("max.in.flight", "many", "count"),
    ];
    for (key, value, hint) in cases {
        let err = property_error(ConsumerBuilder::new("h:1").set(key, value).unwrap_err());
        let PropertyError::InvalidValue {
            key: k,
            value: v,
            expected,
        } = &err
        else {
            panic!("{key}: {err:?}");
        };
        assert_eq!((k.as_str(), v.as_str()), (key, value));
        assert!(expected.contains(hint), "{key}: {expected}");
        assert!(
            err.to_string().starts_with(&format!("{key}: {value:?}")),
            "{err}"
        );
    }
    for (key, value, hint) in [
        ("acks", "2", "all (-1), 1 or 0"),
        ("compression.codec", "brotli", "zstd"),
        ("batch.size", "16k", "bytes"),
    ] {
        let err = property_error(ProducerBuilder::new("h:1").set(key, value).unwrap_err());
        assert!(
            matches!(&err, PropertyError::InvalidValue { key: k, value: v, expected }
                if k == key && v == value && expected.contains(hint)),
            "{err:?}"
        );
    }
    // A secret's value is never repeated.
    let err = ClientConfig::new("h:1")
        .set(
            "sasl.jaas.config",
            "org.apache.kafka.common.security.plain.PlainLoginModule required username=\"u\" password=hunter2;",
        )
        .unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");
    assert!(err.to_string().contains("(secret)"), "{err}");
}

#[test]
fn environment_variables_map_to_property_names() {
    assert_eq!(
        env_key("OTTLA_", "OTTLA_SESSION_TIMEOUT_MS").as_deref(),
        Some("session.timeout.ms")
    );
    assert_eq!(
        env_key("OTTLA_", "OTTLA_LOG__LEVEL").as_deref(),
        Some("log_level")
    );
    assert_eq!(
        env_key("OTTLA_", "OTTLA_OTTLA_TOPICS").as_deref(),
        Some("ottla.topics")
    );
    assert_eq!(env_key("OTTLA_", "OTTLA_"), None);
    assert_eq!(env_key("OTTLA_", "ottla_client_id"), None);
    assert_eq!(env_key("OTTLA_", "PATH"), None);

    let vars = [
        ("PATH", "/usr/bin"),
        ("OTTLA_BOOTSTRAP_SERVERS", "a:1,b:2"),
        ("OTTLA_GROUP_ID", "billing"),
        ("OTTLA_OTTLA_TOPICS", "orders, refunds"),
        ("OTTLA_SESSION_TIMEOUT_MS", "6000"),
        ("OTTLA_SOCKET_NAGLE_DISABLE", "true"),
    ];
    let consumer = ConsumerBuilder::from_env_vars("OTTLA_", vars).unwrap();
    assert_eq!(consumer.client().bootstrap_servers, ["a:1", "b:2"]);
    assert_eq!(
        consumer
            .ignored_properties()
            .iter()
            .map(|i| i.key.as_str())
            .collect::<Vec<_>>(),
        ["socket.nagle.disable"]
    );
    // Validated the same way as any other property.
    let err =
        ConsumerBuilder::from_env_vars("OTTLA_", [("OTTLA_SESION_TIMEOUT_MS", "1")]).unwrap_err();
    assert!(
        err.to_string().contains("did you mean session.timeout.ms?"),
        "{err}"
    );
    let err = ProducerBuilder::from_env_vars("APP_KAFKA_", [("APP_KAFKA_LINGER_MS", "soon")])
        .unwrap_err();
    assert_eq!(
        property_error(err),
        PropertyError::InvalidValue {
            key: "linger.ms".into(),
            value: "soon".into(),
            expected: "a whole number of milliseconds".into(),
        }
    );
    let client = ClientConfig::from_env_vars("K_", [("K_CLIENT_ID", "svc")]).unwrap();
    assert_eq!(client.client_id, "svc");
}

#[test]
fn every_property_in_the_table_has_an_arm_in_its_builder() {
    // `not_here` (an Unknown without suggestion) is what a builder answers for a name
    // the table has but its match lacks. Any other answer (applied, or a value error)
    // means the arm exists.
    for p in PROPERTIES {
        for name in std::iter::once(p.name).chain(p.aliases.iter().copied()) {
            let result = match p.scope {
                Scope::Client => ClientConfig::new("h:1").set(name, "x").map(drop),
                Scope::Consumer => ConsumerBuilder::new("h:1").set(name, "x").map(drop),
                Scope::Producer => ProducerBuilder::new("h:1").set(name, "x").map(drop),
                Scope::Processor => ProcessorBuilder::new("h:1", "g", ["t"])
                    .set(name, "x")
                    .map(drop),
            };
            if let Err(e) = result {
                assert!(
                    !matches!(e, Error::Property(PropertyError::Unknown { .. })),
                    "{name}: {e}"
                );
            }
            // The processor routes every scope.
            if let Err(e) = ProcessorBuilder::new("h:1", "g", ["t"]).set(name, "x") {
                assert!(
                    !matches!(e, Error::Property(PropertyError::Unknown { .. })),
                    "processor, {name}: {e}"
                );
            }
        }
    }
}

#[test]
fn the_module_docs_name_every_property_and_no_name_is_listed_twice() {
    let docs: String = include_str!("../properties.rs")
        .lines()
        .filter(|l| l.starts_with("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut seen = std::collections::BTreeSet::new();
    for p in PROPERTIES {
        for name in std::iter::once(p.name).chain(p.aliases.iter().copied()) {
            assert!(
                docs.contains(&format!("`{name}`")),
                "{name} is not in the docs"
            );
            assert!(seen.insert(name), "{name} is in the table twice");
        }
    }
    for (name, _) in IGNORED.iter().chain(UNSUPPORTED) {
        assert!(
            seen.insert(name),
            "{name} is both understood and ignored, or listed twice"
        );
    }
}
