//! Makes a machine ready to build and test, idempotently; each step checks before it acts.
//!
//! 0. rustfmt and clippy on the stable toolchain, for `cargo xtask lint`.
//! 1. A nightly toolchain with rust-src (the XDP program is built with `-Z build-std=core`).
//! 2. bpf-linker, built against the nightly's own libLLVM (no packaged LLVM has the BPF
//!    target here), installed under target/tools so nothing global is assumed.
//! 3. iproute2 (`ip`, `tc`, `ss`), for namespaces and veth pairs in the tests and the demo.
//! 4. iperf3, the cross traffic of `cargo xtask traces`.
//! 5. cargo-deb under target/tools, and lintian, for `cargo xtask package` and its test.

use std::{fs, os::unix::fs::symlink, path::Path, process::Command};

use anyhow::{Context, Result, bail};

use crate::workspace::{self, output, tools_dir};

/// The bpf-linker release this project builds with.
const BPF_LINKER_VERSION: &str = "0.13.0";

pub fn run() -> Result<()> {
    ensure()?;
    println!("setup: ready");
    Ok(())
}

/// What every other task calls first: cheap checks, work only where something is missing.
pub fn ensure() -> Result<()> {
    ensure_components(&["rustfmt", "clippy"])?;
    ensure_nightly()?;
    ensure_bpf_linker()?;
    ensure_cargo_fuzz()?;
    ensure_cargo_deb()?;
    ensure_package("ip", &["-V"], "iproute2")?;
    ensure_package("iperf3", &["--version"], "iperf3")?;
    // tests/tests/metrics.rs: promtool and a real Prometheus server.
    ensure_package("promtool", &["--version"], "prometheus")?;
    // tests/tests/packaging.rs: the unit, the man pages, the agent with the unit's capabilities.
    ensure_package("systemd-analyze", &["--version"], "systemd")?;
    ensure_package("man", &["--version"], "man-db")?;
    ensure_package("groff", &["--version"], "groff-base")?;
    ensure_package("systemd-nspawn", &["--version"], "systemd-container")?;
    // tests/tests/fleet.rs: real JetStream servers (a 3-node cluster among them).
    ensure_package("nats-server", &["--version"], "nats-server")?;
    // tests/tests/top.rs: `monitor top` driven in a real terminal.
    ensure_package("tmux", &["-V"], "tmux")?;
    ensure_package("setpriv", &["--version"], "util-linux")?;
    // tests/tests/bfd.rs: real FRR zebra, bfdd and vtysh (integration_tests::frr); vtysh has no
    // --version, bfdd does.
    ensure_package("/usr/lib/frr/bfdd", &["--version"], "frr")?;
    // tests/tests/senders.rs: the example senders in C and Python (examples/).
    ensure_package("cc", &["--version"], "gcc")?;
    // tests/tests/consumers.rs: a real HAProxy (agent-check) and a keepalived VRRP pair.
    ensure_package("haproxy", &["-v"], "haproxy")?;
    ensure_package("keepalived", &["--version"], "keepalived")?;
    ensure_package("python3", &["--version"], "python3")?;
    // `cargo xtask package` and tests/tests/deb_package.rs: the .deb checked by lintian.
    ensure_package("lintian", &["--version"], "lintian")
}

/// Components of the stable toolchain (rustup's minimal profile has neither rustfmt nor
/// clippy).
fn ensure_components(names: &[&str]) -> Result<()> {
    let installed = output(rustup().args(["component", "list", "--installed"]))?;
    for name in names {
        if !installed
            .lines()
            .any(|l| l.starts_with(&format!("{name}-")))
        {
            println!("setup: adding {name} to the stable toolchain");
            workspace::run(rustup().args(["component", "add", name]))?;
        }
    }
    Ok(())
}

fn rustup() -> Command {
    workspace::command("rustup")
}

fn ensure_nightly() -> Result<()> {
    let toolchains = output(rustup().args(["toolchain", "list"]))?;
    if !toolchains.lines().any(|l| l.starts_with("nightly")) {
        println!("setup: installing the nightly toolchain (minimal, with rust-src)");
        workspace::run(rustup().args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
            "--component",
            "rust-src",
        ]))?;
    }
    let components =
        output(rustup().args(["component", "list", "--toolchain", "nightly", "--installed"]))?;
    if !components.lines().any(|l| l.starts_with("rust-src")) {
        println!("setup: adding rust-src to nightly");
        workspace::run(rustup().args(["component", "add", "rust-src", "--toolchain", "nightly"]))?;
    }
    Ok(())
}

/// `rustc +nightly -vV`: identifies the nightly, and with it its LLVM.
fn nightly_version() -> Result<String> {
    output(workspace::command("rustc").args(["+nightly", "-vV"]))
}

fn ensure_bpf_linker() -> Result<()> {
    let tools = tools_dir();
    let linker = tools.join("bin").join("bpf-linker");
    let stamp = tools.join("bpf-linker.stamp");
    let version = nightly_version()?;
    let wanted_stamp = format!("bpf-linker {BPF_LINKER_VERSION}\n{version}");
    let works = Command::new(&linker)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if works && fs::read_to_string(&stamp).is_ok_and(|s| s == wanted_stamp) {
        return Ok(());
    }

    let major = version
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .context("`rustc +nightly -vV` reports no LLVM version")?
        .to_string();
    let sysroot = output(workspace::command("rustc").args(["+nightly", "--print", "sysroot"]))?;
    let libllvm = find_libllvm(&Path::new(sysroot.trim()).join("lib"))?;
    let soname = libllvm.file_name().expect("file name").to_owned();

    // LLVM_PREFIX/lib must hold libLLVM.so and its soname, both pointing at the nightly's copy.
    let prefix = tools.join("llvm");
    let lib = prefix.join("lib");
    fs::create_dir_all(&lib)?;
    for name in [std::ffi::OsStr::new("libLLVM.so"), soname.as_os_str()] {
        let link = lib.join(name);
        let _ = fs::remove_file(&link);
        symlink(&libllvm, &link).with_context(|| format!("linking {}", link.display()))?;
    }

    println!(
        "setup: building bpf-linker {BPF_LINKER_VERSION} against the nightly's LLVM {major} (about a minute)"
    );
    workspace::run(
        workspace::cargo()
            .args([
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--locked",
                "--force",
            ])
            .args([
                "--no-default-features",
                "--features",
                &format!("llvm-{major}"),
            ])
            .arg("--root")
            .arg(&tools)
            .env("LLVM_PREFIX", &prefix),
    )?;
    fs::write(&stamp, wanted_stamp)?;
    Ok(())
}

/// The real shared library in the nightly's lib directory (not the linker script beside it).
fn find_libllvm(dir: &Path) -> Result<std::path::PathBuf> {
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        if name.starts_with("libLLVM.so.") && fs::metadata(&path).is_ok_and(|m| m.len() > 1 << 20) {
            return Ok(path);
        }
    }
    bail!(
        "no libLLVM.so.* in {}: the nightly toolchain ships none",
        dir.display()
    )
}

/// The cargo-fuzz release this project fuzzes with.
const CARGO_FUZZ_VERSION: &str = "0.13.2";

fn ensure_cargo_fuzz() -> Result<()> {
    let bin = tools_dir().join("bin").join("cargo-fuzz");
    let works = Command::new(&bin).arg("--version").output().is_ok_and(|o| {
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains(CARGO_FUZZ_VERSION)
    });
    if works {
        return Ok(());
    }
    println!("setup: installing cargo-fuzz {CARGO_FUZZ_VERSION}");
    workspace::run(
        workspace::cargo()
            .args([
                "install",
                "cargo-fuzz",
                "--version",
                CARGO_FUZZ_VERSION,
                "--locked",
                "--force",
            ])
            .arg("--root")
            .arg(tools_dir()),
    )
}

/// The cargo-deb release `cargo xtask package` builds with (3.8: MSRV 1.85).
const CARGO_DEB_VERSION: &str = "3.8.0";

fn ensure_cargo_deb() -> Result<()> {
    let bin = tools_dir().join("bin").join("cargo-deb");
    let works = Command::new(&bin).arg("--version").output().is_ok_and(|o| {
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains(CARGO_DEB_VERSION)
    });
    if works {
        return Ok(());
    }
    println!("setup: installing cargo-deb {CARGO_DEB_VERSION}");
    workspace::run(
        workspace::cargo()
            .args([
                "install",
                "cargo-deb",
                "--version",
                CARGO_DEB_VERSION,
                "--locked",
                "--force",
            ])
            .arg("--root")
            .arg(tools_dir()),
    )
}

/// Installs Debian package `package` unless `program args` already runs.
fn ensure_package(program: &str, args: &[&str], package: &str) -> Result<()> {
    if Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Ok(());
    }
    println!("setup: installing {package}");
    // Non-interactive: iperf3's package asks whether to start a daemon.
    let install = || {
        workspace::run(
            Command::new("apt-get")
                .args(["install", "-y", "-q", package])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )
    };
    if install().is_err() {
        workspace::run(Command::new("apt-get").args(["update", "-q"]))?;
        install()?;
    }
    Ok(())
}
