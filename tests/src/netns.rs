//! Two network namespaces joined by a veth pair, removed on drop (even when a test panics).

use std::process::Command;

use crate::unique_name;

pub struct NetnsPair {
    /// Namespace where the agent listens, with interface `iface_a` and address `addr_a`.
    pub ns_a: String,
    pub ns_b: String,
    pub iface_a: String,
    pub iface_b: String,
    pub addr_a: String,
    pub addr_b: String,
    pub addr6_a: String,
    pub addr6_b: String,
}

/// Runs `ip ARGS`, panicking with its stderr on failure.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("running ip (iproute2)");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl NetnsPair {
    /// Packets the veth itself dropped between the two ends (b's transmit and a's receive
    /// drops: on a loaded host the receiving end's queue can overflow before any XDP program
    /// sees the packet); a sender's count includes them.
    pub fn dropped_on_the_way(&self) -> u64 {
        let stat = |ns: &str, iface: &str, dir: &str| -> u64 {
            let out = Command::new("ip")
                .args(["-n", ns, "-s", "-j", "link", "show", "dev", iface])
                .output()
                .expect("running ip (iproute2)");
            let links: serde_json::Value =
                serde_json::from_slice(&out.stdout).expect("ip -j link show");
            links[0]["stats64"][dir]["dropped"]
                .as_u64()
                .expect("the link's dropped count")
        };
        stat(&self.ns_b, &self.iface_b, "tx") + stat(&self.ns_a, &self.iface_a, "rx")
    }

    /// Creates the pair; `subnet` is the third octet of 10.211.<subnet>.0/24.
    pub fn new(subnet: u8) -> Self {
        Self::named(subnet, ["hbma", "hbmb"], ["hbva", "hbvb"])
    }

    /// Creates the pair with names of a test's own: namespaces and veth ends are named by
    /// [`unique_name`] from these prefixes (`a` side first).
    pub fn named(subnet: u8, ns_prefixes: [&str; 2], iface_prefixes: [&str; 2]) -> Self {
        let pair = Self {
            ns_a: unique_name(ns_prefixes[0]),
            ns_b: unique_name(ns_prefixes[1]),
            iface_a: unique_name(iface_prefixes[0]),
            iface_b: unique_name(iface_prefixes[1]),
            addr_a: format!("10.211.{subnet}.1"),
            addr_b: format!("10.211.{subnet}.2"),
            addr6_a: format!("fd00:211:{subnet}::1"),
            addr6_b: format!("fd00:211:{subnet}::2"),
        };
        for iface in [&pair.iface_a, &pair.iface_b] {
            assert!(
                iface.len() <= 15,
                "{iface} is too long for an interface name"
            );
        }
        ip(&["netns", "add", &pair.ns_a]);
        ip(&["netns", "add", &pair.ns_b]);
        ip(&[
            "link",
            "add",
            &pair.iface_a,
            "netns",
            &pair.ns_a,
            "type",
            "veth",
            "peer",
            "name",
            &pair.iface_b,
            "netns",
            &pair.ns_b,
        ]);
        for (ns, iface, addr, addr6) in [
            (&pair.ns_a, &pair.iface_a, &pair.addr_a, &pair.addr6_a),
            (&pair.ns_b, &pair.iface_b, &pair.addr_b, &pair.addr6_b),
        ] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", iface]);
            // nodad: usable at once, no duplicate address detection delay.
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{addr6}/64"),
                "dev",
                iface,
                "nodad",
            ]);
            ip(&["-n", ns, "link", "set", iface, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        pair
    }

    /// A command run inside namespace `ns`.
    pub fn command_in(ns: &str, program: &std::path::Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns]).arg(program);
        cmd
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        // Deleting a namespace destroys the veth end inside it, and with it the peer end.
        for ns in [&self.ns_a, &self.ns_b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}
