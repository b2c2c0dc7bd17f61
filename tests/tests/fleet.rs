//! Fleet on NATS JetStream with real servers: nats-server processes started here (in a
//! namespace of their own, their stores in temp dirs, killed by pid on drop), two or three
//! real agents with the real XDP path, each in its own namespace watching the same senders
//! (each peer sends to every observer), and `monitor fleet` reading the fleet's view.
//! Topology: tests/src/fleet_net.rs. Conditions are polled, never slept on.
//!
//! The tests take the same subnets (60..=69, each in namespaces of their own), and two of
//! them at once would crowd 2 cores: they run one at a time.

use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

use integration_tests::{
    fleet_net::{FleetNet, NatsServer, Observer, events_by_observer, suspect_ids, wait_for},
    require_root,
};
use monitor_common::wire::DEFAULT_PORT;
use serde_json::{Value, json};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

const LOCAL: &str = "nats://127.0.0.1:4222";

/// Every observer's view of `id`, by observer: (live, level).
fn peer_levels(net: &FleetNet, urls: &str, id: u64) -> Vec<(String, bool, Option<f64>)> {
    let reply = net.fleet(urls, &["query", "peer", &id.to_string()]);
    assert_eq!(reply["ok"], json!(true), "{reply}");
    reply["observers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["observer"].as_str().unwrap().to_string(),
                o["live"].as_bool().unwrap(),
                o["level"].as_f64(),
            )
        })
        .collect()
}

fn live_observers(net: &FleetNet, urls: &str) -> Vec<Value> {
    let reply = net.fleet(urls, &["query", "observers"]);
    assert_eq!(reply["ok"], json!(true), "{reply}");
    live_in(&reply)
}

fn live_in(reply: &Value) -> Vec<Value> {
    reply["observers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["live"] == json!(true))
        .cloned()
        .collect()
}

/// Live observers, or `None` while the cluster cannot answer (a stream leader being
/// elected after a node loss takes a few seconds: queries time out meanwhile).
fn live_observers_eventually(net: &FleetNet, urls: &str) -> Option<Vec<Value>> {
    let t = Instant::now();
    let reply = net.fleet(urls, &["query", "observers"]);
    if reply["ok"] != json!(true) {
        println!("query observers failed after {:?}: {reply}", t.elapsed());
    }
    (reply["ok"] == json!(true)).then(|| live_in(&reply))
}

/// The sequence numbers of one observer's events are exactly 1..=n, each once.
fn assert_contiguous(observer: &str, events: &[(u64, Value)]) -> u64 {
    let mut seqs: Vec<u64> = events.iter().map(|(s, _)| *s).collect();
    seqs.sort_unstable();
    let n = seqs.len() as u64;
    assert_eq!(
        seqs,
        (1..=n).collect::<Vec<_>>(),
        "{observer}: events lost or repeated"
    );
    n
}

#[test]
fn quorum_liveness_and_bad_input_with_three_observers() {
    require_root();
    let _serial = serial();
    let net = FleetNet::new(3);
    let _nats = NatsServer::start(&net.nats_ns, 4222);
    let mut observers: Vec<Observer> = net
        .observers
        .iter()
        .map(|o| Observer::start(o, &format!("nats://{}:4222", o.nats_addr), &[]))
        .collect();
    // Peers 1, 2 and 3, each sending to every observer.
    let mut senders: std::collections::BTreeMap<(u64, usize), _> = (1..=3u64)
        .flat_map(|id| (0..3).map(move |i| (id, i)))
        .map(|(id, i)| ((id, i), net.sender(id, i)))
        .collect();
    let watch = net.watch(LOCAL, &["--quorum", "2"]);
    let events = net.watch(LOCAL, &["--events", "--from-start"]);
    wait_for("three live observers", Duration::from_secs(20), || {
        (live_observers(&net, LOCAL).len() == 3).then_some(())
    });
    wait_for(
        "every agent watches peers 1-3",
        Duration::from_secs(20),
        || {
            observers
                .iter()
                .all(|o| {
                    o.ask(json!({"op": "peers"}))
                        .and_then(|r| r["peers"].as_array().map(|p| p.len() == 3))
                        == Some(true)
                })
                .then_some(())
        },
    );

    // Peer 2 is cut off from obs-a only: a lone suspicion.
    drop(senders.remove(&(2, 0)));
    wait_for(
        "obs-a holds peer 2 at level 8",
        Duration::from_secs(20),
        || {
            peer_levels(&net, LOCAL, 2)
                .iter()
                .any(|(o, live, level)| o == "obs-a" && *live && *level == Some(8.0))
                .then_some(())
        },
    );
    let at2 = net.fleet(LOCAL, &["query", "suspects", "--quorum", "2"]);
    assert!(!suspect_ids(&at2).contains(&2), "{at2}");
    let at1 = net.fleet(LOCAL, &["query", "suspects", "--quorum", "1"]);
    let lone = at1["suspects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == json!(2))
        .unwrap_or_else(|| panic!("peer 2 not convicted at quorum 1: {at1}"));
    assert_eq!(lone["observers"], json!(["obs-a"]), "{at1}");
    assert_eq!(lone["level"], json!(8.0));

    // Peer 1 dies: every observer sees it, the fleet convicts at quorum 2.
    for i in 0..3 {
        drop(senders.remove(&(1, i)));
    }
    let reply = wait_for("peer 1 down at quorum 2", Duration::from_secs(20), || {
        let r = net.fleet(LOCAL, &["query", "suspects", "--quorum", "2"]);
        r["suspects"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == json!(1) && s["observers"].as_array().unwrap().len() == 3)
            .map(|_| r.clone())
    });
    assert_eq!(suspect_ids(&reply), vec![1], "{reply}");
    assert_eq!(reply["live_observers"], json!(3));
    wait_for("watch reports peer 1 down", Duration::from_secs(10), || {
        watch
            .snapshot()
            .iter()
            .any(|l| l["event"] == json!("down") && l["id"] == json!(1))
            .then_some(())
    });
    assert!(
        !watch.snapshot().iter().any(|l| l["id"] == json!(2)),
        "the lone suspicion of peer 2 reached the fleet watch at quorum 2: {:?}",
        watch.snapshot()
    );

    // Bad input on the bucket and the stream: skipped and counted, nobody crashes.
    net.publish_raw(4222, "$KV.heartbeat-verdicts.1.obs-x", b"not json");
    net.publish_raw(4222, "$KV.heartbeat-verdicts.observers.obs-y", b"[1,2");
    net.publish_raw(4222, "$KV.heartbeat-verdicts.bogus", b"{}");
    net.publish_raw(4222, "heartbeat.events.obs-z", b"\xff\xfegarbage");
    net.publish_raw(
        4222,
        "heartbeat.events.obs-a",
        br#"{"event":"suspect","observer":"obs-b","seq":1,"id":1}"#,
    );
    let reply = net.fleet(LOCAL, &["query", "suspects", "--quorum", "2"]);
    assert_eq!(reply["ok"], json!(true), "{reply}");
    assert_eq!(suspect_ids(&reply), vec![1], "{reply}");
    assert_eq!(reply["malformed"], json!(3), "{reply}");
    wait_for(
        "the watch counts 3 bad bucket entries",
        Duration::from_secs(10),
        || {
            watch
                .snapshot()
                .iter()
                .any(|l| l["event"] == json!("malformed") && l["count"] == json!(3))
                .then_some(())
        },
    );
    wait_for(
        "the event follower counts 2 bad events",
        Duration::from_secs(10),
        || {
            events
                .snapshot()
                .iter()
                .any(|l| {
                    l["event"] == json!("malformed")
                        && l["source"] == json!("stream")
                        && l["count"] == json!(2)
                })
                .then_some(())
        },
    );
    for o in observers.iter_mut() {
        assert!(o.alive(), "an agent died on bad input");
    }

    // obs-c is killed: its verdicts stop counting once its liveness record is 3 s old, not
    // before (it was rewritten at most 1 s before the kill).
    let at3 = net.fleet(LOCAL, &["query", "suspects", "--quorum", "3"]);
    assert_eq!(suspect_ids(&at3), vec![1], "{at3}");
    observers[2].kill();
    let killed = Instant::now();
    wait_for("obs-c stops counting", Duration::from_secs(10), || {
        let r = net.fleet(LOCAL, &["query", "suspects", "--quorum", "3"]);
        suspect_ids(&r).is_empty().then_some(())
    });
    let after = killed.elapsed();
    assert!(
        after >= Duration::from_millis(1900) && after <= Duration::from_secs(5),
        "obs-c stopped counting {after:?} after it was killed (bound: 3 s after its last record)"
    );
    let view = peer_levels(&net, LOCAL, 1);
    assert!(
        view.contains(&("obs-c".into(), false, Some(8.0))),
        "obs-c's verdict stays in the bucket, not counted: {view:?}"
    );
    let at2 = net.fleet(LOCAL, &["query", "suspects", "--quorum", "2"]);
    assert_eq!(suspect_ids(&at2), vec![1], "{at2}");
    assert_eq!(at2["live_observers"], json!(2));

    // Peer 1 comes back to obs-a and obs-b: up again at quorum 2.
    senders.insert((1, 0), net.sender(1, 0));
    senders.insert((1, 1), net.sender(1, 1));
    wait_for("watch reports peer 1 up", Duration::from_secs(10), || {
        watch
            .snapshot()
            .iter()
            .any(|l| l["event"] == json!("up") && l["id"] == json!(1))
            .then_some(())
    });

    // Nothing published by the live observers was lost: sequence numbers are contiguous,
    // and every suspicion of peer 1 is there, each level once.
    let by = events_by_observer(&events.snapshot());
    for name in ["obs-a", "obs-b", "obs-c"] {
        let evs = by
            .get(name)
            .unwrap_or_else(|| panic!("no events from {name}"));
        assert_contiguous(name, evs);
        let levels: Vec<f64> = evs
            .iter()
            .filter(|(_, e)| e["event"] == json!("suspect") && e["id"] == json!(1))
            .map(|(_, e)| e["level"].as_f64().unwrap())
            .collect();
        assert_eq!(levels, vec![1.0, 3.0, 8.0], "{name}");
    }
}

/// A verdict at level 8 on peer 71, as a forger would write it under any observer's key.
fn forged_verdict() -> Vec<u8> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    json!({"level": 8.0, "phi": 9.0, "since": now - 5000, "crossed_at": now, "at": now})
        .to_string()
        .into_bytes()
}

/// Issue 21, a fleet no observer can forge. Without permissions any client of the server
/// can write every observer's keys: a client that writes `71.obs-a` and `71.obs-b` at
/// level 8 makes the fleet convict peer 71 at quorum 2. With each observer's user limited to
/// its own subjects (`monitor fleet permissions`, the stream and bucket made by the admin's
/// `monitor fleet init`), the observers still publish everything (and nats-server logs no
/// violation of theirs), while a client authenticated as obs-a is refused obs-b's key and
/// event subject, a reader is refused every write, a rollup of the whole bucket from obs-a's
/// own key is refused, and the forged quorum does not appear.
#[test]
fn no_observer_can_forge_another_observers_verdicts() {
    use monitor::fleet::permissions;
    require_root();
    let _serial = serial();
    let net = FleetNet::new(2);
    let forged = forged_verdict();

    // Without permissions: the attack works.
    {
        let _nats = NatsServer::start(&net.nats_ns, 4222);
        let _observers: Vec<Observer> = net
            .observers
            .iter()
            .map(|o| Observer::start(o, &format!("nats://{}:4222", o.nats_addr), &[]))
            .collect();
        wait_for("two live observers", Duration::from_secs(20), || {
            (live_observers(&net, LOCAL).len() == 2).then_some(())
        });
        for key in ["71.obs-a", "71.obs-b"] {
            net.publish_raw(4222, &format!("$KV.heartbeat-verdicts.{key}"), &forged);
        }
        let reply = net.fleet(LOCAL, &["query", "suspects", "--quorum", "2"]);
        assert_eq!(
            suspect_ids(&reply),
            vec![71],
            "without permissions the forged quorum convicts peer 71: {reply}"
        );
        println!("without permissions: forged quorum {reply}");
    }

    // With a user per observer, a reader and an admin.
    let secrets = integration_tests::agent_process::TempDir::new("hbmnatspw");
    let password = |user: &str| {
        use std::os::unix::fs::PermissionsExt;
        let path = secrets.0.join(format!("{user}.pw"));
        std::fs::write(&path, format!("{user}-secret\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        path.to_str().unwrap().to_string()
    };
    let auth = |user: &str| {
        vec![
            "--nats-user".to_string(),
            user.to_string(),
            "--nats-password-file".to_string(),
            password(user),
        ]
    };
    let mut users = vec![
        r#"{ user: "admin", password: "admin-secret" }"#.to_string(),
        permissions::reader().user_config("reader", "reader-secret"),
    ];
    for o in &net.observers {
        users.push(
            permissions::observer(&o.name)
                .unwrap()
                .user_config(&o.name, &format!("{}-secret", o.name)),
        );
    }
    let config = format!(
        "authorization {{\n  users = [\n    {}\n  ]\n}}\n",
        users.join("\n    ")
    );
    let mut nats = NatsServer::start_with_config(&net.nats_ns, 4222, &config);
    let reader = auth("reader");
    let reader: Vec<&str> = reader.iter().map(String::as_str).collect();
    let admin = auth("admin");
    let admin: Vec<&str> = admin.iter().map(String::as_str).collect();

    // Nobody without a user gets in; a reader cannot create the stream.
    let anonymous = net.fleet(LOCAL, &["query", "observers"]);
    assert_eq!(anonymous["ok"], json!(false), "{anonymous}");
    let init = net.fleet_as(LOCAL, &admin, &["init"]);
    assert_eq!(init["ok"], json!(true), "{init}");
    assert_eq!(init["stream"], json!("created"), "{init}");
    assert_eq!(init["bucket"], json!("created"), "{init}");

    let observers: Vec<Observer> = net
        .observers
        .iter()
        .map(|o| {
            let a = auth(&o.name);
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            Observer::start(o, &format!("nats://{}:4222", o.nats_addr), &a)
        })
        .collect();
    let events = net.watch_as(LOCAL, &reader, &["--events", "--from-start"]);
    let live = |net: &FleetNet| {
        let r = net.fleet_as(LOCAL, &reader, &["query", "observers"]);
        assert_eq!(r["ok"], json!(true), "{r}");
        live_in(&r)
    };
    wait_for("two live observers", Duration::from_secs(20), || {
        (live(&net).len() == 2).then_some(())
    });

    // obs-a publishes as before: peer 5, heard by obs-a only, goes silent.
    let sender = net.sender(5, 0);
    wait_for("obs-a watches peer 5", Duration::from_secs(20), || {
        observers[0]
            .ask(json!({"op": "peers"}))
            .and_then(|r| r["peers"].as_array().map(|p| p.len() == 1))
            .filter(|&b| b)
    });
    drop(sender);
    let peer5 = |net: &FleetNet| {
        let r = net.fleet_as(LOCAL, &reader, &["query", "peer", "5"]);
        assert_eq!(r["ok"], json!(true), "{r}");
        r["observers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o["observer"] == json!("obs-a") && o["level"] == json!(8.0))
    };
    wait_for(
        "obs-a's verdict on peer 5 at level 8",
        Duration::from_secs(20),
        || peer5(&net).then_some(()),
    );
    wait_for(
        "obs-a's suspect events on the stream",
        Duration::from_secs(10),
        || {
            events
                .snapshot()
                .iter()
                .any(|l| {
                    l["observer"] == json!("obs-a")
                        && l["event"] == json!("suspect")
                        && l["id"] == json!(5)
                        && l["level"] == json!(8.0)
                })
                .then_some(())
        },
    );

    // The attack, as obs-a: its own key is its own to write (it may lie about itself) ...
    let as_a = Some(("obs-a", "obs-a-secret"));
    net.publish_raw_as(4222, as_a, "$KV.heartbeat-verdicts.71.obs-a", &[], &forged)
        .expect("obs-a writes its own key");
    // ... but not obs-b's key, nor obs-b's events, nor a direct get copying a value there.
    let forgeries = [
        "$KV.heartbeat-verdicts.71.obs-b",
        "$KV.heartbeat-verdicts.observers.obs-b",
        "heartbeat.events.obs-b",
        "$JS.API.DIRECT.GET.KV_heartbeat-verdicts",
        "$JS.API.STREAM.PURGE.KV_heartbeat-verdicts",
    ];
    for subject in forgeries {
        let refused = net
            .publish_raw_as(4222, as_a, subject, &[], &forged)
            .expect_err(subject);
        assert!(
            refused.contains(&format!(
                "Permissions Violation for Publish to \"{subject}\""
            )),
            "{subject}: {refused}"
        );
    }
    // A rollup from its own key would have purged every other key: refused by the bucket.
    net.publish_raw_as(
        4222,
        as_a,
        "$KV.heartbeat-verdicts.72.obs-a",
        &[("Nats-Rollup", "all")],
        &forged,
    )
    .expect("published (the bucket refuses it)");
    let as_reader = Some(("reader", "reader-secret"));
    let refused = net
        .publish_raw_as(
            4222,
            as_reader,
            "$KV.heartbeat-verdicts.71.obs-b",
            &[],
            &forged,
        )
        .expect_err("a reader writes");
    assert!(refused.contains("Permissions Violation"), "{refused}");

    let reply = net.fleet_as(LOCAL, &reader, &["query", "suspects", "--quorum", "2"]);
    assert_eq!(reply["ok"], json!(true), "{reply}");
    assert!(!suspect_ids(&reply).contains(&71), "forged quorum: {reply}");
    assert_eq!(reply["live_observers"], json!(2), "{reply}");
    let at1 = net.fleet_as(LOCAL, &reader, &["query", "suspects", "--quorum", "1"]);
    assert_eq!(suspect_ids(&at1), vec![5, 71], "{at1}");
    assert!(peer5(&net), "obs-a's verdict survived the rollup");
    let view = net.fleet_as(LOCAL, &reader, &["query", "peer", "71"]);
    let holders: Vec<&str> = view["observers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["level"].is_number())
        .map(|o| o["observer"].as_str().unwrap())
        .collect();
    assert_eq!(holders, vec!["obs-a"], "{view}");
    integration_tests::attack::AttackRow {
        attack: "one observer forges another's verdicts (NATS)",
        load: format!(
            "{} forged writes as obs-a, per-observer permissions",
            forgeries.len()
        ),
        wrongly_convicted: Some(u64::from(suspect_ids(&reply).contains(&71))),
        ..Default::default()
    }
    .report();

    // The observers kept publishing, unrefused: every violation in the server's log is one
    // of the forgeries above.
    let mut observers = observers;
    for o in observers.iter_mut() {
        assert!(o.alive(), "an agent died");
    }
    let by = events_by_observer(&events.snapshot());
    for name in ["obs-a", "obs-b"] {
        assert!(by.contains_key(name), "no events from {name}");
    }
    let log = nats.log_text();
    for line in log.lines().filter(|l| l.contains("Violation")) {
        assert!(
            (line.contains("\"obs-a\"") || line.contains("\"reader\""))
                && (forgeries.iter().any(|s| line.contains(s)) || line.contains("71.obs-b")),
            "a violation not of the test's forgeries: {line}"
        );
    }
    nats.wait_for_log("Publish Violation", Duration::from_secs(1));
}

/// A node of three is killed (issue 11): events keep flowing, none is lost, and the fleet's
/// view (`watch --events`, `query`, the quorum `watch`) catches up. Measured on this machine
/// (2 cores): nats-server 2.9.10 elects a new leader for a stream the lost node led 4 to 9 s
/// after the kill; in 15 runs the observers' counters showed everything published 1.6 to
/// 21 s after it and the whole view had caught up 3.5 to 21 s after it, within the bounds
/// below. It used to fail in 3 of 4 runs: async-nats's ordered consumer, behind
/// `watch --events`, could stay silent for over 60 s while re-creating itself, and a third
/// of `query` runs timed out because 2.9 still placed some of their one-replica consumers
/// on the dead node (docs/fleet.md, "Losing a NATS node"). Progress is printed
/// (`--nocapture`), and on a failure the fleet's state and every server's /jsz, and the
/// servers' whole logs are kept; `FLEET_AGENT_LOG=info` shows the agents' fleet log.
#[test]
fn events_survive_the_loss_of_one_of_three_nats_nodes() {
    require_root();
    let _serial = serial();
    let net = FleetNet::new(2);
    let mut nodes: Vec<NatsServer> = (0..3)
        .map(|n| NatsServer::cluster_node(&net.nats_ns, 4222, n))
        .collect();
    // The cluster's JetStream is usable once a metadata leader is elected.
    wait_for(
        "a JetStream metadata leader",
        Duration::from_secs(30),
        || {
            nodes
                .iter()
                .any(|n| {
                    n.log_text()
                        .contains("JetStream cluster new metadata leader")
                })
                .then_some(())
        },
    );
    let all = "nats://127.0.0.1:4222,nats://127.0.0.1:4223,nats://127.0.0.1:4224";
    let observers: Vec<Observer> = net
        .observers
        .iter()
        .map(|o| {
            let urls: Vec<String> = (4222..4225)
                .map(|p| format!("nats://{}:{p}", o.nats_addr))
                .collect();
            Observer::start(o, &urls.join(","), &["--nats-replicas", "3"])
        })
        .collect();
    let mut senders: std::collections::BTreeMap<(u64, usize), _> = (1..=4u64)
        .flat_map(|id| (0..2).map(move |i| (id, i)))
        .map(|(id, i)| ((id, i), net.sender(id, i)))
        .collect();
    wait_for("two live observers", Duration::from_secs(30), || {
        (live_observers_eventually(&net, all)?.len() == 2).then_some(())
    });
    let events = net.watch(all, &["--events", "--from-start"]);
    let judged = net.watch(all, &["--quorum", "2"]);
    let suspected = |id: u64| {
        let by = events_by_observer(&events.snapshot());
        ["obs-a", "obs-b"].iter().all(|o| {
            by.get(*o).is_some_and(|evs| {
                evs.iter().any(|(_, e)| {
                    e["event"] == json!("suspect")
                        && e["id"] == json!(id)
                        && e["level"] == json!(8.0)
                })
            })
        })
    };
    for id in [1, 2] {
        for i in 0..2 {
            drop(senders.remove(&(id, i)));
        }
    }
    wait_for(
        "peers 1 and 2 suspected by both",
        Duration::from_secs(20),
        || (suspected(1) && suspected(2)).then_some(()),
    );

    // A node crashes; events keep flowing through the other two. The node obs-a is connected
    // to, so its client must fail over, unless that node leads the JetStream cluster's
    // metadata: nats-server 2.9 on this 2-core machine has taken over 60 s to elect a new
    // metadata leader (two full-suite runs timed out waiting), which is the server's recovery
    // time, not what this test is about. Then another node that does not lead goes.
    let port = net
        .connected_port(0, &[4222, 4223, 4224])
        .unwrap_or_else(|| panic!("obs-a is connected to no node: {}", net.sockets()));
    let leads = |n: &NatsServer| {
        n.log_text()
            .lines()
            .rfind(|l| {
                l.contains("JetStream cluster new metadata leader")
                    || l.contains("Self is new JetStream cluster metadata leader")
            })
            .is_some_and(|l| l.contains("Self is new"))
    };
    let connected = usize::from(port - 4222);
    let crashed = if leads(&nodes[connected]) {
        (0..3)
            .find(|&n| n != connected && !leads(&nodes[n]))
            .expect("a node that does not lead")
    } else {
        connected
    };
    println!(
        "crashing node {crashed} (obs-a is connected to node {connected}{})",
        if crashed == connected {
            ""
        } else {
            ", the metadata leader"
        }
    );
    nodes[crashed].kill();
    let crashed_at = Instant::now();
    for id in [3, 4] {
        for i in 0..2 {
            drop(senders.remove(&(id, i)));
        }
    }
    for id in [1, 2] {
        for i in 0..2 {
            senders.insert((id, i), net.sender(id, i));
        }
    }
    let rest = (4222..4225)
        .filter(|&p| p != port)
        .map(|p| format!("nats://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let rest = rest.as_str();
    let dump = || {
        let by = events_by_observer(&events.snapshot());
        for (name, evs) in &by {
            let tail: Vec<String> = evs
                .iter()
                .rev()
                .take(6)
                .map(|(seq, e)| format!("#{seq} {} {} {}", e["event"], e["id"], e["level"]))
                .collect();
            println!("DUMP {name}: {} events, newest first: {tail:?}", evs.len());
        }
        println!(
            "DUMP observers: {}",
            net.fleet(rest, &["query", "observers"])
        );
        println!("DUMP quorum watch: {:?}", judged.snapshot());
        for n in 0..3u16 {
            let jsz = NatsServer::jsz(&net.nats_ns, 8222 + n);
            for acc in jsz["account_details"].as_array().into_iter().flatten() {
                for st in acc["stream_detail"].as_array().into_iter().flatten() {
                    println!(
                        "DUMP node{n} stream {} cluster {} state {}",
                        st["name"], st["cluster"], st["state"]
                    );
                    for c in st["consumer_detail"].as_array().into_iter().flatten() {
                        println!(
                            "DUMP node{n}   consumer {} cluster {} delivered {} pending {}",
                            c["name"], c["cluster"], c["delivered"], c["num_pending"]
                        );
                    }
                }
            }
        }
    };
    let _dump_guard = DumpOnPanic(&dump);
    wait_for(
        "peers 3 and 4 suspected, 1 and 2 recovered, after the node loss",
        // Electing new leaders (the metadata leader too, when it was the lost node) takes
        // 2.9 a few seconds, sometimes more on 2 busy cores.
        Duration::from_secs(60),
        || {
            let by = events_by_observer(&events.snapshot());
            let recovered = |id: u64| {
                ["obs-a", "obs-b"].iter().all(|o| {
                    by.get(*o).is_some_and(|evs| {
                        evs.iter()
                            .any(|(_, e)| e["event"] == json!("recover") && e["id"] == json!(id))
                    })
                })
            };
            (suspected(3) && suspected(4) && recovered(1) && recovered(2)).then_some(())
        },
    );
    println!(
        "{:>6.1} s after the crash: the events seen",
        crashed_at.elapsed().as_secs_f64()
    );
    // Every event each observer took from its agent is on the stream once: its counters
    // (events taken, resync markers) against the contiguous sequence numbers seen.
    let mut last_state = String::new();
    let counts = wait_for(
        "the observers' counters settle",
        Duration::from_secs(20),
        || {
            let by = events_by_observer(&events.snapshot());
            let live = live_observers_eventually(&net, rest)?;
            let state: Vec<String> = live
                .iter()
                .map(|o| {
                    let name = o["observer"].as_str().unwrap_or("?");
                    format!(
                        "{name}: events {} resyncs {} published {} buffered {} dropped {} seen {}",
                        o["events"],
                        o["resyncs"],
                        o["published"],
                        o["buffered"],
                        o["dropped"],
                        by.get(name).map_or(0, Vec::len)
                    )
                })
                .collect();
            let state = state.join("; ");
            if state != last_state {
                println!(
                    "{:>6.1} s after the crash: {state}",
                    crashed_at.elapsed().as_secs_f64()
                );
                last_state = state;
            }
            let settled: Vec<(String, u64)> = live
                .iter()
                .filter(|o| {
                    o["buffered"] == json!(0)
                        && o["published"]
                            == json!(o["events"].as_u64().unwrap() + o["resyncs"].as_u64().unwrap())
                })
                .filter_map(|o| {
                    let name = o["observer"].as_str().unwrap();
                    let expected = o["events"].as_u64()? + o["resyncs"].as_u64()?;
                    let seen = by.get(name).map_or(0, |e| e.len() as u64);
                    (seen == expected).then(|| (name.to_string(), expected))
                })
                .collect();
            (settled.len() == 2).then_some(settled)
        },
    );
    let by = events_by_observer(&events.snapshot());
    for (name, expected) in &counts {
        assert_eq!(assert_contiguous(name, &by[name]), *expected, "{name}");
    }
    // After a node crash nats-server 2.9 elects new stream and metadata leaders; on a loaded
    // 2-core machine that has taken over 30 s. The claim here is that nothing is lost, not
    // how fast the cluster recovers, so the bounds are generous.
    let live = wait_for("the cluster answers", Duration::from_secs(60), || {
        live_observers_eventually(&net, rest)
    });
    println!(
        "{:>6.1} s after the crash: the counters settled, the cluster answers",
        crashed_at.elapsed().as_secs_f64()
    );
    for o in live {
        assert_eq!(o["dropped"], json!(0), "{o}");
    }
    let reply = wait_for(
        "peers 3 and 4 down at quorum 2",
        Duration::from_secs(60),
        || {
            let t = Instant::now();
            let r = net.fleet(rest, &["query", "suspects", "--quorum", "2"]);
            if r["ok"] != json!(true) || suspect_ids(&r) != vec![3, 4] {
                println!(
                    "{:>6.1} s after the crash: query suspects (took {:?}): {r}",
                    crashed_at.elapsed().as_secs_f64(),
                    t.elapsed()
                );
            }
            (r["ok"] == json!(true) && suspect_ids(&r) == vec![3, 4]).then_some(r)
        },
    );
    println!(
        "{:>6.1} s after the crash: peers 3 and 4 down at quorum 2",
        crashed_at.elapsed().as_secs_f64()
    );
    assert_eq!(reply["live_observers"], json!(2), "{reply}");
    // The quorum watch, which follows the bucket, came through too: its last word on each
    // peer is the fleet's.
    wait_for(
        "watch reports peers 3 and 4 down, 1 and 2 up",
        Duration::from_secs(20),
        || {
            let lines = judged.snapshot();
            let last = |id: u64| {
                lines
                    .iter()
                    .rev()
                    .find(|l| l["id"] == json!(id))
                    .map(|l| l["event"].clone())
            };
            (last(1) == Some(json!("up"))
                && last(2) == Some(json!("up"))
                && last(3) == Some(json!("down"))
                && last(4) == Some(json!("down")))
            .then_some(())
        },
    );
    println!(
        "{:>6.1} s after the crash: the quorum watch agrees: {:?}",
        crashed_at.elapsed().as_secs_f64(),
        judged
            .snapshot()
            .iter()
            .map(|l| format!("{} {}", l["event"], l["id"]))
            .collect::<Vec<_>>()
    );
    drop(observers);
}

struct DumpOnPanic<'a>(&'a dyn Fn());

impl Drop for DumpOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            (self.0)();
        }
    }
}

#[test]
fn a_burst_of_suspicions_is_published_and_consumed_whole() {
    require_root();
    let _serial = serial();
    const PEERS: u64 = 2000;
    let net = FleetNet::new(1);
    let _nats = NatsServer::start(&net.nats_ns, 4222);
    let o = &net.observers[0];
    // 2000 peers from one loadgen address: the share per source is lifted.
    let observer = Observer::start(
        o,
        &format!("nats://{}:4222", o.nats_addr),
        &["--admit-per-source", "unlimited"],
    );
    let events = net.watch(LOCAL, &["--events", "--from-start"]);
    // 2000 peers, then all of them silent at once.
    let loadgen = integration_tests::agent_process::spawn({
        let mut cmd = FleetNet::command_in(&net.senders_ns, &integration_tests::monitor_bin());
        cmd.args([
            "loadgen",
            "--to",
            &format!("{}:{DEFAULT_PORT}", o.addr),
            "--peers",
            &PEERS.to_string(),
            "--rate",
            "20",
            "--duration",
            "60s",
            "--kill",
            "1.0",
            "--after",
            "4s",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null());
        cmd
    });
    let suspects_at = |level: f64, evs: &[Value]| {
        evs.iter()
            .filter(|e| e["event"] == json!("suspect") && e["level"] == json!(level))
            .count() as u64
    };
    wait_for(
        "every peer's suspicion at 1, 3 and 8 on the stream",
        Duration::from_secs(40),
        || {
            let evs = events.snapshot();
            [1.0, 3.0, 8.0]
                .iter()
                .all(|&l| suspects_at(l, &evs) == PEERS)
                .then_some(())
        },
    );
    drop(loadgen);
    let by = events_by_observer(&events.snapshot());
    assert_contiguous("obs-a", &by["obs-a"]);
    let reply = net.fleet(LOCAL, &["query", "suspects", "--quorum", "1"]);
    assert_eq!(
        suspect_ids(&reply).len() as u64,
        PEERS,
        "verdicts in the bucket"
    );
    // The observer is live although the bucket now holds a verdict per peer: its liveness
    // is judged as of when the read began (a CI run judged it at the end of a long read and
    // found no live observer).
    let reply = net.fleet(LOCAL, &["query", "observers"]);
    let live = live_in(&reply);
    assert_eq!(live.len(), 1, "one live observer after the burst: {reply}");
    assert_eq!(live[0]["dropped"], json!(0), "{}", live[0]);
    let stats = observer.ask(json!({"op": "stats"})).expect("agent answers");
    assert_eq!(stats["stats"]["peers"], json!(PEERS));
}

/// A bucket of a mass outage is read whole through the server's flow control. A snapshot of
/// a few hundred verdicts never meets it (nats-server 2.9 asks a consumer for a flow-control
/// reply after about 1 MB), while a fleet's verdicts on 50,000 failed peers are tens of MB; a
/// reader that left a request unanswered would stall for good (docs/fleet.md, "Where a bucket
/// read ends"). 12,000 verdicts of one live observer (about 3 MB as the consumer delivers
/// them): every query sees them all.
#[test]
fn a_bucket_larger_than_flow_control_allows_unanswered_is_read_whole() {
    require_root();
    let _serial = serial();
    const VERDICTS: u64 = 12_000;
    let net = FleetNet::new(1);
    let _nats = NatsServer::start(&net.nats_ns, 4222);
    let o = &net.observers[0];
    let _observer = Observer::start(o, &format!("nats://{}:4222", o.nats_addr), &[]);
    wait_for("a live observer", Duration::from_secs(20), || {
        (live_observers(&net, LOCAL).len() == 1).then_some(())
    });
    // Verdicts of obs-a's on peers it does not watch: the reader cannot tell them from its
    // own, and obs-a rewrites only its liveness meanwhile.
    let verdict = forged_verdict();
    let messages = (0..VERDICTS)
        .map(|i| {
            (
                format!("$KV.heartbeat-verdicts.{}.{}", 100_000 + i, o.name),
                verdict.clone(),
            )
        })
        .collect();
    net.publish_many_raw(4222, messages);
    let mut reads = 0;
    wait_for(
        "every verdict in a query's snapshot",
        Duration::from_secs(60),
        || {
            reads += 1;
            let reply = net.fleet(LOCAL, &["query", "suspects", "--quorum", "1"]);
            assert_eq!(reply["ok"], json!(true), "{reply}");
            (suspect_ids(&reply).len() as u64 == VERDICTS).then_some(())
        },
    );
    // Stored once, read whole every time after.
    for _ in 0..3 {
        let reply = net.fleet(LOCAL, &["query", "suspects", "--quorum", "1"]);
        assert_eq!(
            suspect_ids(&reply).len() as u64,
            VERDICTS,
            "a later read of the same bucket"
        );
    }
    println!("{VERDICTS} verdicts read whole after {reads} queries");
}

/// One suspect event as a consumer in the NATS namespace received it.
struct Received {
    id: u64,
    level: f64,
    crossed_at: f64,
    received_ms: f64,
    seq: u64,
}

/// Follows the stream from now in a thread of its own (entered into the NATS namespace),
/// through the library `monitor fleet` uses, stamping each suspect event on receipt.
fn follow(
    nats_ns: &str,
) -> (
    std::sync::Arc<Mutex<Vec<Received>>>,
    std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    };
    let got = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let (sink, halt, ns) = (got.clone(), stop.clone(), nats_ns.to_string());
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        integration_tests::fleet_net::enter_netns(&ns);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let fleet =
                monitor::fleet::consumer::Fleet::connect(&[LOCAL.to_string()], &Default::default())
                    .await
                    .expect("connect");
            let mut reader = fleet.events(false).await.expect("follow");
            ready_tx.send(()).unwrap();
            while !halt.load(Ordering::Relaxed) {
                let Ok(Some(Ok(raw))) =
                    tokio::time::timeout(Duration::from_millis(200), reader.next()).await
                else {
                    continue;
                };
                let received_ms = monitor::fleet::unix_ms();
                if let Ok(e) = raw.parse()
                    && e.kind == "suspect"
                {
                    sink.lock().unwrap().push(Received {
                        id: e.id.unwrap_or(0),
                        level: e.level.unwrap_or(0.0),
                        crossed_at: e.crossed_at.unwrap_or(f64::NAN),
                        received_ms,
                        seq: e.seq,
                    });
                }
            }
        });
    });
    ready_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("consumer ready");
    (got, stop)
}

fn percentile(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() as f64 - 1.0) * q).round() as usize]
}

fn loadgen_bg(
    net: &FleetNet,
    to: &str,
    args: &[&str],
) -> integration_tests::agent_process::ChildGuard {
    let mut cmd = FleetNet::command_in(&net.senders_ns, &integration_tests::monitor_bin());
    cmd.args(["loadgen", "--to", to])
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null());
    integration_tests::agent_process::spawn(cmd)
}

/// The figures of docs/fleet.md and BENCHMARKS.md: fleet event latency (crossed_at to a
/// consumer of the stream) with 100 of 1000 peers killed, and 50,000 peers suspected at once
/// (150,000 suspect events at levels 1, 3 and 8) published and consumed without loss. A
/// measurement, not a check of timings:
/// `cargo test --release -p integration-tests --test fleet -- --ignored --nocapture fleet_figures`
#[test]
#[ignore = "a measurement (about a minute): run it with --ignored"]
fn fleet_figures() {
    require_root();
    let _serial = serial();
    let net = FleetNet::new(1);
    let _nats = NatsServer::start(&net.nats_ns, 4222);
    let o = &net.observers[0];
    // The burst's peers send at 2 Hz: a first interval of 500 ms keeps new peers from being
    // suspected while their windows fill.
    let observer = Observer::start(
        o,
        &format!("nats://{}:4222", o.nats_addr),
        // 51,000 peers from one loadgen address: the share per source is lifted.
        &[
            "--first-interval-ms",
            "500",
            "--admit-per-source",
            "unlimited",
        ],
    );
    let to = format!("{}:{DEFAULT_PORT}", o.addr);
    let (got, stop) = follow(&net.nats_ns);

    // Latency: 1000 peers at 10 Hz, the lowest 100 killed after 6 s.
    let small = loadgen_bg(
        &net,
        &to,
        &[
            "--peers",
            "1000",
            "--rate",
            "10",
            "--duration",
            "60s",
            "--kill",
            "0.1",
            "--after",
            "6s",
        ],
    );
    wait_for(
        "300 suspicions of the killed 100",
        Duration::from_secs(60),
        || (got.lock().unwrap().iter().filter(|r| r.id <= 100).count() >= 300).then_some(()),
    );
    let latency: Vec<f64> = got
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.id <= 100)
        .map(|r| r.received_ms - r.crossed_at)
        .collect();
    drop(small);
    std::thread::sleep(Duration::from_secs(3)); // the other 900 go silent too; let them pass
    // The burst: 50,000 more peers at 2 Hz, all killed at once after 10 s.
    const FIRST: u64 = 100_001;
    const BURST: u64 = 50_000;
    let burst = loadgen_bg(
        &net,
        &to,
        &[
            "--first-id",
            &FIRST.to_string(),
            "--peers",
            &BURST.to_string(),
            "--rate",
            "2",
            "--duration",
            "60s",
            "--kill",
            "1.0",
            "--after",
            "10s",
        ],
    );
    let done = wait_for(
        "150,000 suspicions consumed",
        Duration::from_secs(120),
        || {
            let g = got.lock().unwrap();
            (g.iter().filter(|r| r.id >= FIRST).count() as u64 >= 3 * BURST)
                .then(monitor::fleet::unix_ms)
        },
    );
    drop(burst);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let g = got.lock().unwrap();
    let b: Vec<&Received> = g.iter().filter(|r| r.id >= FIRST).collect();
    let first_crossed = b.iter().map(|r| r.crossed_at).fold(f64::INFINITY, f64::min);
    let first8 = b
        .iter()
        .filter(|r| r.level == 8.0)
        .map(|r| r.crossed_at)
        .fold(f64::INFINITY, f64::min);
    let last8_crossed = b
        .iter()
        .filter(|r| r.level == 8.0)
        .map(|r| r.crossed_at)
        .fold(0.0, f64::max);
    let last_received = b.iter().map(|r| r.received_ms).fold(0.0, f64::max);
    let burst_latency: Vec<f64> = b.iter().map(|r| r.received_ms - r.crossed_at).collect();
    let mut ids8: Vec<u64> = b.iter().filter(|r| r.level == 8.0).map(|r| r.id).collect();
    ids8.sort_unstable();
    ids8.dedup();
    let mut seqs: Vec<u64> = g.iter().map(|r| r.seq).collect();
    seqs.sort_unstable();
    let live = live_observers(&net, LOCAL);
    let figures = json!({
        "latency_ms_1000_peers_100_killed": {"n": latency.len(), "p50": percentile(latency.clone(), 0.5), "p99": percentile(latency.clone(), 0.99), "max": percentile(latency, 1.0)},
        "burst": {
            "peers": BURST, "suspect_events": b.len(), "distinct_peers_at_8": ids8.len(),
            "first_crossing_to_last_consumed_ms": last_received - first_crossed,
            "level8_crossings_spread_ms": last8_crossed - first8,
            "last_level8_crossing_to_last_consumed_ms": last_received - last8_crossed,
            "latency_ms": {"p50": percentile(burst_latency.clone(), 0.5), "p99": percentile(burst_latency.clone(), 0.99), "max": percentile(burst_latency, 1.0)},
            "consumer_done_at_minus_last_received_ms": done - last_received,
        },
        "observer": live.first(),
    });
    println!("FLEET-FIGURES {figures}");
    assert_eq!(
        ids8.len() as u64,
        BURST,
        "every burst peer reached level 8 on the stream"
    );
    drop(observer);
}
