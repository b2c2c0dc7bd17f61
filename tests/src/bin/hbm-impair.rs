//! Path impairment for `cargo xtask traces`: attaches the Gilbert-Elliott dropper
//! (`monitor-ebpf/src/impair.rs`) at TC egress of an interface, prints `{"attached":true}`,
//! and on SIGTERM or SIGINT detaches and prints what it did as one JSON line. Needs root; run
//! it inside the namespace that holds the interface.

use anyhow::{Context, Result};
use aya::{
    EbpfLoader,
    maps::Array,
    programs::{SchedClassifier, TcAttachType},
};
use clap::Parser;
use monitor::kernel::program::IMPAIR_OBJECT;
use monitor_common::impair::{GE_BAD, GE_DROPPED, GE_PASSED, GilbertElliott};

#[derive(Parser)]
#[command(
    name = "hbm-impair",
    about = "Drop UDP datagrams to one port at TC egress per a Gilbert-Elliott model"
)]
struct Cli {
    /// Interface whose egress is impaired.
    #[arg(long)]
    iface: String,
    /// UDP destination port the model applies to; other traffic passes.
    #[arg(long)]
    port: u16,
    /// P(good -> bad) per datagram.
    #[arg(long, default_value_t = 0.01)]
    to_bad: f64,
    /// P(bad -> good) per datagram.
    #[arg(long, default_value_t = 0.10)]
    to_good: f64,
    /// Loss probability in the good state.
    #[arg(long, default_value_t = 0.001)]
    loss_good: f64,
    /// Loss probability in the bad state.
    #[arg(long, default_value_t = 0.40)]
    loss_bad: f64,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    for (name, p) in [
        ("--to-bad", cli.to_bad),
        ("--to-good", cli.to_good),
        ("--loss-good", cli.loss_good),
        ("--loss-bad", cli.loss_bad),
    ] {
        anyhow::ensure!(
            (0.0..=1.0).contains(&p),
            "{name} {p}: a probability is in [0, 1]"
        );
    }
    anyhow::ensure!(
        !IMPAIR_OBJECT.is_empty(),
        "built without the eBPF programs (bpf-linker missing)"
    );
    let model = GilbertElliott {
        port: cli.port,
        _pad: 0,
        to_bad: GilbertElliott::fraction(cli.to_bad),
        to_good: GilbertElliott::fraction(cli.to_good),
        loss_good: GilbertElliott::fraction(cli.loss_good),
        loss_bad: GilbertElliott::fraction(cli.loss_bad),
    };
    // The signals are blocked before attaching, so one that arrives early is not lost.
    let signals = block_signals()?;
    let mut ebpf = EbpfLoader::new()
        .override_global("MODEL", &model, true)
        .load(IMPAIR_OBJECT)
        .context("loading the impairment program")?;
    let program: &mut SchedClassifier = ebpf
        .program_mut("impair")
        .context("no program `impair` in the object")?
        .try_into()?;
    program.load().context("verifying the impairment program")?;
    let link = program
        .attach(&cli.iface, TcAttachType::Egress)
        .with_context(|| format!("attaching at TC egress of {}", cli.iface))?;
    println!("{{\"attached\":true}}");

    let mut signal = 0;
    // SAFETY: a valid, initialised set; sigwait writes the signal number.
    unsafe { libc::sigwait(&signals, &mut signal) };

    let state: Array<_, u64> = Array::try_from(ebpf.map("GE_STATE").context("no GE_STATE")?)?;
    let passed = state.get(&GE_PASSED, 0)?;
    let dropped = state.get(&GE_DROPPED, 0)?;
    let bad = state.get(&GE_BAD, 0)?;
    let program: &mut SchedClassifier = ebpf.program_mut("impair").expect("loaded").try_into()?;
    program.detach(link)?;
    println!("{{\"passed\":{passed},\"dropped\":{dropped},\"bad_at_exit\":{bad}}}");
    Ok(())
}

fn block_signals() -> Result<libc::sigset_t> {
    // SAFETY: plain libc calls on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            anyhow::bail!("blocking SIGTERM and SIGINT");
        }
        Ok(set)
    }
}
