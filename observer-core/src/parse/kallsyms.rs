//! `/proc/kallsyms` lines, and the kernel function an address lies in:
//! where the kernel freed a dropped packet (the `skb:kfree_skb`
//! tracepoint's `location`). By hand: a line is three or four words, and
//! no crate reads the file.

/// One text (code) symbol of a `/proc/kallsyms` line: `ffffffff81a2b3c0 T
/// nf_hook_slow`, or with a module (after a tab), `... t vxlan_xmit_one [vxlan]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextSymbol<'a> {
    /// Its address; 0 when the kernel hides addresses from the reader
    /// (`kernel.kptr_restrict`).
    pub addr: u64,
    /// Its name.
    pub name: &'a str,
}

/// The text symbol of `line`; `None` for data symbols and lines that are
/// not of the file's form.
pub fn text_symbol(line: &str) -> Option<TextSymbol<'_>> {
    let mut words = line.split_whitespace();
    let addr = u64::from_str_radix(words.next()?, 16).ok()?;
    let kind = words.next()?;
    if kind != "t" && kind != "T" {
        return None;
    }
    Some(TextSymbol {
        addr,
        name: words.next()?,
    })
}

/// Names addresses by the text symbol at or below each, nearest first,
/// fed the file's symbols one at a time (it is megabytes; nothing of it
/// is kept but the answers).
#[derive(Debug, Default)]
pub struct Nearest {
    /// (address, best symbol so far: its address and name).
    wanted: Vec<(u64, Option<(u64, String)>)>,
}

impl Nearest {
    /// Asks for `addrs` (0 is never named: no code lives there; each
    /// address once, however often it is given: every symbol is compared
    /// with each).
    pub fn new(addrs: impl IntoIterator<Item = u64>) -> Nearest {
        let mut wanted: Vec<(u64, Option<(u64, String)>)> = addrs
            .into_iter()
            .filter(|a| *a != 0)
            .map(|a| (a, None))
            .collect();
        wanted.sort_unstable_by_key(|(a, _)| *a);
        wanted.dedup_by_key(|(a, _)| *a);
        Nearest { wanted }
    }

    /// Considers one symbol.
    pub fn offer(&mut self, symbol: TextSymbol<'_>) {
        // Hidden addresses (all 0) name nothing.
        if symbol.addr == 0 {
            return;
        }
        for (addr, best) in &mut self.wanted {
            let closer = best.as_ref().is_none_or(|(at, _)| symbol.addr > *at);
            if symbol.addr <= *addr && closer {
                *best = Some((symbol.addr, symbol.name.to_string()));
            }
        }
    }

    /// Each address asked for with the function it lies in, when one was
    /// found.
    pub fn finish(self) -> Vec<(u64, Option<String>)> {
        self.wanted
            .into_iter()
            .map(|(addr, best)| (addr, best.map(|(_, name)| name)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "\
ffffffff81000000 T _stext
ffffffff81a2b3c0 T nf_hook_slow
ffffffff81a2b500 t nf_hook_slow_list
ffffffff82000000 D some_data
ffffffff81b00000 T ip_rcv_finish_core
ffffffffc0a01000 t vxlan_xmit_one\t[vxlan]
garbage
";

    fn names(addrs: &[u64], file: &str) -> Vec<(u64, Option<String>)> {
        let mut nearest = Nearest::new(addrs.iter().copied());
        for symbol in file.lines().filter_map(text_symbol) {
            nearest.offer(symbol);
        }
        nearest.finish()
    }

    #[test]
    fn addresses_are_named_by_the_function_they_lie_in() {
        let got = names(
            &[
                0xffffffff81a2b3c0 + 0x9c,
                0xffffffff81b00010,
                0xffffffffc0a01050,
                0,
            ],
            FILE,
        );
        assert_eq!(
            got,
            vec![
                (0xffffffff81a2b45c, Some("nf_hook_slow".to_string())),
                (0xffffffff81b00010, Some("ip_rcv_finish_core".to_string())),
                (0xffffffffc0a01050, Some("vxlan_xmit_one".to_string())),
            ]
        );
    }

    #[test]
    fn an_address_given_many_times_is_named_once() {
        let many = vec![0xffffffff81b00010u64; 10_000];
        assert_eq!(
            names(&many, FILE),
            vec![(0xffffffff81b00010, Some("ip_rcv_finish_core".to_string()))]
        );
    }

    #[test]
    fn data_symbols_and_hidden_addresses_name_nothing() {
        assert_eq!(text_symbol("ffffffff82000000 D some_data"), None);
        assert_eq!(text_symbol("nonsense"), None);
        let hidden = "0000000000000000 T _stext\n0000000000000000 T nf_hook_slow\n";
        assert_eq!(
            names(&[0xffffffff81a2b45c], hidden),
            vec![(0xffffffff81a2b45c, None)]
        );
        assert_eq!(names(&[0x10], FILE), vec![(0x10, None)]);
    }
}
