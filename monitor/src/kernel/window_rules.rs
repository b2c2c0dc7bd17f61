//! A detector's window rules as the XDP program's load-time config: which intervals enter a
//! peer's window is the kernel's to decide (`monitor_common::slot`), the detector's parameters
//! say which rules it wants (`DetectorParams::window_rules`). The agent loads this config, a
//! reload compares it, replay runs the same rules with it.

use monitor_common::{
    config::{XDP_FLAG_GAPLESS_WINDOW, XdpConfig},
    maps::MAX_INTERVAL_US,
};

use crate::detector::model::{DetectorParams, WindowRules};

impl From<WindowRules> for XdpConfig {
    fn from(rules: WindowRules) -> Self {
        let max_interval_us = rules.max_interval_ms.map_or(0, |ms| {
            ((ms * 1000.0) as u64).clamp(1, MAX_INTERVAL_US) as u32
        });
        XdpConfig {
            window: rules.window,
            max_interval_us,
            outage_factor: rules.outage_factor,
            flags: if rules.gapless {
                XDP_FLAG_GAPLESS_WINDOW
            } else {
                0
            },
            ..XdpConfig::DEFAULT
        }
    }
}

impl DetectorParams {
    /// The kernel's window rules for these parameters, as the program's config (the fields
    /// the rules set; the rest are `XdpConfig::DEFAULT`'s, which the loader fills in).
    pub fn window_config(&self) -> XdpConfig {
        self.window_rules().into()
    }
}
