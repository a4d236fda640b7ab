//! The watch cache's settings and counters: plain data, so that the binary's flags exist
//! whether or not the `etcd` feature (which has the cache itself, `etcd/cache.rs`) is built.

use std::collections::BTreeMap;

/// Events kept per resource unless `--watch-cache-sizes` says otherwise.
pub const DEFAULT_WATCH_CACHE_SIZE: usize = 1000;

/// The watch cache's settings: kube-apiserver's `--watch-cache`, `--default-watch-cache-size`
/// and `--watch-cache-sizes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchCacheOptions {
    /// Whether client watches are served from the cache at all (`--watch-cache`).
    pub enabled: bool,
    /// How many events each resource's history keeps (`--default-watch-cache-size`); 0 sends
    /// the watches of resources without their own size to etcd.
    pub default_size: usize,
    /// Sizes by resource (`services`, `endpointslices.discovery.k8s.io`; 0 turns the cache off
    /// for that resource), from `--watch-cache-sizes resource[.group]#size,…`.
    pub sizes: BTreeMap<String, usize>,
}

impl Default for WatchCacheOptions {
    fn default() -> Self {
        WatchCacheOptions {
            enabled: true,
            default_size: DEFAULT_WATCH_CACHE_SIZE,
            sizes: BTreeMap::new(),
        }
    }
}

impl WatchCacheOptions {
    /// Reads `--watch-cache-sizes` entries (`resource[.group]#size`, as kube-apiserver).
    pub fn parse_sizes(entries: &[String]) -> Result<BTreeMap<String, usize>, String> {
        let mut sizes = BTreeMap::new();
        for entry in entries.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
            let (resource, size) = entry.split_once('#').ok_or_else(|| {
                format!("--watch-cache-sizes: {entry:?} is not resource[.group]#size")
            })?;
            let size: usize = size.parse().map_err(|_| {
                format!("--watch-cache-sizes: the size in {entry:?} is not a number")
            })?;
            if resource.is_empty()
                || resource.contains('/')
                || resource.starts_with('.')
                || resource.chars().any(|c| c.is_ascii_uppercase())
            {
                return Err(format!(
                    "--watch-cache-sizes: {resource:?} is not a lowercase plural \
                     resource[.group]"
                ));
            }
            sizes.insert(resource.to_string(), size);
        }
        Ok(sizes)
    }

    /// The history size of a resource (0: not cached).
    pub fn size_for(&self, group: &str, plural: &str) -> usize {
        if !self.enabled {
            return 0;
        }
        let name = if group == "core" || group.is_empty() {
            plural.to_string()
        } else {
            format!("{plural}.{group}")
        };
        self.sizes.get(&name).copied().unwrap_or(self.default_size)
    }
}

/// What the watch cache did since the store was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WatchCacheStats {
    /// etcd watch streams this store opened: each resource's upstream watch, the compaction
    /// watch, every direct client watch, and each reopening after a member failure.
    pub etcd_watches: u64,
    /// Resources' upstream watches started.
    pub upstreams: u64,
    /// Client watches served from the cache.
    pub cached: u64,
    /// Client watches on their own etcd watch (from the start, or after falling back).
    pub direct: u64,
    /// Cached client watches that fell back to their own etcd watch (lagged out of the
    /// window, or their upstream failed).
    pub fallbacks: u64,
    /// Lists of a whole resource or namespace served from the cache's objects.
    pub lists_cached: u64,
    /// Lists read from etcd because the cache could not serve them (off for the resource,
    /// not started, or not caught up with etcd within the wait).
    pub lists_etcd: u64,
    /// Reads of one object answered from the cache ([`crate::Store::get_cached`]).
    pub gets_cached: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_kube_apiserver_flags() {
        let sizes = WatchCacheOptions::parse_sizes(&[
            "services#5000".into(),
            " endpointslices.discovery.k8s.io#0".into(),
            String::new(),
        ])
        .expect("valid");
        let o = WatchCacheOptions {
            sizes,
            ..Default::default()
        };
        assert_eq!(o.size_for("core", "services"), 5000);
        assert_eq!(o.size_for("discovery.k8s.io", "endpointslices"), 0);
        assert_eq!(o.size_for("core", "pods"), DEFAULT_WATCH_CACHE_SIZE);
        assert_eq!(o.size_for("apps", "deployments"), DEFAULT_WATCH_CACHE_SIZE);
        let off = WatchCacheOptions {
            enabled: false,
            ..o
        };
        assert_eq!(off.size_for("core", "services"), 0);
        for bad in [
            "services",
            "services#x",
            "#5",
            "Services#5",
            "core/services#5",
        ] {
            let err = WatchCacheOptions::parse_sizes(&[bad.into()]).unwrap_err();
            assert!(err.contains("--watch-cache-sizes"), "{bad}: {err}");
        }
    }
}
