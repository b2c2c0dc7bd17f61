//! A pair of FRR bfdd daemons for the demo: one BFD session across the demo's veth pair, so the
//! agent has a peer it did not have to ask for (`monitor run --bfd`). Each side runs zebra and
//! bfdd in its namespace with a pathspace of its own (`-N`), all files in a temporary
//! directory; dropping the pair stops the daemons (by PID) and removes the files.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::lab::{NetPair, Process, TempDir};

const ZEBRA: &str = "/usr/lib/frr/zebra";
const BFDD: &str = "/usr/lib/frr/bfdd";
/// FRR creates its run directory per pathspace here whatever the flags say.
const FRR_RUN: &str = "/var/run/frr";

/// One side: its daemons (dropped first) and its directories.
struct Side {
    bfdd: Option<Process>,
    _zebra: Process,
    dir: PathBuf,
    run_dir: PathBuf,
}

impl Drop for Side {
    fn drop(&mut self) {
        // The daemons stop first (Process's drop), then the directories go.
        self.bfdd.take();
        let _ = fs::remove_dir_all(&self.run_dir);
    }
}

pub struct BfdPair {
    monitor_side: Side,
    peers_side: Side,
    _dir: TempDir,
}

impl BfdPair {
    /// A single-hop session between the two ends of `net` at `interval_ms` x 3.
    pub fn start(net: &NetPair, interval_ms: u32) -> Result<Self> {
        let dir = TempDir::create("hbm-demo-frr")?;
        let side = |name: &str, ns: &str, local: &str, peer: &str| {
            start_side(&dir.0, name, ns, local, peer, interval_ms)
        };
        let monitor_side = side(
            "hbm-demo-bfd-mon",
            net.ns_monitor,
            net.addr_monitor,
            net.addr_peers,
        )?;
        // bfdd seeds its discriminator with the time in seconds: start the other side in
        // another second, so the two directions are told apart.
        let started = unix_second();
        while unix_second() == started {
            std::thread::sleep(Duration::from_millis(20));
        }
        let peers_side = side(
            "hbm-demo-bfd-peer",
            net.ns_peers,
            net.addr_peers,
            net.addr_monitor,
        )?;
        Ok(Self {
            monitor_side,
            peers_side,
            _dir: dir,
        })
    }

    /// Waits until the monitor side's bfdd reports the session Up.
    pub fn wait_up(&self, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let out = vtysh(&self.monitor_side.dir, "show bfd peers brief").unwrap_or_default();
            if out.contains(" up ") {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the BFD session did not come up within {limit:?}: {out}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What the monitor side's bfdd says about the session (`show bfd peers brief`).
    pub fn monitor_side_view(&self) -> Result<String> {
        vtysh(&self.monitor_side.dir, "show bfd peers brief")
    }

    /// Stops the peers' side bfdd (SIGTERM: FRR sends no AdminDown, so it looks like a crash).
    pub fn stop_peers_bfdd(&mut self) {
        self.peers_side.bfdd.take();
    }
}

fn start_side(
    root: &Path,
    name: &str,
    ns: &str,
    local: &str,
    peer: &str,
    interval_ms: u32,
) -> Result<Side> {
    let dir = root.join(name);
    fs::create_dir_all(&dir)?;
    let run_dir = Path::new(FRR_RUN).join(name);
    fs::create_dir_all(&run_dir)
        .with_context(|| format!("creating {} (is FRR installed?)", run_dir.display()))?;
    fs::write(dir.join("zebra.conf"), "!\n")?;
    fs::write(
        dir.join("bfdd.conf"),
        format!(
            "bfd\n peer {peer} local-address {local}\n  detect-multiplier 3\n  \
             receive-interval {interval_ms}\n  transmit-interval {interval_ms}\n !\n!\n"
        ),
    )?;
    let daemon = |program: &str, conf: &str, extra: &[String]| {
        let mut cmd = NetPair::in_ns(ns, Path::new(program));
        cmd.args(["-N", name])
            .arg("-f")
            .arg(dir.join(conf))
            .arg("-i")
            .arg(dir.join(format!("{conf}.pid")))
            .arg("-z")
            .arg(dir.join("zserv.api"))
            .arg("--vty_socket")
            .arg(&dir)
            .args(["-P", "0", "-u", "root", "-g", "frrvty"])
            .arg("--log")
            .arg(format!(
                "file:{}",
                dir.join(format!("{conf}.log")).display()
            ))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        Process::spawn(&mut cmd)
    };
    let zebra = daemon(ZEBRA, "zebra.conf", &[])?;
    wait_answers(&dir, "zebra")?;
    let ctl = dir.join("bfdd.sock").display().to_string();
    let bfdd = daemon(BFDD, "bfdd.conf", &["--bfdctl".into(), ctl])?;
    wait_answers(&dir, "bfdd")?;
    Ok(Side {
        bfdd: Some(bfdd),
        _zebra: zebra,
        dir,
        run_dir,
    })
}

fn wait_answers(dir: &Path, daemon: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = Command::new("vtysh")
            .arg("--vty_socket")
            .arg(dir)
            .args(["-d", daemon, "-c", "show version"])
            .stdin(Stdio::null())
            .output();
        if out.is_ok_and(|o| o.status.success()) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("FRR's {daemon} did not come up (logs in {})", dir.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn vtysh(dir: &Path, command: &str) -> Result<String> {
    let out = Command::new("vtysh")
        .arg("--vty_socket")
        .arg(dir)
        .args(["-d", "bfdd", "-c", command])
        .stdin(Stdio::null())
        .output()?;
    if !out.status.success() {
        bail!("vtysh: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn unix_second() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
