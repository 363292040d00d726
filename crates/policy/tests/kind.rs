//! `PolicyKind` parsing, printing and the factory.

use tiermem_policy::{new_policy, PolicyKind, UnknownPolicy};

#[test]
fn names_round_trip_and_ignore_case() {
    let names = ["lru", "lru-cost", "priority", "random", "belady"];
    for (kind, name) in PolicyKind::ALL.into_iter().zip(names) {
        assert_eq!(kind.to_string(), name);
        assert_eq!(name.parse::<PolicyKind>(), Ok(kind));
        assert_eq!(name.to_uppercase().parse::<PolicyKind>(), Ok(kind));
    }
    assert_eq!("Lru-Cost".parse::<PolicyKind>(), Ok(PolicyKind::LruCost));
}

#[test]
fn unknown_name_is_rejected_with_the_valid_names() {
    let err = "fifo".parse::<PolicyKind>().unwrap_err();
    assert_eq!(err, UnknownPolicy("fifo".to_owned()));
    let message = err.to_string();
    assert!(message.contains("fifo"), "{message}");
    for kind in PolicyKind::ALL {
        assert!(message.contains(&kind.to_string()), "{message}");
    }
    assert!("lrucost".parse::<PolicyKind>().is_err());
    assert!("".parse::<PolicyKind>().is_err());
}

#[test]
fn factory_builds_the_requested_kind() {
    for kind in PolicyKind::ALL {
        assert_eq!(new_policy(kind, 7).kind(), kind);
    }
}
