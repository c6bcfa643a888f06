//! Loopback ports for processes that are told a port now and bind it a moment later
//! (the control plane's components, operator replicas, test servers).
//!
//! A port from `bind(127.0.0.1:0)` comes from the kernel's ephemeral range, the range
//! it also takes the local port of every outgoing connection from: on a busy machine
//! one of those connections can take the port before the process binds it, and the
//! process then fails to start. So these ports come from below the ephemeral range
//! (`/proc/sys/net/ipv4/ip_local_port_range`), which the kernel never hands out by
//! itself, at random (test processes run side by side), each checked free by binding
//! it. Where that range is too small, they come from `bind(0)` as before.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};

/// The lowest port handed out: below it live well-known services.
const FLOOR: u16 = 10_000;

/// A loopback port that is free now.
pub fn free() -> io::Result<u16> {
    let ceiling = ephemeral_start().unwrap_or(32_768);
    if ceiling > FLOOR + 1_000 {
        for _ in 0..64 {
            let port = FLOOR + u16::try_from(random() % u64::from(ceiling - FLOOR)).unwrap_or(0);
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// `127.0.0.1:<a free port>`.
pub fn free_address() -> io::Result<String> {
    Ok(format!("127.0.0.1:{}", free()?))
}

/// `n` distinct free loopback ports.
pub fn free_distinct(n: usize) -> io::Result<Vec<u16>> {
    let mut ports = Vec::with_capacity(n);
    while ports.len() < n {
        let port = free()?;
        if !ports.contains(&port) {
            ports.push(port);
        }
    }
    Ok(ports)
}

fn ephemeral_start() -> Option<u16> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A random number: std's per-process random hash keys, and a counter so that calls in
/// one process differ.
fn random() -> u64 {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(CALLS.fetch_add(1, Ordering::Relaxed));
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_come_from_below_the_ephemeral_range_and_are_distinct() {
        let ports = free_distinct(20).unwrap();
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 20);
        let ceiling = ephemeral_start().unwrap_or(32_768);
        for port in ports {
            if ceiling > FLOOR + 1_000 {
                assert!(
                    (FLOOR..ceiling).contains(&port),
                    "{port} outside {FLOOR}..{ceiling}"
                );
            }
        }
    }
}
