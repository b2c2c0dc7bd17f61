//! `monitor track-file`: keeps keepalived `track_file`s up to date from the agent's view of
//! some peers.
//!
//! Each file holds one integer: 0 while every peer named for it is below `--level`, the
//! `--weight` otherwise. keepalived (2.2, keepalived.conf(5), "Track files") multiplies the
//! value by the `weight` of its `track_file` block (1 by default) and adds it to the VRRP
//! instance's priority (kept within 1..254); a result below -253 puts the instance in the
//! FAULT state, and with `weight 0` any non-zero value does. `--weight fault` writes -254,
//! which faults the instance with `weight 1` and with `weight 0`.
//!
//! Every write is a new file renamed over the old one in the same directory, so keepalived
//! never reads half a number. While the agent cannot be reached, the files are left as they
//! are: the monitor cannot say anything new, and keepalived keeps its last state.

use std::{
    collections::BTreeMap,
    io::Write,
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use anyhow::Context;
use clap::Args;
use monitor::DEFAULT_SOCKET;

use super::peer_cache::{Lookup, PeerCache};

/// What `--weight fault` writes: below -253, keepalived's fault threshold.
pub const FAULT: i64 = -254;

#[derive(Debug, Args)]
pub struct TrackFileArgs {
    /// A track file and the peers (ids or addresses) it follows, PATH=PEER[,PEER...]
    /// (repeatable).
    #[arg(long = "file", value_name = "PATH=PEER[,PEER...]", value_parser = parse_file, required = true)]
    files: Vec<(PathBuf, Vec<String>)>,
    /// Path of the agent's Unix socket.
    #[arg(long, short, default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// A peer counts as failed once its level is at least this (one of the agent's --levels).
    #[arg(long, default_value_t = 8.0)]
    level: f64,
    /// What a file holds while a peer of it has failed: a number added to the priority
    /// (negative lowers it, such as -50), or `fault` (-254: the instance faults).
    #[arg(long, default_value = "fault", value_parser = parse_weight, allow_hyphen_values = true)]
    weight: i64,
    /// Whether a peer the agent does not watch (never admitted, or forgotten) counts as
    /// failed.
    #[arg(long, default_value = "failed", value_parser = ["failed", "ok"])]
    unknown: String,
    /// Wait between attempts to reach the agent's socket.
    #[arg(long, default_value = "1s", value_parser = super::parse_duration)]
    retry: Duration,
}

fn parse_file(text: &str) -> Result<(PathBuf, Vec<String>), String> {
    let (path, peers) = text
        .rsplit_once('=')
        .ok_or_else(|| format!("{text:?}: expected PATH=PEER[,PEER...]"))?;
    let peers: Vec<String> = peers
        .split(',')
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect();
    if path.is_empty() || peers.is_empty() {
        return Err(format!("{text:?}: expected PATH=PEER[,PEER...]"));
    }
    Ok((PathBuf::from(path), peers))
}

fn parse_weight(text: &str) -> Result<i64, String> {
    if text == "fault" {
        return Ok(FAULT);
    }
    let w: i64 = text
        .parse()
        .map_err(|_| format!("{text:?}: expected a number such as -50, or fault"))?;
    if w == 0 {
        return Err("a weight of 0 would never change anything".into());
    }
    Ok(w)
}

pub fn track_file(args: TrackFileArgs) -> anyhow::Result<ExitCode> {
    let cache = PeerCache::follow(&args.socket, args.retry, Duration::from_secs(1));
    let unknown_failed = args.unknown == "failed";
    log::info!(
        "keeping {} track file(s) from the agent at {}: {} at level {} and above",
        args.files.len(),
        args.socket.display(),
        args.weight,
        args.level
    );
    let mut written: BTreeMap<PathBuf, i64> = BTreeMap::new();
    loop {
        let version = cache.version();
        for (path, peers) in &args.files {
            let mut failed = Vec::new();
            let mut lost = None;
            for name in peers {
                match cache.lookup(name) {
                    Lookup::Found(_, peer) if peer.level.is_some_and(|l| l >= args.level) => {
                        failed.push(name.clone());
                    }
                    Lookup::Found(..) => {}
                    Lookup::Unknown | Lookup::Ambiguous(_) if unknown_failed => {
                        failed.push(format!("{name} (unknown)"));
                    }
                    Lookup::Unknown | Lookup::Ambiguous(_) => {}
                    Lookup::NoAgent(why) => lost = Some(why),
                }
            }
            if lost.is_some() {
                // Nothing new to say: the file stays as it is.
                continue;
            }
            let value = if failed.is_empty() { 0 } else { args.weight };
            if written.get(path) == Some(&value) {
                continue;
            }
            write_atomically(path, value).with_context(|| format!("writing {}", path.display()))?;
            if failed.is_empty() {
                log::info!(
                    "{}: 0 (every peer below level {})",
                    path.display(),
                    args.level
                );
            } else {
                log::info!(
                    "{}: {value} (failed: {})",
                    path.display(),
                    failed.join(", ")
                );
            }
            written.insert(path.clone(), value);
        }
        cache.wait_change(version, Duration::from_secs(1));
    }
}

/// Writes `value` to a temporary file beside `path` and renames it over `path`.
pub fn write_atomically(path: &Path, value: i64) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("the path names no file"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        writeln!(file, "{value}")?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_and_weights_parse() {
        assert_eq!(
            parse_file("/run/t=1,2, 10.0.0.5").unwrap(),
            (
                PathBuf::from("/run/t"),
                vec!["1".into(), "2".into(), "10.0.0.5".into()]
            )
        );
        assert!(parse_file("/run/t=").is_err());
        assert!(parse_file("/run/t").is_err());
        assert_eq!(parse_weight("fault").unwrap(), FAULT);
        assert_eq!(parse_weight("-50").unwrap(), -50);
        assert!(parse_weight("0").is_err());
        assert!(parse_weight("x").is_err());
    }

    #[test]
    fn writes_replace_the_file_whole() {
        let dir = std::env::temp_dir().join(format!("hbm-track-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("peer");
        write_atomically(&path, -50).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "-50\n");
        write_atomically(&path, 0).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "0\n");
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "no temporary left"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
