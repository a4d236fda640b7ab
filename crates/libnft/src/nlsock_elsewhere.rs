//! The nf_tables netlink socket where there is no nf_tables (not Linux): it cannot be opened,
//! so every batch and generation request answers with that error.

use std::io;

use crate::netlink::Batch;

/// No socket can exist here (the type has no values).
pub(crate) enum NfSocket {}

impl NfSocket {
    pub(crate) fn open() -> io::Result<Self> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "nf_tables netlink exists on Linux only",
        ))
    }

    pub(crate) fn send(&mut self, _batch: Batch) -> Result<(), crate::Error> {
        match *self {}
    }

    pub(crate) fn generation(&mut self) -> Result<u32, crate::Error> {
        match *self {}
    }
}
