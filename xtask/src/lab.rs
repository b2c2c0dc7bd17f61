//! The pieces the demo and the benchmark share: a pair of network namespaces joined by a veth
//! pair, child processes that are stopped on drop, a temporary directory, and waiting for the
//! agent's socket. Everything here cleans up after itself, also on error or Ctrl-C.

use std::{
    io::{BufRead, BufReader},
    os::fd::AsFd,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::workspace;

/// Names and addresses of two namespaces joined by a veth pair. Plain data (usable in a
/// const); `create` makes them and returns the guard that removes them.
#[derive(Debug, Clone, Copy)]
pub struct NetPair {
    /// Where the agent runs.
    pub ns_monitor: &'static str,
    /// Where the senders run.
    pub ns_peers: &'static str,
    pub if_monitor: &'static str,
    pub if_peers: &'static str,
    pub addr_monitor: &'static str,
    pub addr_peers: &'static str,
}

impl NetPair {
    /// Creates the pair, first removing a leftover of the same names (ours by name).
    pub fn create(self) -> Result<NetGuard> {
        let template = self;
        template.remove();
        let ip = |args: &[&str]| workspace::run(Command::new("ip").args(args));
        ip(&["netns", "add", template.ns_monitor])?;
        ip(&["netns", "add", template.ns_peers])?;
        ip(&[
            "link",
            "add",
            template.if_monitor,
            "netns",
            template.ns_monitor,
            "type",
            "veth",
            "peer",
            "name",
            template.if_peers,
            "netns",
            template.ns_peers,
        ])?;
        for (ns, iface, addr) in [
            (
                template.ns_monitor,
                template.if_monitor,
                template.addr_monitor,
            ),
            (template.ns_peers, template.if_peers, template.addr_peers),
        ] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", iface])?;
            ip(&["-n", ns, "link", "set", iface, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(NetGuard(template))
    }

    fn remove(&self) {
        for ns in [self.ns_monitor, self.ns_peers] {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
        }
    }

    /// `program` run inside namespace `ns`.
    pub fn in_ns(ns: &str, program: &Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns]).arg(program);
        cmd
    }

    /// The heartbeat destination, ADDR:PORT.
    pub fn target(&self) -> String {
        format!("{}:18498", self.addr_monitor)
    }
}

/// Created namespaces; removed on drop.
pub struct NetGuard(NetPair);

impl std::ops::Deref for NetGuard {
    type Target = NetPair;

    fn deref(&self) -> &NetPair {
        &self.0
    }
}

impl Drop for NetGuard {
    fn drop(&mut self) {
        self.0.remove();
    }
}

/// A directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn create(tag: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process stopped with SIGTERM (then killed) on drop.
pub struct Process(Option<Child>);

impl Process {
    pub fn spawn(cmd: &mut Command) -> Result<Self> {
        let child = cmd
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {cmd:?}"))?;
        Ok(Self(Some(child)))
    }

    pub fn pid(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }

    pub fn exited(&self) -> bool {
        // A zombie or a missing /proc entry: the child is gone.
        self.0.as_ref().is_none_or(|child| {
            std::fs::read_to_string(format!("/proc/{}/stat", child.id()))
                .map_or(true, |s| s.split_whitespace().nth(2) == Some("Z"))
        })
    }

    /// Prints the child's piped stdout line by line behind `prefix`.
    pub fn prefix_output(&self, prefix: &'static str) {
        let Some(stdout) = self.0.as_ref().and_then(|c| c.stdout.as_ref()) else {
            return;
        };
        // A dup of the pipe, so the reader thread owns its end without taking the Child's.
        let Ok(fd) = stdout.as_fd().try_clone_to_owned() else {
            return;
        };
        std::thread::spawn(move || {
            for line in BufReader::new(std::fs::File::from(fd)).lines() {
                let Ok(line) = line else { break };
                println!("{prefix}{line}");
            }
        });
    }

    /// Reads one line of the child's piped stdout.
    pub fn read_line(&mut self) -> Result<String> {
        let stdout = self
            .0
            .as_mut()
            .and_then(|c| c.stdout.as_mut())
            .context("stdout not piped")?;
        let mut line = String::new();
        let mut byte = [0u8; 1];
        // Byte by byte: a BufReader would swallow lines that a later call needs.
        while std::io::Read::read(stdout, &mut byte)? == 1 && byte[0] != b'\n' {
            line.push(byte[0] as char);
        }
        Ok(line)
    }

    /// Waits for the child to exit by itself and returns its whole remaining stdout.
    pub fn finish(mut self) -> Result<String> {
        let child = self.0.take().context("already stopped")?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("exited with {}", out.status);
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub fn stop(mut self) {
        self.terminate();
    }

    fn terminate(&mut self) {
        let Some(mut child) = self.0.take() else {
            return;
        };
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.terminate();
    }
}

/// Waits until the agent answers on `socket`, failing if it exits first.
pub fn wait_for_socket(monitor: &Path, socket: &Path, agent: &Process) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if agent.exited() {
            bail!("the agent exited during start-up (see its log above)");
        }
        let ok = Command::new(monitor)
            .args(["query", "--socket"])
            .arg(socket)
            .arg("stats")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!(
        "the agent did not answer on {} within 30 s",
        socket.display()
    )
}

/// Ctrl-C and SIGTERM turn into an error at the next pause, so drops clean everything up.
pub struct Interrupt(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Interrupt {
    pub fn install() -> Result<Self> {
        let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            signal_hook::flag::register(signal, flag.clone())?;
        }
        Ok(Self(flag))
    }

    pub fn check(&self) -> Result<()> {
        if self.0.load(std::sync::atomic::Ordering::Relaxed) {
            bail!("interrupted");
        }
        Ok(())
    }

    /// Sleeps `d`, failing early if interrupted.
    pub fn pause(&self, d: Duration) -> Result<()> {
        let end = Instant::now() + d;
        while Instant::now() < end {
            self.check()?;
            std::thread::sleep(
                Duration::from_millis(50).min(end.saturating_duration_since(Instant::now())),
            );
        }
        Ok(())
    }
}
