//! The FRR BFD harness (integration_tests::frr) on its own, without the monitor: two real bfdd
//! daemons in two namespaces bring a single-hop session Up, and when one of them is killed the
//! other declares the session down by detection timeout.

use std::time::{Duration, Instant};

use integration_tests::{
    frr::{BfdPair, BfdState},
    netns::NetnsPair,
    require_root,
};

#[test]
fn frr_bfd_pair_reaches_up_and_detects_a_killed_peer() {
    require_root();
    // Declared first, dropped last: the daemons stop before their namespaces go.
    let net = NetnsPair::named(90, ["hbfba", "hbfbb"], ["hbfva", "hbfvb"]);
    let mut bfd = BfdPair::on_netns_pair(&net);

    let started = Instant::now();
    let (local, remote) = bfd.wait_up(Duration::from_secs(20));
    eprintln!(
        "BFD session Up on both sides {:?} after start",
        started.elapsed()
    );

    // Each side sees the other's configured timers and its discriminator.
    assert_eq!(local.peer.to_string(), net.addr_b);
    assert_eq!(local.local.map(|a| a.to_string()), Some(net.addr_a.clone()));
    assert!(!local.multihop);
    for session in [&local, &remote] {
        assert_eq!(session.state, BfdState::Up);
        assert_eq!(session.diagnostic, "ok");
        assert_eq!(session.detect_multiplier, 3);
        assert_eq!(session.receive_interval_ms, 100);
        assert_eq!(session.transmit_interval_ms, 100);
        assert_eq!(session.remote_detect_multiplier, 3);
        assert_eq!(session.remote_receive_interval_ms, 100);
        assert_eq!(session.remote_transmit_interval_ms, 100);
        assert_ne!(session.local_discriminator, 0);
    }
    assert_eq!(local.remote_discriminator, remote.local_discriminator);
    assert_eq!(remote.remote_discriminator, local.local_discriminator);
    assert_ne!(local.local_discriminator, remote.local_discriminator);

    // A crash of the remote bfdd: no Down packet, so the local side must time it out.
    let killed = bfd.kill_remote_bfdd();
    let killed_at = Instant::now();
    assert!(bfd.remote.bfdd_pid().is_none());
    assert!(
        !std::path::Path::new(&format!("/proc/{killed}")).exists(),
        "bfdd {killed} still exists after SIGKILL"
    );
    let down = bfd.wait_local_down(Duration::from_secs(10));
    let detected_after = killed_at.elapsed();
    eprintln!(
        "local bfdd declared the session {:?} {detected_after:?} after the kill",
        down.state
    );
    assert_eq!(down.state, BfdState::Down, "{down:?}");
    assert_eq!(
        down.diagnostic, "control detection time expired",
        "{down:?}"
    );
    assert_eq!(down.local_discriminator, local.local_discriminator);
    // The local bfdd itself is fine and keeps the session configured.
    assert!(bfd.local.bfdd_pid().is_some());
    assert_eq!(bfd.local_session().state, BfdState::Down);
}
