//! Peers files (`--peers`): the ids admitted at start, one a line, and the peer id syntax
//! every command takes (decimal or `0x` hex).

use std::{collections::HashMap, fs, path::Path};

#[derive(Debug, thiserror::Error)]
pub enum PeersFileError {
    #[error("reading peers file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Parse {
        path: String,
        line: usize,
        message: String,
    },
}

/// Reads a peers file: one peer id per line, decimal or `0x` hex; blank lines and `#`
/// comments (whole-line or trailing) are ignored. Any bad line is an error naming the line.
pub fn read_peers_file(path: &Path) -> Result<Vec<u64>, PeersFileError> {
    let text = fs::read_to_string(path).map_err(|source| PeersFileError::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse_peers(&text).map_err(|(line, message)| PeersFileError::Parse {
        path: path.display().to_string(),
        line,
        message,
    })
}

pub fn parse_peers(text: &str) -> Result<Vec<u64>, (usize, String)> {
    let mut first_seen = HashMap::new();
    let mut ids = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line_no = n + 1;
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let id = parse_peer_id(line).map_err(|m| (line_no, m))?;
        if let Some(first) = first_seen.insert(id, line_no) {
            return Err((
                line_no,
                format!("peer id {id} is listed twice (first on line {first})"),
            ));
        }
        ids.push(id);
    }
    Ok(ids)
}

/// A peer id: decimal or `0x` hexadecimal u64.
pub fn parse_peer_id(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse::<u64>(),
    };
    parsed.map_err(|e| format!("{text:?} is not a peer id (a u64, decimal or 0x hex): {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_file_accepts_comments_hex_and_blanks() {
        let text = "# cluster A\n1\n\n0x10  # sixteen\n  42 \n18446744073709551615\n";
        assert_eq!(parse_peers(text), Ok(vec![1, 16, 42, u64::MAX]));
    }

    #[test]
    fn peers_file_names_the_bad_line() {
        let (line, msg) = parse_peers("1\n2\nbanana\n").unwrap_err();
        assert_eq!(line, 3);
        assert!(msg.contains("banana"), "{msg}");
        let (line, msg) = parse_peers("7\n-1\n").unwrap_err();
        assert_eq!(line, 2);
        assert!(msg.contains("-1"), "{msg}");
        let (line, msg) = parse_peers("5\n6\n5\n").unwrap_err();
        assert_eq!(line, 3);
        assert!(msg.contains("first on line 1"), "{msg}");
        assert!(parse_peers("18446744073709551616").is_err());
    }
}
