//! Reads a sample out of Prometheus' text exposition format (a textfile,
//! a `/metrics` page). By hand: the `prometheus` crate only writes the
//! format, and `observer health` needs one value of one family.

/// The value of the first sample of `family` (without labels, or with
/// any), or `None` when the text has none.
pub fn first_value(text: &str, family: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(family)?;
        let value = if let Some(labeled) = rest.strip_prefix('{') {
            // Label values may hold '}' only inside quotes; the value
            // follows the last '}'.
            labeled.rsplit_once('}')?.1
        } else if rest.starts_with(' ') {
            rest
        } else {
            return None;
        };
        value.split_whitespace().next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_family_with_or_without_labels_and_not_its_prefix_twins() {
        let text = "# HELP observer_programs_attached x\n\
                    observer_programs_attached_total 9\n\
                    observer_programs_attached{node=\"a}b\"} 3 1700000000\n";
        assert_eq!(first_value(text, "observer_programs_attached"), Some(3.0));
        assert_eq!(
            first_value("observer_build_info 1\n", "observer_build_info"),
            Some(1.0)
        );
        assert_eq!(first_value(text, "observer_missing"), None);
        assert_eq!(
            first_value("observer_x{a=\"b\"} notanumber\n", "observer_x"),
            None
        );
    }
}
