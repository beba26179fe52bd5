"""The NTP timestamp format (RFC 5905 §6): Q32.32 seconds since 1900, one definition for the
whole product (sender reports, abs-capture-time, SNTP, the sync wire format).

Conversions round to the nearest representable value both ways, so a round trip is exact to
the nanosecond (Q32.32 resolves 0.23 ns). Seconds fold into 32 bits (the era is not on the
wire); reading back picks the era closest to a known time when one is given (RFC 5905 §6: a
timestamp is unambiguous within 68 years of it), else the RFC 4330 §3 rule that seconds with
the top bit clear belong to era 1 (after 2036-02-07T06:28:16Z).
"""

from __future__ import annotations

NS = 1_000_000_000
MASK32 = 0xFFFFFFFF
ERA_S = 1 << 32
# Seconds from the NTP epoch (1900) to the Unix epoch (1970), RFC 868 / RFC 5905 figure 4.
NTP_UNIX_OFFSET_S = 2_208_988_800


def unix_ns_to_ntp(ns: int) -> int:
    """Unix ns -> 64-bit NTP timestamp (era folded into 32 bits of seconds), rounded."""
    secs, rem = divmod(ns, NS)
    # rem <= NS - 1, so the rounded fraction stays below 2**32: no carry into the seconds.
    frac = ((rem << 32) + NS // 2) // NS
    return (((secs + NTP_UNIX_OFFSET_S) & MASK32) << 32) | frac


def ntp_to_unix_ns(ntp: int, near_ns: int | None = None) -> int:
    """64-bit NTP timestamp -> Unix ns, rounded; the era closest to ``near_ns`` when given."""
    secs, frac = (ntp >> 32) & MASK32, ntp & MASK32
    frac_ns = (frac * NS + (1 << 31)) >> 32
    if near_ns is not None:
        near_s = near_ns // NS + NTP_UNIX_OFFSET_S
        era = (near_s - secs + ERA_S // 2) // ERA_S
        return (secs + era * ERA_S - NTP_UNIX_OFFSET_S) * NS + frac_ns
    if secs < 0x8000_0000:
        secs += ERA_S
    return (secs - NTP_UNIX_OFFSET_S) * NS + frac_ns


def q32_to_ns(value: int) -> int:
    """Signed Q32.32 seconds -> ns, rounded half up."""
    return (value * NS + (1 << 31)) >> 32


def ns_to_q32(ns: int) -> int:
    """ns -> signed Q32.32 seconds, rounded half up."""
    return ((ns << 32) + NS // 2) // NS


def middle32(ntp: int) -> int:
    """The middle 32 bits of an NTP timestamp (Q16.16), as RTCP receiver reports echo an SR
    (RFC 3550 §6.4.1, LSR)."""
    return (ntp >> 16) & MASK32
