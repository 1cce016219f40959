//! A loopback port nothing listens on.

/// A port the kernel just handed out and took back: free until someone binds it, which is
/// what a test wants for a server it starts later or a peer that must refuse connections.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
