//! The Linux kernel's `jhash` (Bob Jenkins' lookup3, `include/linux/jhash.h`) and the exact
//! evaluation of nftables' `jhash <expr> mod N seed S` (`net/netfilter/nft_hash.c`), so a
//! kernel rule and this crate map a flow to the same bucket.
//!
//! nftables loads each component of the hashed expression into 32-bit registers: an IPv4
//! address takes 4 bytes, an IPv6 address 16, a port 2 bytes in network order followed by two
//! zero bytes (the payload expression clears the rest of a partially written register). The
//! [`FlowKeyBytes`] builders lay keys out the same way. The result is scaled into `0..N` with
//! `reciprocal_scale` (a multiply and shift, not `%`).

use std::net::IpAddr;

/// jhash's initial value (`JHASH_INITVAL`).
const INITVAL: u32 = 0xdead_beef;

/// Seed of the source-hashing (`sh`) flow hash.
pub const SEED_SOURCE: u32 = 0x5356_4e01;
/// Seed of the destination-hashing (`dh`) flow hash.
pub const SEED_DESTINATION: u32 = 0x5356_4e02;
/// Seed of the Maglev flow hash (which table slot a flow reads).
pub const SEED_MAGLEV_FLOW: u32 = 0x5356_4e03;
/// Seed of a Maglev backend's permutation offset.
pub const SEED_MAGLEV_OFFSET: u32 = 0x5356_4e04;
/// Seed of a Maglev backend's permutation skip.
pub const SEED_MAGLEV_SKIP: u32 = 0x5356_4e05;

#[inline]
fn mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(4);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(6);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(8);
    *b = b.wrapping_add(*a);
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(16);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(19);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(4);
    *b = b.wrapping_add(*a);
}

#[inline]
fn final_mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(14));
    *a ^= *c;
    *a = a.wrapping_sub(c.rotate_left(11));
    *b ^= *a;
    *b = b.wrapping_sub(a.rotate_left(25));
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(16));
    *a ^= *c;
    *a = a.wrapping_sub(c.rotate_left(4));
    *b ^= *a;
    *b = b.wrapping_sub(a.rotate_left(14));
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(24));
}

/// `jhash(key, length, initval)` as the kernel computes it on a little-endian machine (the
/// 12-byte blocks are read as native-endian words; every Linux target svcnet runs on is
/// little-endian, and the tail is read byte by byte, which is endian-independent).
pub fn jhash(key: &[u8], seed: u32) -> u32 {
    let len = key.len() as u32;
    let mut a = INITVAL.wrapping_add(len).wrapping_add(seed);
    let mut b = a;
    let mut c = a;
    let mut k = key;
    let word = |s: &[u8], i: usize| u32::from_le_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]]);
    while k.len() > 12 {
        a = a.wrapping_add(word(k, 0));
        b = b.wrapping_add(word(k, 4));
        c = c.wrapping_add(word(k, 8));
        mix(&mut a, &mut b, &mut c);
        k = &k[12..];
    }
    if k.is_empty() {
        return c;
    }
    let byte = |i: usize, shift: u32| k.get(i).map_or(0, |v| u32::from(*v) << shift);
    c = c
        .wrapping_add(byte(11, 24))
        .wrapping_add(byte(10, 16))
        .wrapping_add(byte(9, 8))
        .wrapping_add(byte(8, 0));
    b = b
        .wrapping_add(byte(7, 24))
        .wrapping_add(byte(6, 16))
        .wrapping_add(byte(5, 8))
        .wrapping_add(byte(4, 0));
    a = a
        .wrapping_add(byte(3, 24))
        .wrapping_add(byte(2, 16))
        .wrapping_add(byte(1, 8))
        .wrapping_add(byte(0, 0));
    final_mix(&mut a, &mut b, &mut c);
    c
}

/// The kernel's `reciprocal_scale(val, n)`: maps a 32-bit hash into `0..n`.
#[inline]
pub fn reciprocal_scale(val: u32, n: u32) -> u32 {
    ((u64::from(val) * u64::from(n)) >> 32) as u32
}

/// What `jhash <key> mod n seed <seed>` evaluates to in nftables (offset 0).
pub fn nft_jhash(key: &[u8], seed: u32, n: u32) -> u32 {
    reciprocal_scale(jhash(key, seed), n)
}

/// A hash key laid out as nftables' registers hold it (at most an IPv6 address and a port).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowKeyBytes {
    buf: [u8; 20],
    len: usize,
}

impl FlowKeyBytes {
    fn empty() -> Self {
        Self {
            buf: [0; 20],
            len: 0,
        }
    }

    fn push_ip(mut self, ip: IpAddr) -> Self {
        match ip.to_canonical() {
            IpAddr::V4(v4) => {
                self.buf[self.len..self.len + 4].copy_from_slice(&v4.octets());
                self.len += 4;
            }
            IpAddr::V6(v6) => {
                self.buf[self.len..self.len + 16].copy_from_slice(&v6.octets());
                self.len += 16;
            }
        }
        self
    }

    fn push_port(mut self, port: u16) -> Self {
        self.buf[self.len..self.len + 2].copy_from_slice(&port.to_be_bytes());
        // The other two bytes of the register stay zero.
        self.len += 4;
        self
    }

    /// `ip saddr` / `ip6 saddr` (or `daddr`).
    pub fn addr(ip: IpAddr) -> Self {
        Self::empty().push_ip(ip)
    }

    /// `ip saddr . th sport` (or `daddr . dport`).
    pub fn addr_port(ip: IpAddr, port: u16) -> Self {
        Self::empty().push_ip(ip).push_port(port)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_layout_matches_nft_registers() {
        let k = FlowKeyBytes::addr_port("10.0.0.1".parse().unwrap(), 0x1234);
        assert_eq!(k.as_bytes(), &[10, 0, 0, 1, 0x12, 0x34, 0, 0]);
        let k = FlowKeyBytes::addr("::ffff:10.0.0.1".parse().unwrap());
        assert_eq!(
            k.as_bytes(),
            &[10, 0, 0, 1],
            "v4-mapped addresses hash as IPv4"
        );
        assert_eq!(FlowKeyBytes::addr("fd00::1".parse().unwrap()).len, 16);
    }

    #[test]
    fn jhash_known_values() {
        // lookup3's published self-test vectors (hashlittle, which jhash equals on x86):
        // hashlittle("", 0) = 0xdeadbeef and "Four score and seven years ago" with 0 and 1.
        assert_eq!(jhash(b"", 0), 0xdead_beef);
        assert_eq!(jhash(b"Four score and seven years ago", 0), 0x1777_0551);
        assert_eq!(jhash(b"Four score and seven years ago", 1), 0xcd62_8161);
    }

    #[test]
    fn reciprocal_scale_covers_range() {
        assert_eq!(reciprocal_scale(0, 251), 0);
        assert_eq!(reciprocal_scale(u32::MAX, 251), 250);
        assert_eq!(reciprocal_scale(u32::MAX / 2 + 1, 2), 1);
    }
}
