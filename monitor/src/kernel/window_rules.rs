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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detector::spec::parse_spec;

    #[test]
    fn the_rules_a_spec_sets_are_the_programs() {
        let c = parse_spec("phi:model=loss,window=32,outage_factor=3,max_interval_ms=2000")
            .unwrap()
            .window_config();
        assert_eq!(
            (c.window, c.outage_factor, c.max_interval_us, c.flags),
            (32, 3, 2_000_000, XDP_FLAG_GAPLESS_WINDOW)
        );
        assert_eq!((c.port, c.index_bits), (XdpConfig::DEFAULT.port, 0));
        // No cap: every interval counts; a cap beyond the kernel's largest interval is that.
        let c = parse_spec("phi:model=normal,max_interval_ms=1e12")
            .unwrap()
            .window_config();
        assert_eq!((c.max_interval_us, c.flags), (MAX_INTERVAL_US as u32, 0));
        assert_eq!(DetectorParams::DEFAULT.window_config().max_interval_us, 0);
    }
}
