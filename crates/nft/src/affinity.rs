//! Stale ClientIP affinity entries. A service port's affinity maps (one per pool) are filled
//! from the packet path (`client → endpoint`), so a plan cannot name their entries; when a
//! plan takes an endpoint away from an affinity pool ([`Plan::affinity_purge`](crate::Plan)), the
//! dataplane lists the map once the change is live and deletes the entries still pinning a
//! client to it ([`purge`]). Until then (one `nft list map` and one transaction after the
//! change) such a client's new connections still reach the old endpoint; none is created
//! afterwards, because new entries only record endpoints that are in `backends`. Pure.

use std::collections::BTreeSet;

use crate::render::AffinityPair;
use crate::trace::{ListingError, Ruleset};
use crate::tx::{Family, Op, Transaction};

/// The transaction deleting the entries of `listing` (`nft list map … <map>`) that pin a
/// client to one of `stale`'s endpoints of that map. Each is re-added first (a no-op
/// when present), so an entry that expired meanwhile does not fail the transaction.
pub fn purge(
    family: Family,
    table: &str,
    map: &str,
    listing: &str,
    stale: &BTreeSet<AffinityPair>,
) -> Result<Transaction, ListingError> {
    let rs = Ruleset::parse_listing(listing)?;
    let mut tx = Transaction::new(family, table);
    let mut deletes = Vec::new();
    for e in rs.sets.get(map).map_or(&[][..], Vec::as_slice) {
        let Some((key, value)) = e.split_once(" : ") else {
            continue;
        };
        let hit = stale
            .iter()
            .any(|p| p.map == map && p.endpoint == value.trim());
        if hit {
            tx.push(Op::AddElement {
                set: map.to_string(),
                key: key.to_string(),
                value: Some(value.trim().to_string()),
            });
            deletes.push(Op::DeleteElement {
                set: map.to_string(),
                key: key.to_string(),
            });
        }
    }
    tx.ops.extend(deletes);
    Ok(tx)
}

/// The maps `stale` names.
pub fn maps(stale: &BTreeSet<AffinityPair>) -> BTreeSet<&str> {
    stale.iter().map(|p| p.map.as_str()).collect()
}
