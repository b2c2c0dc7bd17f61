//! Builds the XDP program with aya-build and leaves the object in OUT_DIR for
//! `include_bytes_aligned!`. Never fails the host build for a missing eBPF toolchain: it warns
//! and writes an empty placeholder so pure-userspace tests still compile (`cargo xtask setup`
//! installs the toolchain; loading the placeholder fails with a clear error at run time).

use std::{env, fs, path::PathBuf};

fn main() -> anyhow::Result<()> {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    // Every bin of monitor-ebpf: the XDP program, the bench's floor, the traces' impairment,
    // the kernel load generator.
    let objects = ["monitor", "floor", "impair", "loadgen"].map(|name| out_dir.join(name));
    println!("cargo:rerun-if-env-changed=PATH");
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    // Read by monitor-ebpf (`option_env!`): a test-only second build of the program whose
    // instructions differ and whose maps do not (see `UNREACHABLE_VERDICT` there).
    println!("cargo:rerun-if-env-changed=MONITOR_EBPF_VARIANT");
    let skip = env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    let have_linker = env::var_os("PATH")
        .is_some_and(|paths| env::split_paths(&paths).any(|dir| dir.join("bpf-linker").is_file()));
    if skip || !have_linker {
        if !skip {
            println!(
                "cargo:warning=bpf-linker not on PATH: building without the XDP program \
                 (run `cargo xtask setup`, or use `cargo xtask build`)"
            );
        }
        for object in &objects {
            fs::write(object, [])?;
        }
        return Ok(());
    }
    let package = aya_build::Package {
        name: "monitor-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../monitor-ebpf"),
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::default())?;
    Ok(())
}
