//! The peer index's hash key (`monitor_common::index::IndexKey`): drawn from the kernel's
//! random source each time the agent loads the program, so which ids share a bucket differs
//! from boot to boot and cannot be computed by a sender.

use std::io;

use monitor_common::index::IndexKey;

/// A fresh key from getrandom(2).
pub fn random() -> io::Result<IndexKey> {
    let mut bytes = [0u8; 16];
    let mut filled = 0;
    while filled < bytes.len() {
        // SAFETY: writes at most the rest of `bytes`.
        let n = unsafe {
            libc::getrandom(bytes[filled..].as_mut_ptr().cast(), bytes.len() - filled, 0)
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += n as usize;
    }
    Ok(IndexKey::from_bytes(bytes))
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_differ_and_multipliers_are_odd() {
        let (a, b) = (super::random().unwrap(), super::random().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.mul & 1, 1);
        assert_eq!(b.mul & 1, 1);
    }
}
