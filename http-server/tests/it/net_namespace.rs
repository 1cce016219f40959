//! A network namespace of the test's own: peers with addresses that are not loopback (the
//! kubelet's, as a Pod sees it) without touching the machine's network. Needs root, as the
//! tests run in CI.

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Runs `body` on a thread of its own in a new network namespace whose `lo` is up and also
/// carries `addresses`. Threads it starts, and every socket they open, stay in that namespace;
/// the namespace goes with the last of them.
pub fn in_new_net_namespace<T: Send + 'static>(
    addresses: &[Ipv4Addr],
    body: impl FnOnce() -> T + Send + 'static,
) -> T {
    let addresses = addresses.to_vec();
    let thread = std::thread::spawn(move || {
        // Network namespaces belong to threads: only this one (and what it starts) moves.
        // SAFETY: unshare(2) changes only this thread's namespaces.
        let unshared = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(
            unshared,
            0,
            "a network namespace of the test's own (the test runs as root): {}",
            std::io::Error::last_os_error()
        );
        let control = control_socket();
        for (alias, address) in addresses.iter().enumerate() {
            set_address(&control, &format!("lo:{alias}"), *address);
        }
        bring_up(&control, "lo");
        body()
    });
    thread
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

fn control_socket() -> OwnedFd {
    // SAFETY: a plain socket(2) call; the descriptor is owned from here on.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` is a new descriptor nobody else owns.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn request(interface: &str) -> libc::ifreq {
    // SAFETY: `ifreq` is plain data; all zeroes is a valid (empty) request.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    assert!(interface.len() < request.ifr_name.len());
    for (to, from) in request.ifr_name.iter_mut().zip(interface.bytes()) {
        *to = from as libc::c_char;
    }
    request
}

fn set_address(control: &OwnedFd, interface: &str, address: Ipv4Addr) {
    let mut request = request(interface);
    let socket_address = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(address).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: a `sockaddr_in` fits the request's `sockaddr` field (both 16 bytes).
    request.ifr_ifru.ifru_addr =
        unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(socket_address) };
    // SAFETY: SIOCSIFADDR reads the request it is given.
    let done = unsafe { libc::ioctl(control.as_raw_fd(), libc::SIOCSIFADDR, &request) };
    assert_eq!(
        done,
        0,
        "adding {address} to {interface}: {}",
        std::io::Error::last_os_error()
    );
}

fn bring_up(control: &OwnedFd, interface: &str) {
    let mut request = request(interface);
    // SAFETY: SIOCGIFFLAGS fills the flags of the request it is given.
    let read = unsafe { libc::ioctl(control.as_raw_fd(), libc::SIOCGIFFLAGS, &mut request) };
    assert_eq!(read, 0, "{}", std::io::Error::last_os_error());
    // SAFETY: the flags are the union's member SIOCGIFFLAGS just set.
    unsafe { request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: SIOCSIFFLAGS reads the request it is given.
    let done = unsafe { libc::ioctl(control.as_raw_fd(), libc::SIOCSIFFLAGS, &request) };
    assert_eq!(
        done,
        0,
        "bringing {interface} up: {}",
        std::io::Error::last_os_error()
    );
}
