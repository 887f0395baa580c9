"""Which address a phone in the lecture hall can open: the room's link on the machine's network, never loopback.

Lives here: network_address() (this machine's address on its network, as Streamlit finds its "Network URL": the
interface the OS routes a public address through; without a default route, a hotspot with no internet, the
interfaces enumerated), is_loopback(), listens_on_network(), room_link() (the followers' link from the lecturer's
page address, the address the server listens on and the machine's network address, or why no phone can open it).
Does not: import streamlit, or send a packet (connecting a UDP socket only asks the OS for a route).
"""
from __future__ import annotations

import ipaddress
import socket
import sys
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit, urlunsplit

# A public address to ask the route to (no packet is sent): what Streamlit's net_util.get_internal_ip() asks.
ROUTE_PROBE = ("8.8.8.8", 80)
LECTURE_COMMAND = "python -m kvviz serve --lecture"  # the fix the share box names when phones cannot follow
ALL_INTERFACES = ("", "0.0.0.0", "::")  # server.address unset (Streamlit's default) or a wildcard: every interface


def is_loopback(host: str | None) -> bool:
    """localhost, 127.0.0.0/8 and ::1 (a name that is not an address, other than localhost, is not loopback)."""
    host = (host or "").strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _usable(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return not (ip.is_loopback or ip.is_unspecified or ip.is_link_local or ip.is_multicast)


def _routed_address() -> str | None:
    """The address of the interface the OS would send a public packet through (Streamlit's way)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(ROUTE_PROBE)
            address = s.getsockname()[0]
    except OSError:  # no default route: a hotspot without internet, a laptop on a lecture hall's closed network
        return None
    return address if _usable(address) else None


def _interface_addresses() -> list[str]:
    """Every interface's IPv4 address (Linux: SIOCGIFADDR per interface; elsewhere: the host name's addresses)."""
    found: list[str] = []
    if sys.platform.startswith("linux"):
        import fcntl
        import struct

        siocgifaddr = 0x8915
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _, name in socket.if_nameindex():
                try:
                    raw = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name[:15].encode()))
                except OSError:  # an interface without an IPv4 address
                    continue
                found.append(socket.inet_ntoa(raw[20:24]))
    else:
        try:
            found = [info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)]
        except OSError:
            found = []
    return list(dict.fromkeys(a for a in found if _usable(a)))


def network_address() -> str | None:
    """This machine's address on its network, or None (no interface but loopback)."""
    routed = _routed_address()
    if routed is not None:
        return routed
    addresses = _interface_addresses()
    # a private address (the lecture hall's Wi-Fi) before any other the machine holds
    addresses.sort(key=lambda a: not ipaddress.ip_address(a).is_private)
    return addresses[0] if addresses else None


def listens_on_network(server_address: str | None) -> bool:
    """The server accepts connections from other machines: every interface, or one address that is not loopback."""
    return (server_address or "") in ALL_INTERFACES or not is_loopback(server_address)


@dataclass(frozen=True)
class RoomLink:
    """The followers' link, or why there is none: `why` is a locale key of the room section (None: the link works)."""

    url: str | None
    why: str | None = None


def room_link(page_url: str, room_id: str, server_address: str | None, server_port: int,
              network: str | None) -> RoomLink:
    """The followers' link to the lecturer's page: its address with `?room=<id>` and nothing else (no secret, no
    language). A page opened at a loopback address gets the machine's network address `network` and the server's
    port, where the server listens there; else no link, and why. Any other address (a hosted demo behind its proxy,
    a LAN address the lecturer typed) is the room's already."""
    parts = urlsplit(page_url)
    query = urlencode({"room": room_id})
    if not is_loopback(parts.hostname):
        return RoomLink(urlunsplit((parts.scheme, parts.netloc, parts.path, query, "")))
    if not listens_on_network(server_address):
        return RoomLink(None, "room.link_loopback_only")
    host = server_address if server_address not in ALL_INTERFACES else network
    if host is None:
        return RoomLink(None, "room.link_no_network")
    netloc = f"[{host}]:{server_port}" if ":" in host else f"{host}:{server_port}"
    return RoomLink(urlunsplit((parts.scheme or "http", netloc, parts.path, query, "")))
