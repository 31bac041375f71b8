//! Facts about the running kernel read from its BTF: the names of
//! `enum skb_drop_reason` (their numbering differs between kernels) and
//! the sk_buff field offsets the kfree_skb program needs.

use std::{collections::HashMap, path::Path};

use anyhow::{Context, Result, anyhow, bail};
use btf_rs::{Btf, Type};
use observer_common::SkbLayout;

/// Prefix of every drop reason name in the kernel's enum.
const DROP_REASON_PREFIX: &str = "SKB_DROP_REASON_";

/// The running kernel's BTF.
pub struct KernelBtf {
    btf: Btf,
}

impl KernelBtf {
    /// Parses the BTF file at `path` (normally /sys/kernel/btf/vmlinux).
    pub fn open(path: &Path) -> Result<KernelBtf> {
        let btf = Btf::from_file(path)
            .map_err(|e| anyhow!("{e}"))
            .with_context(|| format!("reading kernel BTF from {}", path.display()))?;
        Ok(KernelBtf { btf })
    }

    /// `enum skb_drop_reason` as value -> name without the
    /// `SKB_DROP_REASON_` prefix (`NETFILTER_DROP`, `NO_SOCKET`, ...);
    /// `SKB_CONSUMED` keeps its name.
    pub fn drop_reasons(&self) -> Result<HashMap<u32, String>> {
        self.enum_names("skb_drop_reason", DROP_REASON_PREFIX)
            .context("this kernel's BTF has no enum skb_drop_reason (kernels before 5.17)")
    }

    /// `enum skb_drop_reason_subsys` (the upper 16 bits of subsystem drop
    /// reasons, e.g. `OPENVSWITCH`); empty on kernels without subsystems.
    pub fn drop_reason_subsystems(&self) -> HashMap<u32, String> {
        self.enum_names("skb_drop_reason_subsys", "SKB_DROP_REASON_SUBSYS_")
            .unwrap_or_default()
    }

    /// Whether the enum `name` has a member `member` (the kernel's BTF
    /// holds its uapi enums, so this tells which attach types it knows).
    pub fn enum_has(&self, name: &str, member: &str) -> bool {
        self.enum_names(name, "")
            .is_ok_and(|names| names.values().any(|n| n == member))
    }

    /// Whether the `skb:kfree_skb` tracepoint passes a drop reason (5.17+):
    /// its `btf_trace_kfree_skb` prototype is (void *, skb, location,
    /// reason, ...) instead of (void *, skb, location).
    pub fn kfree_skb_has_reason(&self) -> bool {
        let Ok(types) = self.btf.resolve_types_by_name("btf_trace_kfree_skb") else {
            return false;
        };
        let Some(Type::Typedef(typedef)) = types.into_iter().next() else {
            return false;
        };
        let Ok(Type::Ptr(ptr)) = self.btf.resolve_chained_type(&typedef) else {
            return false;
        };
        match self.btf.resolve_chained_type(&ptr) {
            Ok(Type::FuncProto(proto)) => proto.parameters.len() >= 4,
            _ => false,
        }
    }

    /// Members of the enum `name` as value -> name without `prefix`.
    fn enum_names(&self, name: &str, prefix: &str) -> Result<HashMap<u32, String>> {
        let types = self
            .btf
            .resolve_types_by_name(name)
            .map_err(|e| anyhow!("{e}"))?;
        let Some(Type::Enum(members)) = types.into_iter().find(|t| matches!(t, Type::Enum(_)))
        else {
            bail!("{name} in this kernel's BTF is not an enum");
        };
        let mut names = HashMap::new();
        for member in &members.members {
            let text = self.btf.resolve_name(member).map_err(|e| anyhow!("{e}"))?;
            let text = text.strip_prefix(prefix).unwrap_or(&text).to_string();
            names.insert(member.val(), text);
        }
        Ok(names)
    }

    /// Byte offsets of the sk_buff, net_device and net fields the kfree_skb
    /// program reads.
    pub fn skb_layout(&self) -> Result<SkbLayout> {
        Ok(SkbLayout {
            skb_dev: self.offset("sk_buff", "dev")?,
            skb_head: self.offset("sk_buff", "head")?,
            skb_mac_header: self.offset("sk_buff", "mac_header")?,
            skb_tail: self.offset("sk_buff", "tail")?,
            skb_data: self.offset("sk_buff", "data")?,
            skb_len: self.offset("sk_buff", "len")?,
            dev_ifindex: self.offset("net_device", "ifindex")?,
            // possible_net_t's only member is the `struct net *`.
            dev_nd_net: self.offset("net_device", "nd_net")?,
            net_inum: self.offset("net", "ns")? + self.offset("ns_common", "inum")?,
            skb_network_header: self.offset("sk_buff", "network_header")?,
            valid: 1,
        })
    }

    /// Byte offset of `field` in `struct name`, looking through anonymous
    /// structs and unions (sk_buff nests `dev` two levels deep).
    pub fn offset(&self, name: &str, field: &str) -> Result<u32> {
        let types = self
            .btf
            .resolve_types_by_name(name)
            .map_err(|e| anyhow!("{e}"))?;
        let strukt = types
            .into_iter()
            .find_map(|t| match t {
                Type::Struct(s) if !s.members.is_empty() => Some(s),
                _ => None,
            })
            .with_context(|| format!("struct {name} not found in the kernel's BTF"))?;
        let bits = self
            .find_member(&strukt, field, 0)?
            .with_context(|| format!("struct {name} has no field {field} in this kernel"))?;
        if bits % 8 != 0 {
            bail!("{name}.{field} is a bitfield");
        }
        Ok(bits / 8)
    }

    fn find_member(&self, strukt: &btf_rs::Struct, field: &str, base: u32) -> Result<Option<u32>> {
        for member in &strukt.members {
            let name = self.btf.resolve_name(member).map_err(|e| anyhow!("{e}"))?;
            let at = base + member.bit_offset();
            if name == field {
                return Ok(Some(at));
            }
            if name.is_empty() {
                let inner = self
                    .btf
                    .resolve_chained_type(member)
                    .map_err(|e| anyhow!("{e}"))?;
                if let Type::Struct(s) | Type::Union(s) = inner
                    && let Some(found) = self.find_member(&s, field, at)?
                {
                    return Ok(Some(found));
                }
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel() -> Option<KernelBtf> {
        let path = Path::new(crate::node::preflight::KERNEL_BTF);
        path.exists().then(|| KernelBtf::open(path).unwrap())
    }

    #[test]
    fn drop_reason_names_come_from_the_running_kernel() {
        let Some(btf) = kernel() else { return };
        let names = btf.drop_reasons().unwrap();
        assert!(names.values().any(|n| n == "NETFILTER_DROP"), "{names:?}");
        assert!(names.values().any(|n| n == "NO_SOCKET"));
        assert_eq!(names.get(&1).map(String::as_str), Some("SKB_CONSUMED"));
        let subsystems = btf.drop_reason_subsystems();
        assert_eq!(
            subsystems.get(&0).map(String::as_str),
            Some("CORE"),
            "{subsystems:?}"
        );
    }

    #[test]
    fn skb_layout_is_plausible() {
        let Some(btf) = kernel() else { return };
        let layout = btf.skb_layout().unwrap();
        // Both live inside sk_buff's first 256 bytes on every 64-bit kernel
        // since 4.x; `dev` sits in an anonymous union at offset 16.
        assert_eq!(layout.skb_dev, 16);
        assert!(layout.skb_len < 256 && layout.skb_head > layout.skb_len);
        assert_eq!(layout.valid, 1);
    }

    #[test]
    fn this_kernel_has_tcx_and_drop_reasons() {
        let Some(btf) = kernel() else { return };
        // The test host runs 6.18; the VM suite covers older kernels.
        assert!(btf.enum_has("bpf_attach_type", "BPF_TCX_INGRESS"));
        assert!(!btf.enum_has("bpf_attach_type", "BPF_NO_SUCH_TYPE"));
        assert!(btf.kfree_skb_has_reason());
    }

    #[test]
    fn unknown_field_is_named() {
        let Some(btf) = kernel() else { return };
        let err = btf
            .offset("sk_buff", "no_such_field")
            .unwrap_err()
            .to_string();
        assert!(err.contains("sk_buff has no field no_such_field"), "{err}");
    }
}
