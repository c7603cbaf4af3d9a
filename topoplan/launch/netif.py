"""Which network interface of this machine reaches an address: what NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME must
name for a multi-node launch, read from the kernel when launch runs on the machine itself (`--this-machine`).

A connected UDP socket makes the kernel choose the route and the source address without sending a packet; the
interface holding that address (SIOCGIFADDR on each of socket.if_nameindex()) is the one the route leaves by.
Linux only; None wherever that cannot be read (the scripts then ask for TOPOPLAN_IFNAME).
"""

from __future__ import annotations

import socket
import struct

from topoplan.errors import TopoplanError

SIOCGIFADDR = 0x8915  # linux/sockios.h
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-@")


def check_ifname(name: str) -> str:
    """`--ifname`: a Linux interface name (at most 15 characters, no spaces or shell syntax)."""
    if not 1 <= len(name) <= 15 or not set(name) <= _NAME_CHARS:
        raise TopoplanError(f"--ifname {name!r}: expected a network interface name such as eth0 or ib0 (at most 15 "
                            "letters, digits, or _ . : - @)")
    return name


def _address_of(name: str) -> str | None:
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            packed = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def interface_to(address: str) -> str | None:
    """The name of the interface whose IPv4 address the kernel would send from to reach `address`; None when the
    address does not resolve or no interface holds the source address."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.connect((address, 9))  # no packet leaves: connect() on UDP only picks the route
            source = udp.getsockname()[0]
    except OSError:
        return None
    return next((name for _, name in socket.if_nameindex() if _address_of(name) == source), None)
