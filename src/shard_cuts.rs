//! `gpujob-operator shard-cuts`: cuts for `--shard-cuts` that balance the GpuJobs there
//! are across N shards, read from the cluster, with how each shard would fare under
//! them and under N equal ranges.

use std::collections::BTreeMap;
use std::fmt::Write;

use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::api::GpuJob;
use crate::hash::fnv1a64;
use crate::shard::ShardMap;

/// What a namespace weighs when cutting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Weight {
    /// Its GpuJobs: shards get about the same number of GpuJobs.
    Gpujobs,
    /// 1: shards get about the same number of namespaces.
    Namespaces,
}

/// GpuJobs per namespace, from a paged list of their metadata.
pub async fn count(client: Client) -> Result<BTreeMap<String, u64>, kube::Error> {
    let api: Api<GpuJob> = Api::all(client);
    let mut counts = BTreeMap::new();
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list_metadata(&params).await?;
        for gj in &page.items {
            *counts
                .entry(gj.namespace().unwrap_or_default())
                .or_insert(0) += 1;
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(counts),
        }
    }
}

/// The balanced map for `counts`, and a table of what each shard holds under it and
/// under equal ranges.
pub fn plan(counts: &BTreeMap<String, u64>, shards: u32, by: Weight) -> (ShardMap, String) {
    let weights = counts.iter().map(|(ns, n)| {
        let w = match by {
            Weight::Gpujobs => *n,
            Weight::Namespaces => 1,
        };
        (fnv1a64(ns.as_bytes()), w)
    });
    let balanced = ShardMap::balanced(weights, shards);
    let even = ShardMap::even(shards);
    let tally = |map: &ShardMap| {
        let mut per: Vec<(u64, u64)> = vec![(0, 0); map.shards() as usize];
        for (ns, n) in counts {
            let row = &mut per[map.shard_of(ns) as usize];
            row.0 += 1;
            row.1 += n;
        }
        per
    };
    let (cut, equal) = (tally(&balanced), tally(&even));
    let mut table = format!(
        "{} GpuJobs in {} namespaces, {shards} shards\nshard  namespaces  GpuJobs  | equal ranges: namespaces  GpuJobs\n",
        counts.values().sum::<u64>(),
        counts.len()
    );
    for (i, ((ns, n), (ens, en))) in cut.iter().zip(&equal).enumerate() {
        let _ = writeln!(
            table,
            "{i:>5}  {ns:>10}  {n:>7}  |               {ens:>10}  {en:>7}"
        );
    }
    (balanced, table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_named_alike_are_spread_and_the_table_says_how_equal_ranges_would_do() {
        let counts: BTreeMap<String, u64> = (b'a'..=b'f')
            .map(|c| (format!("team-{}", char::from(c)), 10))
            .collect();
        let (map, table) = plan(&counts, 3, Weight::Gpujobs);
        let mut per = [0u64; 3];
        for (ns, n) in &counts {
            per[map.shard_of(ns) as usize] += n;
        }
        assert_eq!(per, [20, 20, 20], "{table}");
        assert!(
            table.starts_with("60 GpuJobs in 6 namespaces, 3 shards\n"),
            "{table}"
        );
        // Equal ranges put all six in one shard (FNV-1a's high bits).
        let even: Vec<u32> = counts
            .keys()
            .map(|ns| ShardMap::even(3).shard_of(ns))
            .collect();
        assert!(even.iter().all(|s| *s == even[0]), "{even:?}");
        assert!(
            table.contains("|                        6       60"),
            "{table}"
        );
        assert_eq!(ShardMap::parse(&map.cuts_text(), 3), Ok(map));
    }
}
