//! An in-memory IPVS table that answers as the kernel's does (`ip_vs_ctl.c`): the same
//! errnos for a duplicate service (EEXIST), a missing service (ESRCH), a missing destination
//! or an unknown scheduler (ENOENT), a bad IPv6 netmask, a too long scheduler name or a
//! destination of the other family under NAT (EINVAL), a weight above `i32::MAX` or a lower
//! threshold above the upper (ERANGE). Dumps carry [`F_HASHED`] as the kernel's do. For pure
//! tests of the dataplane's plans; the kernel tier checks the same rules against IPVS itself.

use std::collections::BTreeMap;

use crate::types::{
    Dest, DestKey, F_HASHED, Forward, Op, Rejected, SCHED_NAME_MAX, SCHEDULERS, Service,
    ServiceKey, USER_FLAGS,
};
use crate::{Ipvs, IpvsError};

/// The fake table.
#[derive(Clone, Debug, Default)]
pub struct FakeIpvs {
    services: BTreeMap<ServiceKey, (Service, BTreeMap<DestKey, Dest>)>,
    /// Operations applied (accepted ones), for tests that count the work of a sync.
    pub applied: usize,
}

fn check_service(s: &Service) -> Result<(), i32> {
    if s.scheduler.len() > SCHED_NAME_MAX {
        return Err(libc::EINVAL);
    }
    if !SCHEDULERS.contains(&s.scheduler.as_str()) {
        return Err(libc::ENOENT);
    }
    if s.key.addr.is_ipv6() && !(1..=128).contains(&s.netmask) {
        return Err(libc::EINVAL);
    }
    Ok(())
}

fn check_dest(svc: &Service, d: &Dest) -> Result<(), i32> {
    if d.weight > i32::MAX as u32 {
        return Err(libc::ERANGE);
    }
    if d.lower_threshold > d.upper_threshold {
        return Err(libc::ERANGE);
    }
    if d.addr.is_ipv6() != svc.key.addr.is_ipv6() && d.forward == Forward::Masq {
        return Err(libc::EINVAL);
    }
    Ok(())
}

impl FakeIpvs {
    pub fn new() -> Self {
        Self::default()
    }

    fn apply_one(&mut self, op: &Op) -> Result<(), i32> {
        match op {
            Op::AddService(s) => {
                check_service(s)?;
                if self.services.contains_key(&s.key) {
                    return Err(libc::EEXIST);
                }
                let mut s = s.clone();
                s.flags = (s.flags & USER_FLAGS) | F_HASHED;
                self.services.insert(s.key, (s, BTreeMap::new()));
            }
            Op::EditService(s) => {
                check_service(s)?;
                let (old, _) = self.services.get_mut(&s.key).ok_or(libc::ESRCH)?;
                *old = s.clone();
                old.flags = (s.flags & USER_FLAGS) | F_HASHED;
            }
            Op::DelService(k) => {
                self.services.remove(k).ok_or(libc::ESRCH)?;
            }
            Op::AddDest(k, d) => {
                let (svc, dests) = self.services.get_mut(k).ok_or(libc::ESRCH)?;
                check_dest(svc, d)?;
                if dests.contains_key(&d.key()) {
                    return Err(libc::EEXIST);
                }
                let mut d = d.clone();
                (d.active_conns, d.inactive_conns, d.persist_conns) = (0, 0, 0);
                dests.insert(d.key(), d);
            }
            Op::EditDest(k, d) => {
                let (svc, dests) = self.services.get_mut(k).ok_or(libc::ESRCH)?;
                check_dest(svc, d)?;
                let old = dests.get_mut(&d.key()).ok_or(libc::ENOENT)?;
                old.weight = d.weight;
                old.forward = d.forward;
                old.upper_threshold = d.upper_threshold;
                old.lower_threshold = d.lower_threshold;
            }
            Op::DelDest(k, d) => {
                let (_, dests) = self.services.get_mut(k).ok_or(libc::ESRCH)?;
                dests.remove(d).ok_or(libc::ENOENT)?;
            }
            Op::Flush => self.services.clear(),
        }
        Ok(())
    }

    /// Sets a real server's connection counters (what traffic would do), for drain tests.
    /// Returns whether the real server exists.
    pub fn set_conns(&mut self, k: &ServiceKey, d: &DestKey, active: u32, inactive: u32) -> bool {
        match self.services.get_mut(k).and_then(|(_, ds)| ds.get_mut(d)) {
            Some(dest) => {
                dest.active_conns = active;
                dest.inactive_conns = inactive;
                true
            }
            None => false,
        }
    }

    /// `ipvsadm -Sn`-like listing: one `-A` line per service and one `-a` per real server,
    /// sorted; for snapshot tests.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        for (s, dests) in self.services.values() {
            let mut s = s.clone();
            s.flags &= USER_FLAGS;
            out.push_str(&Op::AddService(s.clone()).to_string());
            out.push('\n');
            for d in dests.values() {
                out.push_str(&Op::AddDest(s.key, d.clone()).to_string());
                out.push('\n');
            }
        }
        out
    }
}

impl Ipvs for FakeIpvs {
    fn apply(&mut self, ops: &[Op]) -> Result<(), IpvsError> {
        let mut first = None;
        for op in ops {
            match self.apply_one(op) {
                Ok(()) => self.applied += 1,
                Err(errno) => {
                    first.get_or_insert(Rejected {
                        op: op.to_string(),
                        errno,
                    });
                }
            }
        }
        match first {
            Some(r) => Err(IpvsError::Rejected(r)),
            None => Ok(()),
        }
    }

    fn services(&mut self) -> Result<Vec<Service>, IpvsError> {
        Ok(self.services.values().map(|(s, _)| s.clone()).collect())
    }

    fn dests(&mut self, key: &ServiceKey) -> Result<Vec<Dest>, IpvsError> {
        // The kernel's dump of a missing service is empty, not an error.
        Ok(self
            .services
            .get(key)
            .map(|(_, dests)| dests.values().cloned().collect())
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Protocol;

    #[test]
    fn rejections_and_dump() {
        let k = ServiceKey::new(
            Protocol::Tcp,
            std::net::Ipv4Addr::new(10, 96, 0, 1).into(),
            443,
        );
        let d = Dest::masq(std::net::Ipv4Addr::new(10, 244, 1, 2).into(), 6443, 1);
        let mut f = FakeIpvs::new();
        let errno = |r: Result<(), IpvsError>| match r {
            Err(IpvsError::Rejected(r)) => Some(r.errno),
            _ => None,
        };
        assert_eq!(
            errno(f.apply(&[Op::AddDest(k, d.clone())])),
            Some(libc::ESRCH)
        );
        let svc = Service::new(k, "rr");
        assert_eq!(errno(f.apply(&[Op::AddService(svc.clone())])), None);
        assert_eq!(errno(f.apply(&[Op::AddService(svc)])), Some(libc::EEXIST));
        assert_eq!(errno(f.apply(&[Op::AddDest(k, d.clone())])), None);
        assert_eq!(
            errno(f.apply(&[Op::DelDest(
                k,
                DestKey {
                    addr: d.addr,
                    port: 1
                }
            )])),
            Some(libc::ENOENT)
        );
        assert_eq!(
            f.dump(),
            "-A -t 10.96.0.1:443 -s rr\n-a -t 10.96.0.1:443 -r 10.244.1.2:6443 -m -w 1\n"
        );
        assert!(f.set_conns(&k, &d.key(), 1, 2));
        assert_eq!(f.dests(&k).map(|ds| ds[0].active_conns).ok(), Some(1));
    }
}
