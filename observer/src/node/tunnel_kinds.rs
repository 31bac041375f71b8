//! Which tunnel device kinds the running kernel can create, read from its
//! build configuration and module lists without creating a device or
//! loading a module (loading `ipip` alone adds a `tunl0` to every network
//! namespace: not something a check may do on a production node).

use std::{
    collections::HashMap,
    fs,
    io::Read,
    path::{Path, PathBuf},
};

use crate::model::kernel::Availability;

/// Device kinds (`ip link add ... type KIND`), with the kernel config
/// symbol and module that provide them.
pub const KINDS: &[(&str, &str, &str)] = &[
    ("vxlan", "CONFIG_VXLAN", "vxlan"),
    ("geneve", "CONFIG_GENEVE", "geneve"),
    ("ipip", "CONFIG_NET_IPIP", "ipip"),
    ("sit", "CONFIG_IPV6_SIT", "sit"),
    ("ip6tnl", "CONFIG_IPV6_TUNNEL", "ip6_tunnel"),
    ("gre", "CONFIG_NET_IPGRE", "ip_gre"),
    ("gretap", "CONFIG_NET_IPGRE", "ip_gre"),
    ("ip6gre", "CONFIG_IPV6_GRE", "ip6_gre"),
    ("wireguard", "CONFIG_WIREGUARD", "wireguard"),
];

/// What the kernel says about its build and modules.
#[derive(Debug, Default)]
pub struct KernelBuild {
    /// `CONFIG_X` -> `y`/`m`, from /proc/config.gz or /boot/config-RELEASE.
    config: Option<HashMap<String, String>>,
    /// Module names in modules.builtin.
    builtin: Option<Vec<String>>,
    /// Module names in modules.dep (loadable).
    loadable: Option<Vec<String>>,
    /// Module names in /proc/modules (loaded now).
    loaded: Vec<String>,
}

impl KernelBuild {
    /// Reads the running kernel's facts.
    pub fn read(release: &str) -> KernelBuild {
        let modules = PathBuf::from("/lib/modules").join(release);
        KernelBuild {
            config: read_config(release).map(|text| parse_config(&text)),
            builtin: fs::read_to_string(modules.join("modules.builtin"))
                .ok()
                .map(|t| module_names(&t)),
            loadable: fs::read_to_string(modules.join("modules.dep"))
                .ok()
                .map(|t| module_names(&t)),
            loaded: fs::read_to_string("/proc/modules")
                .map(|t| {
                    t.lines()
                        .filter_map(|l| l.split_whitespace().next())
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    /// Availability of the module `module` configured by `symbol`.
    pub fn availability(&self, symbol: &str, module: &str) -> Availability {
        if self.loaded.iter().any(|m| m == module) {
            return Availability::Loaded;
        }
        if let Some(config) = &self.config {
            return match config.get(symbol).map(String::as_str) {
                Some("y") => Availability::BuiltIn,
                Some("m") => Availability::Module,
                _ => Availability::Absent,
            };
        }
        let listed = |list: &Option<Vec<String>>| {
            list.as_ref().map(|names| names.iter().any(|m| m == module))
        };
        match (listed(&self.builtin), listed(&self.loadable)) {
            (Some(true), _) => Availability::BuiltIn,
            (_, Some(true)) => Availability::Module,
            (Some(false), Some(false)) => Availability::Absent,
            _ => Availability::Unknown,
        }
    }

    /// Every tunnel kind of [`KINDS`] with its availability.
    pub fn tunnel_kinds(&self) -> Vec<(&'static str, Availability)> {
        KINDS
            .iter()
            .map(|(kind, symbol, module)| (*kind, self.availability(symbol, module)))
            .collect()
    }
}

/// The kernel config text: /proc/config.gz (IKCONFIG_PROC) or the
/// distribution's /boot/config-RELEASE.
fn read_config(release: &str) -> Option<String> {
    if let Ok(file) = fs::File::open("/proc/config.gz") {
        let mut text = String::new();
        // Bounded: a kernel config is a few hundred KiB.
        if flate2::read::GzDecoder::new(file)
            .take(16 << 20)
            .read_to_string(&mut text)
            .is_ok()
        {
            return Some(text);
        }
    }
    fs::read_to_string(Path::new("/boot").join(format!("config-{release}"))).ok()
}

/// `CONFIG_X=value` lines.
fn parse_config(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|line| line.split_once('='))
        .filter(|(key, _)| key.starts_with("CONFIG_"))
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect()
}

/// Module names of a modules.builtin / modules.dep text: the file name of
/// each `path/name.ko[.xz|.zst]` at the start of a line, with `-` as `_`.
fn module_names(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| line.split(':').next())
        .filter_map(|path| path.rsplit('/').next())
        .filter_map(|file| file.split(".ko").next())
        .map(|name| name.replace('-', "_"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_decides_when_present() {
        let build = KernelBuild {
            config: Some(parse_config(
                "# comment\nCONFIG_VXLAN=y\nCONFIG_NET_IPIP=m\n# CONFIG_WIREGUARD is not set\n",
            )),
            loaded: vec!["ipip".to_string()],
            ..Default::default()
        };
        let kinds: HashMap<_, _> = build.tunnel_kinds().into_iter().collect();
        assert_eq!(kinds["vxlan"], Availability::BuiltIn);
        assert_eq!(kinds["ipip"], Availability::Loaded);
        assert_eq!(kinds["wireguard"], Availability::Absent);
        assert_eq!(kinds["geneve"], Availability::Absent);
    }

    #[test]
    fn module_lists_decide_without_config() {
        let build = KernelBuild {
            builtin: Some(module_names("kernel/drivers/net/vxlan/vxlan.ko\n")),
            loadable: Some(module_names(
                "kernel/net/ipv4/ipip.ko: kernel/net/ipv4/ip_tunnel.ko\nkernel/net/ipv6/ip6_gre.ko.xz:\n",
            )),
            ..Default::default()
        };
        assert_eq!(
            build.availability("CONFIG_VXLAN", "vxlan"),
            Availability::BuiltIn
        );
        assert_eq!(
            build.availability("CONFIG_NET_IPIP", "ipip"),
            Availability::Module
        );
        assert_eq!(
            build.availability("CONFIG_IPV6_GRE", "ip6_gre"),
            Availability::Module
        );
        assert_eq!(
            build.availability("CONFIG_GENEVE", "geneve"),
            Availability::Absent
        );
        assert_eq!(
            KernelBuild::default().availability("CONFIG_GENEVE", "geneve"),
            Availability::Unknown
        );
    }
}
