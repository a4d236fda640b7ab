//! Applying payloads to the kernel with `iptables-restore --noflush` / `ip6tables-restore`
//! (each table's section is one atomic commit), on the back end the host uses (`nft` or
//! `legacy`), optionally inside a named network namespace (`ip netns exec`). Also the hook
//! rules (`-C`/`-I`), the canary check, listing svcnet's chains and `--cleanup`. The only I/O
//! in this crate.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use crate::names::{CANARY, PREFIX};
use crate::payload::{Family, Hook, Payload, Table, split_args};
use crate::plan::{KernelChains, Plan};

/// Why an apply failed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// An iptables (or `ip`) binary is missing.
    #[error("{program} not found; install it (Debian/Ubuntu: `apt-get install {package}`)")]
    NotInstalled {
        program: String,
        package: &'static str,
    },
    /// The kernel or the tool rejected the command; for a restore, the failing table and
    /// those after it are unchanged.
    #[error("{program} failed (exit {status}): {stderr}")]
    Rejected {
        program: String,
        status: i32,
        stderr: String,
    },
    #[error("running {program}: {source}")]
    Io {
        program: String,
        source: std::io::Error,
    },
}

impl ApplyError {
    /// Whether retrying (with a full sync) may help; a missing binary will not fix itself.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, Self::NotInstalled { .. })
    }
}

/// The iptables back end: the nf_tables-based tools or the legacy x_tables ones. Rules
/// written with one are invisible to the other's tools, so svcnet uses the one the host
/// already uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Backend {
    Nft,
    Legacy,
}

impl Backend {
    pub const ALL: [Backend; 2] = [Backend::Nft, Backend::Legacy];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Nft => "nft",
            Self::Legacy => "legacy",
        }
    }

    /// The tool name, e.g. `ip6tables-legacy-restore`; `suffix` is "", "-save" or "-restore".
    pub fn program(self, family: Family, suffix: &str) -> String {
        format!("{}-{}{suffix}", family.command(), self.as_str())
    }
}

/// Kubelet's hint chains: their presence in one back end says which one the host uses.
const HINT_CHAINS: [&str; 2] = ["KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"];

/// Picks the back end from both back ends' `*-save` output, as kube-proxy's image does
/// (`iptables-wrapper`): a kubelet hint chain decides; else the legacy back end wins if it
/// holds at least 10 rules or more rules than the nft one; otherwise nft.
pub fn choose_backend(legacy_save: &str, nft_save: &str) -> Backend {
    let has_hint = |save: &str| {
        save.lines()
            .any(|l| HINT_CHAINS.iter().any(|h| l.starts_with(&format!(":{h} "))))
    };
    if has_hint(nft_save) {
        return Backend::Nft;
    }
    if has_hint(legacy_save) {
        return Backend::Legacy;
    }
    let rules = |save: &str| save.lines().filter(|l| l.starts_with('-')).count();
    let (legacy, nft) = (rules(legacy_save), rules(nft_save));
    if legacy >= 10 || legacy > nft {
        Backend::Legacy
    } else {
        Backend::Nft
    }
}

/// Parses `iptables-save` output into svcnet's chains per table.
pub fn parse_save_chains(save: &str) -> KernelChains {
    let mut out = KernelChains::new();
    let mut table = None;
    for line in save.lines() {
        if let Some(name) = line.strip_prefix('*') {
            table = Table::ALL.into_iter().find(|t| t.as_str() == name.trim());
        } else if let (Some(t), Some(decl)) = (table, line.strip_prefix(':'))
            && let Some(name) = decl.split_whitespace().next()
            && name.starts_with(PREFIX)
        {
            out.entry(t).or_default().insert(name.to_string());
        }
    }
    out
}

/// The restore text removing everything svcnet installed, from `iptables-save` output: the
/// jumps from built-in chains to svcnet's chains, then every svcnet chain. `None` when there is
/// nothing to remove.
pub fn cleanup_text(save: &str) -> Option<String> {
    let chains = parse_save_chains(save);
    let mut jumps: Vec<(Table, String)> = Vec::new();
    let mut table = None;
    for line in save.lines() {
        if let Some(name) = line.strip_prefix('*') {
            table = Table::ALL.into_iter().find(|t| t.as_str() == name.trim());
        } else if let (Some(t), Some(rest)) = (table, line.strip_prefix("-A ")) {
            let args = split_args(rest);
            let chain = args.first().map(String::as_str).unwrap_or_default();
            let target = crate::payload::Rule::new(chain, args[1.min(args.len())..].to_vec());
            if !chain.starts_with(PREFIX) && target.target().is_some_and(|t| t.starts_with(PREFIX))
            {
                jumps.push((t, rest.to_string()));
            }
        }
    }
    if chains.is_empty() && jumps.is_empty() {
        return None;
    }
    let mut text = String::new();
    for table in Table::ALL {
        let ours = chains.get(&table).cloned().unwrap_or_default();
        let hooks: Vec<&String> = jumps
            .iter()
            .filter(|(t, _)| *t == table)
            .map(|(_, r)| r)
            .collect();
        if ours.is_empty() && hooks.is_empty() {
            continue;
        }
        text.push_str(&format!("*{table}\n"));
        for c in &ours {
            text.push_str(&format!(":{c} - [0:0]\n"));
        }
        for r in hooks {
            text.push_str(&format!("-D {r}\n"));
        }
        for c in &ours {
            text.push_str(&format!("-X {c}\n"));
        }
        text.push_str("COMMIT\n");
    }
    Some(text)
}

/// Whether an `iptables -S` listing holds `hook` (same chain, comment and target).
fn hook_listed(listing: &str, hook: &Hook) -> bool {
    let comment = hook
        .rule
        .args
        .iter()
        .position(|a| a == "--comment")
        .and_then(|i| hook.rule.args.get(i + 1));
    let prefix = format!("-A {} ", hook.chain);
    listing
        .lines()
        .filter_map(|l| l.trim().strip_prefix(&prefix))
        .any(|rest| {
            let rule = crate::payload::Rule::new(hook.chain, split_args(rest));
            let same_comment = match comment {
                Some(c) => rule
                    .args
                    .windows(2)
                    .any(|w| w[0] == "--comment" && &w[1] == c),
                None => true,
            };
            same_comment && rule.target() == hook.rule.target()
        })
}

/// Adds `missing` hooks as inserts to the last section of their table (so they land in the
/// commit that declares their targets), in reverse order: each goes to position 1.
pub fn with_hooks(payload: &mut Payload, missing: &[Hook]) {
    for h in missing.iter().rev() {
        payload
            .last_mut(h.table)
            .inserts
            .push(crate::payload::Rule::new(h.chain, h.rule.args.clone()));
    }
}

/// The restore text of the nf_tables probe: declares and deletes a chain, which needs the
/// family's nf_tables table (`TABLE_ADD`) and leaves nothing of svcnet behind.
pub const NFT_PROBE: &str = "*filter\n:SVCNET-NFT-PROBE - [0:0]\n-X SVCNET-NFT-PROBE\nCOMMIT\n";

/// Runs the iptables tools of one back end, in the current or a named network namespace.
#[derive(Clone, Debug)]
pub struct IptablesExecutor {
    netns: Option<String>,
    backend: Backend,
    /// Why [`IptablesExecutor::detect`] chose the back end (`None`: given by the caller).
    why: Option<String>,
}

impl IptablesExecutor {
    pub fn new(netns: Option<String>, backend: Backend) -> Self {
        Self {
            netns,
            backend,
            why: None,
        }
    }

    /// An executor on the back end the host (or namespace) already uses, as kube-proxy's
    /// image picks it ([`choose_backend`]), except that nft is only chosen where the kernel
    /// has nf_tables for both families: a kernel without it (no `NF_TABLES_IPV4`/`IPV6`, as
    /// Debian's user-mode Linux) gets legacy, whatever the rule counts say. [`Self::why`]
    /// says which rule decided.
    pub fn detect(netns: Option<String>) -> Result<Self, ApplyError> {
        let probe = Self::new(netns.clone(), Backend::Nft);
        let save = |backend: Backend| {
            Family::ALL
                .iter()
                .map(|f| {
                    probe
                        .run(&backend.program(*f, "-save"), &[], None)
                        .unwrap_or_default()
                })
                .collect::<String>()
        };
        // Both tool sets must be runnable to compare; a missing nft one means legacy only.
        probe.run(&Backend::Nft.program(Family::V4, ""), &["--version"], None)?;
        let (legacy, nft) = (save(Backend::Legacy), save(Backend::Nft));
        let backend = choose_backend(&legacy, &nft);
        let why = match backend {
            Backend::Legacy => "the legacy back end holds the host's rules".to_string(),
            Backend::Nft => match probe.nft_missing() {
                None => "the kernel has nf_tables and the host's rules are not in legacy".into(),
                Some(why) => {
                    return Ok(Self {
                        netns,
                        backend: Backend::Legacy,
                        why: Some(why),
                    });
                }
            },
        };
        Ok(Self {
            netns,
            backend,
            why: Some(why),
        })
    }

    /// Why the kernel cannot take the nft back end (`None`: it can): a family whose
    /// nf_tables table cannot be created ([`NFT_PROBE`]).
    fn nft_missing(&self) -> Option<String> {
        Family::ALL.iter().find_map(|f| {
            let program = Backend::Nft.program(*f, "-restore");
            match self.run(&program, &["-w", "5", "--noflush"], Some(NFT_PROBE)) {
                Ok(_) => None,
                Err(e) => Some(format!(
                    "the kernel has no nf_tables for {} ({program}: {})",
                    match f {
                        Family::V4 => "ip",
                        Family::V6 => "ip6",
                    },
                    one_line(&e.to_string())
                )),
            }
        })
    }

    /// Why [`Self::detect`] chose [`Self::backend`] (`None` when the caller chose it).
    pub fn why(&self) -> Option<&str> {
        self.why.as_deref()
    }

    pub fn netns(&self) -> Option<&str> {
        self.netns.as_deref()
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    fn command(&self, program: &str) -> Command {
        svcnet_netns::command(self.netns.as_deref(), program)
    }

    fn run(&self, program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, ApplyError> {
        let mut cmd = self.command(program);
        cmd.args(args);
        let out = svcnet_netns::output_with_input(&mut cmd, stdin).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                let (program, package) = if self.netns.is_some() {
                    ("ip".to_string(), "iproute2")
                } else {
                    (program.to_string(), "iptables")
                };
                ApplyError::NotInstalled { program, package }
            }
            _ => ApplyError::Io {
                program: program.to_string(),
                source: e,
            },
        })?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
            if stderr.contains(&format!("exec of \"{program}\" failed")) {
                return Err(ApplyError::NotInstalled {
                    program: program.to_string(),
                    package: "iptables",
                });
            }
            return Err(ApplyError::Rejected {
                program: program.to_string(),
                status: out.status.code().unwrap_or(-1),
                stderr,
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `iptables-restore -w 5 --noflush` of a payload. An empty payload is a no-op.
    pub fn restore(&self, payload: &Payload) -> Result<(), ApplyError> {
        if payload.is_empty() {
            return Ok(());
        }
        self.restore_text(payload.family, &payload.to_string())
    }

    fn restore_text(&self, family: Family, text: &str) -> Result<(), ApplyError> {
        let program = self.backend.program(family, "-restore");
        self.run(&program, &["-w", "5", "--noflush"], Some(text))
            .map(|_| ())
    }

    fn iptables(&self, family: Family, args: &[&str]) -> Result<String, ApplyError> {
        self.run(&self.backend.program(family, ""), args, None)
    }

    /// The hooks not yet installed, in `hooks` order. Existing rules are read with one
    /// listing per built-in chain (nft back end: `-S <chain>` reads only that chain) or per
    /// table (legacy: any listing copies the whole table from the kernel, so one per table). A
    /// hook is present when its chain has a rule with the same comment and target (robust to
    /// how a version of iptables prints the other matches).
    pub fn missing_hooks(&self, family: Family, hooks: &[Hook]) -> Result<Vec<Hook>, ApplyError> {
        let mut listings: BTreeMap<(Table, &str), String> = BTreeMap::new();
        for h in hooks {
            let key = self.listing_key(h);
            if let std::collections::btree_map::Entry::Vacant(e) = listings.entry(key) {
                let mut args = vec!["-w", "5", "-t", h.table.as_str(), "-S"];
                if !key.1.is_empty() {
                    args.push(key.1);
                }
                e.insert(self.iptables(family, &args)?);
            }
        }
        Ok(hooks
            .iter()
            .filter(|h| {
                let listing = listings
                    .get(&self.listing_key(h))
                    .map_or("", String::as_str);
                !hook_listed(listing, h)
            })
            .cloned()
            .collect())
    }

    /// Ensures each hook outside a restore (`-I <chain> 1` for the missing ones, in reverse
    /// order so a fresh built-in chain ends up in the listed order). Returns how many were
    /// added.
    pub fn ensure_hooks(&self, family: Family, hooks: &[Hook]) -> Result<usize, ApplyError> {
        let missing = self.missing_hooks(family, hooks)?;
        for h in missing.iter().rev() {
            let mut insert = vec!["-w", "5", "-t", h.table.as_str(), "-I", h.chain, "1"];
            insert.extend(h.rule.args.iter().map(String::as_str));
            self.iptables(family, &insert)?;
        }
        Ok(missing.len())
    }

    fn listing_key(&self, h: &Hook) -> (Table, &'static str) {
        match self.backend {
            Backend::Nft => (h.table, h.chain),
            Backend::Legacy => (h.table, ""),
        }
    }

    /// Applies a plan. For full syncs, the missing hooks are inserted by the same restore, in
    /// the commit that (re)declares the chains they jump to.
    pub fn apply(&self, plan: &Plan) -> Result<(), ApplyError> {
        if plan.hooks.is_empty() {
            return self.restore(&plan.payload);
        }
        let missing = self.missing_hooks(plan.payload.family, &plan.hooks)?;
        if missing.is_empty() {
            return self.restore(&plan.payload);
        }
        let mut payload = plan.payload.clone();
        with_hooks(&mut payload, &missing);
        self.restore(&payload)
    }

    /// `iptables-save` of every table.
    pub fn save(&self, family: Family) -> Result<String, ApplyError> {
        self.run(&self.backend.program(family, "-save"), &[], None)
    }

    /// svcnet's chains present in the kernel (costly with many rules: only when the kernel
    /// state is unknown).
    pub fn kernel_chains(&self, family: Family) -> Result<KernelChains, ApplyError> {
        Ok(parse_save_chains(&self.save(family)?))
    }

    /// Whether the canary chains still exist; when one is gone, someone flushed the tables
    /// and a full resync is due. Checked before every partial sync, so only where it is
    /// cheap: mangle and filter (small tables), and nat on the nft back end (which reads just
    /// the one chain). The legacy back end copies the whole nat table for any listing (0.8 s
    /// at 30k services), so there a nat-only flush is repaired by the periodic full resync.
    pub fn canary_present(&self, family: Family) -> Result<bool, ApplyError> {
        let tables: &[Table] = match self.backend {
            Backend::Nft => &[Table::Mangle, Table::Filter, Table::Nat],
            Backend::Legacy => &[Table::Mangle, Table::Filter],
        };
        for table in tables {
            match self.iptables(family, &["-w", "5", "-t", table.as_str(), "-S", CANARY]) {
                Ok(_) => {}
                Err(ApplyError::Rejected { .. }) => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Removes everything svcnet installed in this back end and family (`--cleanup`, and
    /// when switching modes). `Ok(false)` when there was nothing.
    pub fn cleanup(&self, family: Family) -> Result<bool, ApplyError> {
        match cleanup_text(&self.save(family)?) {
            Some(text) => self.restore_text(family, &text).map(|_| true),
            None => Ok(false),
        }
    }
}

/// A tool's multi-line message on one line.
fn one_line(text: &str) -> String {
    text.split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// Removes svcnet's iptables rules from both back ends and both families (as `svcnet proxy
/// --cleanup` and a switch to another mode do). Back ends whose tools are missing are skipped.
/// Returns the (back end, family) pairs that had something to remove.
pub fn cleanup_all(netns: Option<&str>) -> Result<BTreeSet<(Backend, Family)>, ApplyError> {
    let mut cleaned = BTreeSet::new();
    for backend in Backend::ALL {
        let exec = IptablesExecutor::new(netns.map(str::to_string), backend);
        for family in Family::ALL {
            match exec.cleanup(family) {
                Ok(true) => {
                    cleaned.insert((backend, family));
                }
                Ok(false) | Err(ApplyError::NotInstalled { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(cleaned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_choice_follows_kube_proxy_wrapper() {
        let rules = |n: usize| "*filter\n".to_string() + &"-A INPUT -j ACCEPT\n".repeat(n);
        assert_eq!(choose_backend("", ""), Backend::Nft);
        assert_eq!(choose_backend(&rules(3), &rules(1)), Backend::Legacy);
        assert_eq!(choose_backend(&rules(1), &rules(3)), Backend::Nft);
        assert_eq!(choose_backend(&rules(12), &rules(30)), Backend::Legacy);
        let hint = "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\n";
        assert_eq!(choose_backend(&rules(12), hint), Backend::Nft);
        assert_eq!(choose_backend(hint, &rules(5)), Backend::Legacy);
    }

    #[test]
    fn hooks_are_recognised_in_listings() {
        let hooks = crate::render::hooks();
        let listing = "-P FORWARD ACCEPT\n\
            -A FORWARD -m conntrack --ctstate NEW -m comment --comment \"svcnet load balancer firewall\" -j SVCNET-PROXY-FIREWALL\n\
            -A FORWARD -m comment --comment \"svcnet forwarding rules\" -j SVCNET-FORWARD\n\
            -A FORWARD -j OTHER\n";
        let present: Vec<&str> = hooks
            .iter()
            .filter(|h| h.chain == "FORWARD" && hook_listed(listing, h))
            .filter_map(|h| h.rule.target())
            .collect();
        assert_eq!(present, ["SVCNET-PROXY-FIREWALL", "SVCNET-FORWARD"]);
        // The same comment in another chain, or another target, does not count.
        let input = hooks.iter().find(|h| h.chain == "INPUT").unwrap();
        assert!(!hook_listed(listing, input));
    }

    #[test]
    fn missing_hooks_go_into_the_restore_in_order() {
        let mut fresh = crate::FakeIptables::new();
        let plan = crate::Renderer::new(Family::V4).plan_full(
            &svcnet_proxy::DesiredFamily {
                node: svcnet_proxy::DesiredNode::new(
                    svcnet_proxy::IpFamily::V4,
                    &svcnet_proxy::CoreConfig::default(),
                ),
                services: Default::default(),
            },
            None,
        );
        let mut payload = plan.payload.clone();
        with_hooks(&mut payload, &plan.hooks);
        fresh.apply(&payload).unwrap();
        let mut ensured = crate::FakeIptables::new();
        ensured.apply(&plan.payload).unwrap();
        for h in &plan.hooks {
            ensured.ensure_hook(h).unwrap();
        }
        // ensure_hook inserts at the head in list order, so the fake's order is reversed
        // relative to the executor's (which inserts in reverse); compare as sets per chain.
        for table in Table::ALL {
            for (chain, rules) in fresh.table(table) {
                let mut a = rules.clone();
                let mut b = ensured.table(table).get(chain).cloned().unwrap_or_default();
                a.sort();
                b.sort();
                assert_eq!(a, b, "{table} {chain}");
            }
        }
        let forward: Vec<String> = fresh.table(Table::Filter)["FORWARD"]
            .iter()
            .filter_map(|r| r.last().cloned())
            .collect();
        assert_eq!(
            forward,
            [
                "SVCNET-PROXY-FIREWALL",
                "SVCNET-FORWARD",
                "SVCNET-SERVICES",
                "SVCNET-EXTERNAL-SERVICES"
            ]
        );
    }

    #[test]
    fn cleanup_removes_hooks_and_chains_only() {
        let save = "*nat\n:PREROUTING ACCEPT [0:0]\n:SVCNET-SERVICES - [0:0]\n:OTHER - [0:0]\n\
            -A PREROUTING -m comment --comment \"svcnet service portals\" -j SVCNET-SERVICES\n\
            -A PREROUTING -j OTHER\n-A SVCNET-SERVICES -j RETURN\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n";
        assert_eq!(
            cleanup_text(save).unwrap(),
            "*nat\n:SVCNET-SERVICES - [0:0]\n-D PREROUTING -m comment --comment \"svcnet service portals\" -j SVCNET-SERVICES\n-X SVCNET-SERVICES\nCOMMIT\n"
        );
        assert_eq!(
            cleanup_text("*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n"),
            None
        );
    }
}
