//! How many connections the external scaler port holds: at most [`MAX_CONNECTIONS`] in all and
//! [`MAX_CONNECTIONS_PER_PEER`] from one address. Every held connection is a descriptor, and a
//! client that opens connections and never speaks would otherwise take them all — those of
//! `/v1` and of the Kubernetes client too. The cap per address keeps one Pod from filling the
//! port: KEDA's operator shares one connection per address among its ScaledObjects, so it needs
//! a handful, never hundreds.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

/// Connections held at once, from every address together.
pub const MAX_CONNECTIONS: usize = 1024;
/// Connections held at once from one address.
pub const MAX_CONNECTIONS_PER_PEER: usize = 64;

/// Counts the held connections; a [`Slot`] is one of them, released when dropped.
#[derive(Clone)]
pub struct Admission {
    counts: Arc<Mutex<Counts>>,
    max_total: usize,
    max_per_peer: usize,
}

#[derive(Default)]
struct Counts {
    total: usize,
    by_peer: HashMap<IpAddr, usize>,
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The port holds [`MAX_CONNECTIONS`] already.
    Full,
    /// This address holds [`MAX_CONNECTIONS_PER_PEER`] already.
    PeerFull,
}

/// One admitted connection; dropping it frees its place.
pub struct Slot {
    counts: Arc<Mutex<Counts>>,
    peer: IpAddr,
}

impl Default for Admission {
    fn default() -> Self {
        Admission::new(MAX_CONNECTIONS, MAX_CONNECTIONS_PER_PEER)
    }
}

impl Admission {
    pub fn new(max_total: usize, max_per_peer: usize) -> Self {
        Admission {
            counts: Arc::default(),
            max_total,
            max_per_peer,
        }
    }

    /// A place for a connection from `peer`, unless the port or the address is full.
    pub fn admit(&self, peer: IpAddr) -> Result<Slot, Refusal> {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if counts.total >= self.max_total {
            return Err(Refusal::Full);
        }
        let held = counts.by_peer.entry(peer).or_default();
        if *held >= self.max_per_peer {
            return Err(Refusal::PeerFull);
        }
        *held += 1;
        counts.total += 1;
        Ok(Slot {
            counts: self.counts.clone(),
            peer,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        counts.total -= 1;
        if let Some(held) = counts.by_peer.get_mut(&self.peer) {
            *held -= 1;
            if *held == 0 {
                counts.by_peer.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn caps_each_address_and_the_total_and_frees_places_on_drop() {
        let admission = Admission::new(5, 2);
        let a: Vec<Slot> = (0..2).map(|_| admission.admit(ip(1)).unwrap()).collect();
        assert_eq!(admission.admit(ip(1)).err(), Some(Refusal::PeerFull));
        let b: Vec<Slot> = (0..2).map(|_| admission.admit(ip(2)).unwrap()).collect();
        let c = admission.admit(ip(3)).unwrap();
        assert_eq!(admission.admit(ip(4)).err(), Some(Refusal::Full), "5 held");
        drop(c);
        let _d = admission.admit(ip(4)).unwrap();
        drop(a);
        let _e = admission.admit(ip(1)).unwrap();
        assert_eq!(admission.counts.lock().unwrap().total, 4);
        drop(b);
        assert_eq!(admission.counts.lock().unwrap().by_peer.len(), 2);
    }
}
