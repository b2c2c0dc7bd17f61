//! The heartbeat authentication key file (32 hex digits, mode 0600): both ends read it, the
//! sender to sign its heartbeats (`crate::peer::auth_key`), the agent's keyring to give the
//! kernel what it verifies them with (`crate::kernel::keyring`).

use std::{fs, io, os::unix::fs::PermissionsExt, path::Path};

use monitor_common::auth::AuthKey;

#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    #[error("reading auth key file {path}: {source}")]
    Read { path: String, source: io::Error },
    #[error(
        "auth key file {path} is accessible to group or others (mode {mode:04o}); \
         `chmod 600 {path}` and keep it that way"
    )]
    Mode { path: String, mode: u32 },
    #[error("auth key file {path} must hold exactly 32 hexadecimal digits (a 128-bit key)")]
    Format { path: String },
}

/// Reads a 128-bit key written as 32 hex digits (surrounding whitespace ignored). The file
/// must not be accessible to group or others. The key itself never appears in an error.
pub fn read_key_file(path: &Path) -> Result<AuthKey, KeyFileError> {
    let path_text = path.display().to_string();
    let read_err = |source| KeyFileError::Read {
        path: path_text.clone(),
        source,
    };
    let mode = fs::metadata(path).map_err(read_err)?.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(KeyFileError::Mode {
            path: path_text,
            mode,
        });
    }
    let text = fs::read_to_string(path).map_err(read_err)?;
    parse_key(text.trim()).ok_or(KeyFileError::Format { path: path_text })
}

/// 32 hex digits -> key, the first two digits its first byte. (Digits only: from_str_radix
/// alone would also take a leading `+`.)
pub fn parse_key(hex: &str) -> Option<AuthKey> {
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let value = u128::from_str_radix(hex, 16).ok()?;
    Some(AuthKey::from_bytes(value.to_be_bytes()))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn key_file(contents: &str, mode: u32) -> tempfile_path::TempPath {
        let path = tempfile_path::TempPath::new();
        let mut f = fs::File::create(&path.0).unwrap();
        f.write_all(contents.as_bytes()).unwrap();
        fs::set_permissions(&path.0, fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    mod tempfile_path {
        pub struct TempPath(pub std::path::PathBuf);
        impl TempPath {
            pub fn new() -> Self {
                use std::sync::atomic::{AtomicU32, Ordering};
                static N: AtomicU32 = AtomicU32::new(0);
                let n = N.fetch_add(1, Ordering::Relaxed);
                Self(std::env::temp_dir().join(format!("hbm-key-{}-{n}", std::process::id())))
            }
        }
        impl Drop for TempPath {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }

    #[test]
    fn reads_a_private_hex_key() {
        let f = key_file("000102030405060708090a0b0c0d0e0f\n", 0o600);
        let key = read_key_file(&f.0).unwrap();
        assert_eq!(key, AuthKey::from_bytes(core::array::from_fn(|i| i as u8)));
    }

    #[test]
    fn refuses_a_readable_file_and_never_shows_the_key() {
        let secret = "00112233445566778899aabbccddeeff";
        let f = key_file(secret, 0o644);
        let err = read_key_file(&f.0).unwrap_err().to_string();
        assert!(err.contains("0644") && err.contains("chmod 600"), "{err}");
        assert!(!err.contains(secret));
        let f = key_file("not a key", 0o600);
        let err = read_key_file(&f.0).unwrap_err().to_string();
        assert!(err.contains("32 hexadecimal digits"), "{err}");
        assert!(parse_key("0011").is_none());
        assert!(parse_key("zz112233445566778899aabbccddeeff").is_none());
    }
}
