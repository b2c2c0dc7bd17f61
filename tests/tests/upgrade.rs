//! Live upgrades of pinned state: an agent of another build adopting pinned state swaps its
//! own program into the pinned XDP link (BPF_LINK_UPDATE, no detach), keeps every map and
//! loses no heartbeat; pinned state whose maps it could not run on is refused, touching
//! nothing; and --persist is refused where the agent would have to mount bpffs in a mount
//! namespace of its own, whose pins would end with it.
//!
//! Two builds of the program: the `monitor` under test, and a second copy of it built by
//! `variant_bin` with `MONITOR_EBPF_VARIANT=1`, which changes one constant on a path the
//! program never takes (monitor-ebpf's `UNREACHABLE_VERDICT`). The second build's program
//! therefore has other instructions, hence another kernel tag, with the same maps and the same
//! behaviour: what a real upgrade that changes code but no layout looks like to the kernel.
//! The copy is built once in its own target directory (`<target>/upgrade-variant`, the first
//! time a few minutes, later only what changed) so the tested binary is never rebuilt under
//! the other tests; `MONITOR_VARIANT_BIN` names a prebuilt one instead.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use aya::{
    maps::MapData,
    programs::links::{FdLink, PinnedLink},
};
use integration_tests::{
    agent_process::{
        AgentProcess, Bpffs, TempDir, detach, refused_start, sender, spawn, xdp_attached,
    },
    monitor_bin,
    netns::NetnsPair,
    require_root, wait_for,
};
use monitor_common::maps::{AUTH_KEYS_MAP, COUNTERS_MAP};
use serde_json::{Value, json};

/// The second build of `monitor` (see the module's comment).
fn variant_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("MONITOR_VARIANT_BIN") {
        return path.into();
    }
    // monitor_bin() is <target>/<profile>/monitor.
    let target = monitor_bin()
        .parent()
        .and_then(Path::parent)
        .expect("<target>/<profile>/monitor")
        .join("upgrade-variant");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    seed_from_tested_build(
        monitor_bin().parent().expect("<target>/<profile>"),
        &target.join("debug"),
    );
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(["build", "-p", "monitor", "--bin", "monitor"])
        .current_dir(&workspace)
        .env("CARGO_TARGET_DIR", &target)
        .env("MONITOR_EBPF_VARIANT", "1")
        .stdin(Stdio::null())
        .output()
        .expect("spawn cargo build");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "building the second build of monitor: {stderr}"
    );
    assert!(
        !stderr.contains("bpf-linker not on PATH"),
        "the second build has no XDP program: put bpf-linker on PATH (cargo xtask test does)"
    );
    target.join("debug").join("monitor")
}

/// Gives a new variant target directory the libraries the tested build already compiled, with
/// their fingerprints (copies, times kept, so that neither build ever writes into the other's
/// files): both builds are `cargo build -p monitor` with the same features, so cargo then
/// rebuilds only what the variant changes (monitor's build script and the crate), where a
/// fresh clone would otherwise compile every dependency a second time.
fn seed_from_tested_build(tested: &Path, variant: &Path) {
    if variant.exists() {
        return;
    }
    // Copied beside it and renamed into place: a copy cut short (a killed run) is never taken
    // for a seeded directory.
    let staging = variant.with_extension("seeding");
    let _ = std::fs::remove_dir_all(&staging);
    let deps = staging.join("deps");
    std::fs::create_dir_all(&deps).unwrap();
    // Libraries and their dep-info only: the test and binary executables are big and unused.
    let libraries: Vec<PathBuf> = std::fs::read_dir(tested.join("deps"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .is_some_and(|e| ["rlib", "rmeta", "so", "d"].iter().any(|x| e == *x))
        })
        .collect();
    for (what, sources, into) in [
        ("libraries", libraries, deps),
        (
            "build scripts and fingerprints",
            vec![tested.join("build"), tested.join(".fingerprint")],
            staging.clone(),
        ),
    ] {
        let status = Command::new("cp")
            .arg("-a")
            .args(&sources)
            .arg(&into)
            .status()
            .expect("spawn cp");
        assert!(status.success(), "copying the tested build's {what}");
    }
    std::fs::rename(&staging, variant).unwrap();
}

/// A script in `dir` that runs `bin` with only the capabilities the systemd unit leaves the
/// agent (packaging/systemd: CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN): adopting and upgrading
/// must not need more, e.g. CAP_SYS_ADMIN for opening a program by id.
fn with_unit_capabilities(bin: &Path, dir: &TempDir, name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.0.join(name);
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nexec setpriv --bounding-set=-all,+bpf,+perfmon,+net_admin {} \"$@\"\n",
            bin.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

/// The tag (as bpftool prints it) of the program the link pinned at `pins/link` runs, read
/// with aya, independently of the agent's code.
fn linked_tag(pins: &Path) -> String {
    let link: FdLink = PinnedLink::from_pin(pins.join("link")).unwrap().into();
    let id = link.info().unwrap().program_id();
    let program = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .find(|p| p.id() == id)
        .expect("the linked program is loaded");
    format!("{:016x}", program.tag())
}

/// The kernel's id of the link pinned at `pins/link`: an update keeps it, a detach and a new
/// attach would not.
fn link_id(pins: &Path) -> u32 {
    let link: FdLink = PinnedLink::from_pin(pins.join("link")).unwrap().into();
    link.info().unwrap().id()
}

fn peer(agent: &AgentProcess, id: u64) -> Value {
    agent.ask(json!({"op": "peer", "id": id}))["peer"].clone()
}

fn stats(agent: &AgentProcess) -> Value {
    agent.ask(json!({"op": "stats"}))["stats"].clone()
}

#[test]
fn a_newer_build_swaps_its_program_into_the_pinned_link_keeping_every_map_and_heartbeat() {
    require_root();
    let pair = NetnsPair::new(63);
    let fs = Bpffs::mount();
    let pins = fs.0.0.join("agent");
    let pins_arg = pins.display().to_string();
    let dir = TempDir::new("hbmpeers");
    let peers = dir.peers_file([7]);
    let old_build = with_unit_capabilities(&variant_bin(), &dir, "old");
    let new_build = with_unit_capabilities(&monitor_bin(), &dir, "new");
    let args = [
        "--peers",
        &peers,
        "--pin-path",
        &pins_arg,
        "--sweep-interval",
        "10ms",
    ];

    let first = AgentProcess::start_bin(&old_build, &pair, &args);
    let old = stats(&first)["program"].clone();
    assert_eq!(old["start"], json!("loaded"), "{old}");
    let old_tag = old["tag"].as_str().unwrap().to_string();
    assert_eq!(linked_tag(&pins), old_tag);
    let link = link_id(&pins);

    // One sender throughout: before, across the stop, the new agent's start and the swap,
    // and after. Sequence numbers from 0, one incarnation: heartbeats == last_seq + 1 means
    // the kernel recorded every one that was sent.
    let mut send = spawn(sender(&pair, 7, "5ms", &["--incarnation", "1"]));
    let before = wait_for(
        Duration::from_secs(20),
        "heartbeats before the upgrade",
        || {
            let p = peer(&first, 7);
            (p["heartbeats"].as_u64().unwrap() >= 100).then_some(p)
        },
    );
    assert!(first.stop().success());
    assert!(xdp_attached(&pair), "the program outlives its agent");

    let second = AgentProcess::start_bin(&new_build, &pair, &args);
    let new = stats(&second)["program"].clone();
    assert_eq!(new["start"], json!("upgraded"), "{new}");
    assert_eq!(new["previous_tag"], json!(old_tag), "{new}");
    let new_tag = new["tag"].as_str().unwrap().to_string();
    assert_ne!(new_tag, old_tag, "two builds of the program, two tags");
    assert_eq!(
        linked_tag(&pins),
        new_tag,
        "the pinned link runs the new build's program"
    );
    assert_eq!(
        link_id(&pins),
        link,
        "the same link, updated in place: never detached"
    );
    assert!(xdp_attached(&pair));
    assert_eq!(stats(&second)["xdp_mode"], json!("adopted"));
    let out = Command::new(monitor_bin())
        .arg("query")
        .arg("--socket")
        .arg(second.socket())
        .arg("stats")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("upgraded: tag {old_tag} -> {new_tag}")),
        "{text}"
    );

    // The new program records into the same slot: the count goes on from where it was.
    let after = peer(&second, 7);
    let (h0, h1) = (
        before["heartbeats"].as_u64().unwrap(),
        after["heartbeats"].as_u64().unwrap(),
    );
    assert!(h1 > h0, "the slot kept its heartbeats: {h0} -> {h1}");
    assert_eq!(after["samples"], json!(128), "the window was kept: {after}");
    let later = wait_for(
        Duration::from_secs(20),
        "heartbeats recorded by the new program",
        || {
            let p = peer(&second, 7);
            (p["heartbeats"].as_u64().unwrap() >= h1 + 100).then_some(p)
        },
    );
    assert_eq!(later["incarnation"], json!(1), "{later}");

    // Stop sending; once the count settles, every heartbeat sent is accounted for.
    let _ = send.0.kill();
    let _ = send.0.wait();
    let mut last = u64::MAX;
    let settled = wait_for(Duration::from_secs(10), "the count to settle", || {
        let p = peer(&second, 7);
        let h = p["heartbeats"].as_u64().unwrap();
        let same = h == last;
        last = h;
        // Two reads 20 ms apart at a 5 ms interval: nothing more is coming.
        same.then_some(p)
    });
    let heartbeats = settled["heartbeats"].as_u64().unwrap();
    let last_seq = settled["last_seq"].as_u64().unwrap();
    assert_eq!(
        heartbeats,
        last_seq + 1,
        "no heartbeat lost across the swap: {settled}"
    );
    assert_eq!(settled["lost"], json!(0), "{settled}");
    assert_eq!(settled["duplicates"], json!(0), "{settled}");
    assert_eq!(settled["out_of_order"], json!(0), "{settled}");
    let kernel = &stats(&second)["kernel"];
    assert_eq!(kernel["heartbeats"], json!(heartbeats), "{kernel}");
    assert_eq!(kernel["malformed"], json!(0), "{kernel}");
    assert_eq!(kernel["unknown_peer"], json!(0), "{kernel}");

    // The next start of the same build adopts the program as it is.
    assert!(second.stop().success());
    let third = AgentProcess::start_bin(&new_build, &pair, &args);
    let same = stats(&third)["program"].clone();
    assert_eq!(same["start"], json!("adopted"), "{same}");
    assert_eq!(same["tag"], json!(new_tag), "{same}");
    assert_eq!(peer(&third, 7)["heartbeats"], json!(heartbeats));
    assert!(third.stop().success());

    // Going back is the same swap the other way.
    let back = AgentProcess::start_bin(&old_build, &pair, &args);
    let program = stats(&back)["program"].clone();
    assert_eq!(program["start"], json!("upgraded"), "{program}");
    assert_eq!(program["tag"], json!(old_tag), "{program}");
    assert_eq!(program["previous_tag"], json!(new_tag), "{program}");
    assert_eq!(linked_tag(&pins), old_tag);
    assert_eq!(link_id(&pins), link);
    assert_eq!(peer(&back, 7)["heartbeats"], json!(heartbeats));
    assert!(back.stop().success());

    let out = detach(&pair, &pins_arg);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!xdp_attached(&pair));
    assert!(
        !pins.exists(),
        "detach removes every pin, the upgraded program's too"
    );
}

#[test]
fn pinned_state_whose_maps_this_build_cannot_run_on_is_refused_untouched() {
    require_root();
    let pair = NetnsPair::new(64);
    let fs = Bpffs::mount();
    let pins = fs.0.0.join("agent");
    let pins_arg = pins.display().to_string();
    let agent = AgentProcess::start(&pair, &["--pin-path", &pins_arg]);
    assert!(agent.stop().success());
    let tag = linked_tag(&pins);

    // Pretend another build laid AUTH_KEYS out otherwise: pin a map of another type and
    // value size in its place.
    std::fs::remove_file(pins.join(AUTH_KEYS_MAP)).unwrap();
    MapData::from_pin(pins.join(COUNTERS_MAP))
        .unwrap()
        .pin(pins.join(AUTH_KEYS_MAP))
        .unwrap();

    let err = refused_start(&pair, &["--pin-path", &pins_arg]);
    assert!(
        err.contains("its map AUTH_KEYS is")
            && err.contains("Keep running the build that pinned it")
            && err.contains(&format!("monitor detach --pin-path {pins_arg}")),
        "{err}"
    );
    assert!(xdp_attached(&pair), "refusing touches nothing");
    assert_eq!(linked_tag(&pins), tag, "the pinned program still runs");

    let out = detach(&pair, &pins_arg);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!xdp_attached(&pair));
}

#[test]
fn persist_is_refused_where_bpffs_would_be_mounted_in_a_private_mount_namespace() {
    require_root();
    let pair = NetnsPair::new(65);
    // `ip netns exec` gives the agent a mount namespace of its own with a fresh /sys, so
    // nothing is mounted on /sys/fs/bpf there: the agent would mount bpffs itself, and the
    // pins would end with it.
    let err = refused_start(&pair, &["--persist"]);
    assert!(
        err.contains("mount namespace of its own") && err.contains("--pin-path"),
        "{err}"
    );
    assert!(!xdp_attached(&pair), "nothing was attached");
}
