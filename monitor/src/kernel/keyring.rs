//! The authentication keys the XDP program checks, and their rotation without detaching:
//! a new key becomes current and the old one stays accepted for a grace period, so senders can
//! switch over at their own pace.

use std::{
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use aya::maps::{Array, MapData, MapError};
use monitor_common::auth::{AuthKey, KEY_CURRENT, KEY_PREVIOUS};

use crate::keys::read_key_file;

pub struct KeyRing {
    map: Mutex<Array<MapData, AuthKey>>,
    current: Mutex<AuthKey>,
    /// Bumped at every rotation, so an old grace timer does not expire a newer previous key.
    generation: AtomicU64,
    path: PathBuf,
    grace: Duration,
}

impl KeyRing {
    /// Installs `key` as the current key.
    pub fn new(
        mut map: Array<MapData, AuthKey>,
        key: AuthKey,
        path: PathBuf,
        grace: Duration,
    ) -> Result<Self, MapError> {
        map.set(KEY_CURRENT, key, 0)?;
        map.set(KEY_PREVIOUS, AuthKey::default(), 0)?;
        Ok(Self {
            map: Mutex::new(map),
            current: Mutex::new(key),
            generation: AtomicU64::new(0),
            path,
            grace,
        })
    }

    /// Re-reads the key file: the new key becomes current, the old one previous. A bad file
    /// changes nothing (the error says why).
    pub fn rotate(self: &Arc<Self>) -> anyhow::Result<()> {
        let key = read_key_file(&self.path)?;
        let mut current = self.current.lock().expect("key lock");
        if key == *current {
            log::info!("auth key file unchanged; nothing to rotate");
            return Ok(());
        }
        {
            let mut map = self.map.lock().expect("map lock");
            // Previous first: there is never a moment where the old key is accepted nowhere.
            map.set(KEY_PREVIOUS, *current, 0)?;
            map.set(KEY_CURRENT, key, 0)?;
        }
        *current = key;
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        log::info!(
            "auth key rotated; the previous key stays valid for {:?}",
            self.grace
        );
        let ring = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(ring.grace).await;
            if ring.generation.load(Ordering::SeqCst) == generation {
                match ring
                    .map
                    .lock()
                    .expect("map lock")
                    .set(KEY_PREVIOUS, AuthKey::default(), 0)
                {
                    Ok(()) => log::info!("previous auth key expired"),
                    Err(e) => log::error!("expiring the previous auth key: {e}"),
                }
            }
        });
        Ok(())
    }
}
