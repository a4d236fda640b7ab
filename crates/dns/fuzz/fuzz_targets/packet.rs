//! Arbitrary bytes through the DNS server's packet path: the function the UDP loop calls on
//! every datagram (answer cache, parsing, zone, encoders) and the TCP side's parse–answer–encode.
//! Nothing may panic, a question is never silently dropped, and every answer echoes the ID, is
//! a response, fits its transport and parses. Each input goes through UDP twice, so the second
//! answer may come from the answer cache: ID, flags and rcode must match the first, and the
//! section counts too unless the answer was truncated (how many shuffled records fit varies).

#![no_main]

use std::sync::{LazyLock, Mutex};

use libfuzzer_sys::fuzz_target;
use svcnet_dns::server::PacketPath;

static PATH: LazyLock<Mutex<PacketPath>> = LazyLock::new(|| Mutex::new(PacketPath::fixture()));

fuzz_target!(|data: &[u8]| {
    let mut path = PATH.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let first = match path.udp(data) {
        Ok(answer) => answer.map(|a| a[..12].to_vec()),
        Err(problem) => panic!("UDP: {problem}"),
    };
    let second = match path.udp(data) {
        Ok(answer) => answer.map(|a| a[..12].to_vec()),
        Err(problem) => panic!("UDP, again: {problem}"),
    };
    if let (Some(first), Some(second)) = (&first, &second) {
        assert_eq!(
            first[..4],
            second[..4],
            "a repeated question gets the same flags"
        );
        if first[2] & 0x02 == 0 {
            assert_eq!(first, second, "a whole answer has the same counts again");
        }
    } else {
        assert_eq!(
            first.is_some(),
            second.is_some(),
            "answered once, answered again"
        );
    }
    if let Err(problem) = path.tcp(data) {
        panic!("TCP: {problem}");
    }
});
