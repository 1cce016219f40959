//! How many connections the external scaler port holds: at most [`MAX_CONNECTIONS`] in all and
//! [`MAX_CONNECTIONS_PER_PEER`] from one address. Every held connection is a descriptor, and a
//! client that opens connections and never speaks would otherwise take them all — those of
//! `/v1` and of the Kubernetes client too. The cap per address keeps one Pod from filling the
//! port: KEDA's operator shares one connection per address among its ScaledObjects, so it needs
//! a handful, never hundreds. The counting is the shared HTTP server's
//! ([`http_server::admission`]), with no reserve: no probe comes to this port.

use http_server::admission::Admission;

/// Connections held at once, from every address together.
pub const MAX_CONNECTIONS: usize = 1024;
/// Connections held at once from one address.
pub const MAX_CONNECTIONS_PER_PEER: usize = 64;

/// The port's admission: the caps above, no reserve.
pub fn for_the_port() -> Admission {
    Admission::new(MAX_CONNECTIONS, MAX_CONNECTIONS_PER_PEER, 0)
}
