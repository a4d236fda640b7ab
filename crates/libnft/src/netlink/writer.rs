//! Netlink messages and nf_tables attributes, written into one buffer.

use super::rules::Verdict;

const NLA_F_NESTED: u16 = 0x8000;
pub(super) const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_IMMEDIATE_DREG: u16 = 1;
const NFTA_IMMEDIATE_DATA: u16 = 2;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
/// The verdict register.
const NFT_REG_VERDICT: u32 = 0;

/// Netlink messages and attributes, written into one buffer.
#[derive(Default)]
pub(super) struct Writer {
    pub(super) bytes: Vec<u8>,
    pub(super) starts: Vec<usize>,
    pub(super) what: Vec<String>,
}

impl Writer {
    /// A message header (its length and sequence number filled in later) and nfgenmsg.
    pub(super) fn begin(&mut self, kind: u16, flags: u16, family: u8, what: &str) {
        self.starts.push(self.bytes.len());
        self.what.push(what.to_string());
        self.bytes.extend_from_slice(&0u32.to_ne_bytes());
        self.bytes.extend_from_slice(&kind.to_ne_bytes());
        self.bytes.extend_from_slice(&flags.to_ne_bytes());
        self.bytes.extend_from_slice(&0u32.to_ne_bytes()); // sequence number
        self.bytes.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel
        // nfgenmsg: family, version 0 (NFNETLINK_V0), res_id.
        self.bytes.extend_from_slice(&[family, 0, 0, 0]);
    }

    pub(super) fn end(&mut self) {
        let start = self.starts.last().copied().unwrap_or(0);
        let len = u32::try_from(self.bytes.len() - start).unwrap_or(u32::MAX);
        self.bytes[start..start + 4].copy_from_slice(&len.to_ne_bytes());
    }

    fn pad(&mut self) {
        while !self.bytes.len().is_multiple_of(4) {
            self.bytes.push(0);
        }
    }

    pub(super) fn attr(&mut self, kind: u16, data: &[u8]) {
        let len = u16::try_from(4 + data.len()).unwrap_or(u16::MAX);
        self.bytes.extend_from_slice(&len.to_ne_bytes());
        self.bytes.extend_from_slice(&kind.to_ne_bytes());
        self.bytes.extend_from_slice(data);
        self.pad();
    }

    /// A NUL-terminated string.
    pub(super) fn str(&mut self, kind: u16, s: &str) {
        let mut data = s.as_bytes().to_vec();
        data.push(0);
        self.attr(kind, &data);
    }

    /// A 32-bit value in network order (nf_tables' convention).
    pub(super) fn u32(&mut self, kind: u16, v: u32) {
        self.attr(kind, &v.to_be_bytes());
    }

    pub(super) fn nest(&mut self, kind: u16) -> usize {
        let at = self.bytes.len();
        self.bytes.extend_from_slice(&0u16.to_ne_bytes());
        self.bytes
            .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        at
    }

    pub(super) fn close(&mut self, at: usize) {
        let len = u16::try_from(self.bytes.len() - at).unwrap_or(u16::MAX);
        self.bytes[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    }

    pub(super) fn expr(&mut self, name: &str, data: impl FnOnce(&mut Writer)) {
        let elem = self.nest(NFTA_LIST_ELEM);
        self.str(NFTA_EXPR_NAME, name);
        let d = self.nest(NFTA_EXPR_DATA);
        data(self);
        self.close(d);
        self.close(elem);
    }

    pub(super) fn immediate(&mut self, v: &Verdict) {
        self.expr("immediate", |w| {
            w.u32(NFTA_IMMEDIATE_DREG, NFT_REG_VERDICT);
            let d = w.nest(NFTA_IMMEDIATE_DATA);
            w.verdict(v);
            w.close(d);
        });
    }

    pub(super) fn verdict(&mut self, v: &Verdict) {
        let n = self.nest(NFTA_DATA_VERDICT);
        match v {
            Verdict::Code(code) => self.u32(NFTA_VERDICT_CODE, *code),
            Verdict::To(code, chain) => {
                self.attr(NFTA_VERDICT_CODE, &code.to_be_bytes());
                self.str(NFTA_VERDICT_CHAIN, chain);
            }
        }
        self.close(n);
    }
}
