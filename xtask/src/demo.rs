//! A self-contained demo: two namespaces joined by a veth pair, the agent watching one end,
//! several senders on the other; one sender stops, its phi climbs through the levels, and it
//! recovers when restarted. A real BFD session (FRR's bfdd on both ends) is watched passively
//! beside them, and its peer's bfdd is stopped at the end. Everything created here is removed on
//! the way out, also on error or Ctrl-C.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::Result;
use clap::Args;

use crate::{
    build, frr,
    lab::{Interrupt, NetPair, Process, TempDir, wait_for_socket},
    setup, workspace,
};

const NET: NetPair = NetPair {
    ns_monitor: "hbm-demo-mon",
    ns_peers: "hbm-demo-peers",
    if_monitor: "hbmdemo0",
    if_peers: "hbmdemo1",
    addr_monitor: "10.213.0.1",
    addr_peers: "10.213.0.2",
};

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Number of heartbeat senders.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    peers: u64,
    /// Interval between each sender's heartbeats.
    #[arg(long, default_value = "100ms")]
    interval: String,
    /// Seconds to watch after one sender stops.
    #[arg(long, default_value_t = 3)]
    watch: u64,
}

pub fn run(args: &DemoArgs) -> Result<()> {
    setup::ensure()?;
    workspace::require_root("demo")?;
    build::build(false)?;
    let monitor = build::monitor_bin(false);
    let interrupt = Interrupt::install()?;

    step(&format!(
        "creating namespaces {} ({}) and {} ({}) joined by veth {}/{}",
        NET.ns_monitor,
        NET.addr_monitor,
        NET.ns_peers,
        NET.addr_peers,
        NET.if_monitor,
        NET.if_peers
    ));
    let net = NET.create()?;
    let dir = TempDir::create("hbm-demo")?;
    let socket = dir.0.join("agent.sock");

    step(&format!(
        "starting the agent: monitor run --iface {} --socket {} --bfd",
        net.if_monitor,
        socket.display()
    ));
    let agent = Process::spawn(
        NetPair::in_ns(net.ns_monitor, &monitor)
            .args(["run", "--iface", net.if_monitor, "--bfd", "--socket"])
            .arg(&socket),
    )?;
    wait_for_socket(&monitor, &socket, &agent)?;

    step("following events: monitor watch (its lines are prefixed with 'event:')");
    let watch = Process::spawn(
        Command::new(&monitor)
            .args(["watch", "--socket"])
            .arg(&socket)
            .stdout(Stdio::piped()),
    )?;
    watch.prefix_output("    event: ");

    let sender = |id: u64, extra: &[&str]| {
        Process::spawn(
            NetPair::in_ns(net.ns_peers, &monitor)
                .args(["send", "--to", &net.target(), "--id", &id.to_string()])
                .args(["--interval", &args.interval])
                .args(extra)
                .env("RUST_LOG", "warn"),
        )
    };
    let jitters = ["0ms", "5ms", "15ms", "30ms"];
    let mut senders = Vec::new();
    for id in 1..=args.peers {
        let jitter = jitters[(id as usize - 1) % jitters.len()];
        step(&format!(
            "peer {id}: monitor send --to {} --id {id} --interval {} --jitter {jitter}",
            net.target(),
            args.interval
        ));
        senders.push(sender(id, &["--jitter", jitter])?);
    }

    step(
        "starting FRR's bfdd on both ends, one BFD session at 100 ms x 3: the agent watches it \
         passively (--bfd), and the packets still reach bfdd",
    );
    let mut bfd = frr::BfdPair::start(&net, 100)?;
    bfd.wait_up(Duration::from_secs(20))?;

    step("letting heartbeats and BFD packets flow for 3 s");
    interrupt.pause(Duration::from_secs(3))?;
    show(&monitor, &socket, &["peers"])?;
    println!("$ vtysh -c 'show bfd peers brief'   (the monitor side's bfdd)");
    print!("{}", bfd.monitor_side_view()?);

    let victim = args.peers;
    step(&format!(
        "stopping peer {victim}: its phi climbs through the levels (1, 3, 8) while the others stay low"
    ));
    senders.pop().expect("at least one sender").stop();
    for _ in 0..args.watch {
        interrupt.pause(Duration::from_secs(1))?;
        show(&monitor, &socket, &["peers"])?;
    }
    show(&monitor, &socket, &["suspects"])?;

    step(&format!(
        "restarting peer {victim} with a new incarnation: it recovers"
    ));
    // Above the Unix-time default of the first run: a restart, not a replay.
    senders.push(sender(victim, &["--incarnation", &u32::MAX.to_string()])?);
    interrupt.pause(Duration::from_secs(1))?;
    show(&monitor, &socket, &["peers"])?;

    step(
        "stopping the peers' bfdd: the BFD session goes silent, its phi climbs, and bfdd on the \
         monitor side declares it down after 3 x 100 ms",
    );
    bfd.stop_peers_bfdd();
    interrupt.pause(Duration::from_secs(1))?;
    show(&monitor, &socket, &["peers", "--source", "bfd"])?;
    print!("{}", bfd.monitor_side_view()?);
    show(&monitor, &socket, &["stats"])?;

    step("cleaning up: stopping the watcher, senders, bfdd and agent, removing the namespaces");
    drop(watch);
    drop(senders);
    drop(bfd);
    agent.stop();
    Ok(())
}

fn step(text: &str) {
    println!("\n==> {text}");
}

fn show(monitor: &Path, socket: &Path, what: &[&str]) -> Result<()> {
    println!("$ monitor query {}", what.join(" "));
    workspace::run(
        Command::new(monitor)
            .arg("query")
            .arg("--socket")
            .arg(socket)
            .args(what),
    )
}
