//! A start-up check of the nftables mode: other software's nftables chains in the node's
//! network namespace. Every commit walks every chain of every table of the namespace, not only
//! svcnet's (measured: a separate table of 100,000 empty chains raised a one-element commit of
//! svcnet's table from 0.07 to 5.8 ms, `shared/notes/nft-data-maps.md`, finding 2), so a big
//! foreign table (a stale kube-proxy table, another CNI's) slows each of svcnet's updates.
//! The proxy warns once, with the count and the biggest tables, so the operator can remove
//! what is stale; it changes nothing itself.

/// Foreign chains above this many get a warning (about 0.6 ms added to every commit).
pub const WARN_ABOVE: usize = 10_000;

/// Chains of tables that are not svcnet's, from `nft list chains`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ForeignChains {
    pub total: usize,
    /// `(family table, chains)`, most chains first.
    pub tables: Vec<(String, usize)>,
}

/// Counts the chains of `nft list chains` output per table, leaving out `own` tables (given
/// as `family name`, e.g. `ip svcnet`).
pub fn count(listing: &str, own: &[String]) -> ForeignChains {
    let mut tables: Vec<(String, usize)> = Vec::new();
    let mut current: Option<usize> = None;
    for line in listing.lines() {
        if let Some(rest) = line.strip_prefix("table ") {
            let name = rest.trim_end_matches('{').trim().to_string();
            current = if own.contains(&name) {
                None
            } else {
                tables.push((name, 0));
                Some(tables.len() - 1)
            };
        } else if line.trim_start().starts_with("chain ")
            && let Some(i) = current
        {
            tables[i].1 += 1;
        }
    }
    tables.retain(|t| t.1 > 0);
    tables.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    ForeignChains {
        total: tables.iter().map(|t| t.1).sum(),
        tables,
    }
}

/// Lists the chains of the executor's namespace (through its context) and counts those of
/// tables not in `own`. Blocking.
pub fn check(
    exec: &svcnet_nft::NftExecutor,
    own: &[String],
) -> Result<ForeignChains, svcnet_nft::ApplyError> {
    Ok(count(&exec.command("list chains")?, own))
}

/// svcnet's own tables in a namespace: the nft dataplane's `table` in both families and the
/// userspace proxy's redirect table.
pub fn own_tables(table: &str) -> Vec<String> {
    ["ip", "ip6"]
        .into_iter()
        .flat_map(|f| {
            [
                format!("{f} {table}"),
                format!("{f} {}", svcnet_userspace::rules::TABLE),
            ]
        })
        .collect()
}

/// The warning to log when there are more than `threshold` foreign chains.
pub fn warning(f: &ForeignChains, threshold: usize) -> Option<String> {
    if f.total <= threshold {
        return None;
    }
    let biggest: Vec<String> = f
        .tables
        .iter()
        .take(3)
        .map(|(t, n)| format!("table {t}: {n}"))
        .collect();
    Some(format!(
        "this network namespace holds {} nftables chains of other software ({}); every nftables \
         commit walks every chain of the namespace (100,000 chains add ~6 ms), so each of \
         svcnet's rule updates is slowed; remove tables that are stale (e.g. a former \
         kube-proxy's)",
        f.total,
        biggest.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: &str = "table inet foo {
\tchain a {
\t}
\tchain b {
\t\ttype filter hook input priority filter; policy accept;
\t}
}
table ip svcnet {
\tchain x {
\t}
}
table ip nat {
\tchain KUBE-SVC-1 {
\t}
}
table ip6 empty {
}
";

    #[test]
    fn counts_other_tables_chains_only() {
        let f = count(LISTING, &["ip svcnet".to_string()]);
        assert_eq!(f.total, 3);
        assert_eq!(
            f.tables,
            [("inet foo".to_string(), 2), ("ip nat".to_string(), 1)]
        );
    }

    #[test]
    fn warns_above_the_threshold_only_naming_the_biggest_tables() {
        let f = count(LISTING, &[]);
        assert_eq!(warning(&f, 4), None);
        let w = warning(&f, 3).unwrap_or_default();
        assert!(w.contains("holds 4 nftables chains"), "{w}");
        assert!(
            w.contains("table inet foo: 2, table ip nat: 1, table ip svcnet: 1"),
            "{w}"
        );
    }
}
