//! Which new connection gets a slot: the global cap, a cap per peer address, and a reserve that
//! only a peer holding no connection may enter.
//!
//! The global cap alone lets one client take every slot and keep taking each one that frees, so
//! a liveness probe (the kubelet's, from another address) finds the server full and the
//! container is restarted. The per-peer cap bounds what one address can hold; the reserve keeps
//! the last slots for addresses that hold none yet, so that even several addresses that reach
//! their caps together leave room for a probe. A flood beats both only from more addresses than
//! the reserve has slots, each one holding a connection; what may connect at all is the job of
//! a network policy.
//!
//! A server that shares its network namespace with code it does not trust (the agent's, with
//! its tasks) counts every connection from its own host -- any loopback address, or the very
//! address it arrives at -- as one peer ([`one_peer_for_this_host`]): every `127.x` address is
//! a process's for the asking, so counted apart they would let a task hold every slot from as
//! many addresses as it likes, and fail the container's liveness probe at will.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Why a connection was closed at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Every slot is taken.
    Full,
    /// This address holds its share already.
    PeerLimit,
    /// Only the reserve is left, and this address holds a connection already.
    ReserveOnly,
}

impl Refusal {
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::Full => "connection limit reached",
            Refusal::PeerLimit => "per-peer connection limit reached",
            Refusal::ReserveOnly => "only the reserve is left, for addresses without a connection",
        }
    }
}

pub struct Admission {
    /// One permit per slot: a connection holds one until it ends, so "all permits back" is
    /// "every connection ended".
    permits: Arc<Semaphore>,
    max_connections: usize,
    per_peer: usize,
    reserved: usize,
    held_by_peer: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// A connection's slot: dropping it (the connection's task ending) is the only way the slot and
/// the peer's share are given back.
pub struct Ticket {
    _permit: OwnedSemaphorePermit,
    peer: IpAddr,
    held_by_peer: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut held = lock(&self.held_by_peer);
        if let Some(count) = held.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.peer);
            }
        }
    }
}

impl Admission {
    pub fn new(max_connections: usize, per_peer: usize, reserved: usize) -> Self {
        Admission {
            permits: Arc::new(Semaphore::new(max_connections)),
            max_connections,
            per_peer,
            reserved,
            held_by_peer: Arc::default(),
        }
    }

    /// A slot for a connection from `peer`, or why there is none. Called by the accept loop
    /// alone: slots are only taken here, so what it sees free stays free until it takes one.
    pub fn admit(&self, peer: IpAddr) -> Result<Ticket, Refusal> {
        // An IPv4 client of a dual-stack listener is one peer whichever form it arrives in.
        let peer = peer.to_canonical();
        let mut held = lock(&self.held_by_peer);
        let holds = held.get(&peer).copied().unwrap_or(0);
        if holds >= self.per_peer {
            return Err(Refusal::PeerLimit);
        }
        let free = self.permits.available_permits();
        if free == 0 {
            return Err(Refusal::Full);
        }
        if free <= self.reserved && holds > 0 {
            return Err(Refusal::ReserveOnly);
        }
        let permit = self
            .permits
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refusal::Full)?;
        *held.entry(peer).or_insert(0) += 1;
        Ok(Ticket {
            _permit: permit,
            peer,
            held_by_peer: self.held_by_peer.clone(),
        })
    }

    /// Completes once every connection has ended (after the listener closed).
    pub async fn all_ended(&self) {
        let all = u32::try_from(self.max_connections).unwrap_or(u32::MAX);
        let _ = self.permits.acquire_many(all).await;
    }
}

/// The peer to [`Admission::admit`] a connection from `peer` that arrived at `local` as:
/// [`Ipv4Addr::LOCALHOST`] for every connection from this host, else `peer`.
pub fn one_peer_for_this_host(peer: IpAddr, local: IpAddr) -> IpAddr {
    let peer = peer.to_canonical();
    if peer.is_loopback() || peer == local.to_canonical() {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        peer
    }
}

/// The map stays consistent whatever panicked while holding it: each update is one statement.
fn lock(map: &Mutex<HashMap<IpAddr, usize>>) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
    map.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the tests' connections arrive: the Pod's address, as the kubelet reaches it.
    const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 1, 0, 1));

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 2, 0, last])
    }

    #[test]
    fn one_peer_holds_at_most_its_share() {
        let admission = Admission::new(8, 3, 0);
        let held: Vec<_> = (0..3).map(|_| admission.admit(ip(2)).unwrap()).collect();
        assert_eq!(admission.admit(ip(2)).err(), Some(Refusal::PeerLimit));
        assert!(admission.admit(ip(3)).is_ok());
        drop(held);
        assert!(
            admission.admit(ip(2)).is_ok(),
            "a share comes back when its connections end"
        );
    }

    #[test]
    fn the_reserve_admits_only_peers_without_a_connection() {
        let admission = Admission::new(6, 6, 2);
        let _hog: Vec<_> = (0..4).map(|_| admission.admit(ip(2)).unwrap()).collect();
        assert_eq!(admission.admit(ip(2)).err(), Some(Refusal::ReserveOnly));
        let _probe = admission.admit(ip(3)).unwrap();
        assert_eq!(admission.admit(ip(3)).err(), Some(Refusal::ReserveOnly));
        let _other = admission.admit(ip(4)).unwrap();
        assert_eq!(admission.admit(ip(5)).err(), Some(Refusal::Full));
    }

    #[test]
    fn an_ipv4_mapped_address_is_the_same_peer() {
        let admission = Admission::new(8, 1, 0);
        let _v4 = admission.admit(ip(2)).unwrap();
        let mapped = IpAddr::V6(Ipv4Addr::new(10, 2, 0, 2).to_ipv6_mapped());
        assert_eq!(admission.admit(mapped).err(), Some(Refusal::PeerLimit));
    }

    #[test]
    fn every_address_of_this_host_is_one_peer() {
        let here = |peer| one_peer_for_this_host(peer, LOCAL);
        let admission = Admission::new(8, 2, 0);
        let _held = [
            admission.admit(here(IpAddr::from([127, 0, 0, 2]))).unwrap(),
            admission.admit(here(IpAddr::from([127, 9, 9, 9]))).unwrap(),
        ];
        for from_here in [
            IpAddr::from([127, 0, 0, 3]),
            IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
            IpAddr::V6(Ipv4Addr::new(127, 0, 0, 4).to_ipv6_mapped()),
            LOCAL,
        ] {
            assert_eq!(
                admission.admit(here(from_here)).err(),
                Some(Refusal::PeerLimit),
                "{from_here}"
            );
        }
        assert!(admission.admit(here(ip(2))).is_ok());
    }
}
