"""Webhook rules: signatures, retry schedule and dead-lettering, which URLs may receive."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from runcontrol.domain import errors
from runcontrol.domain.webhooks import check_url, retry_delay, signature, succeeded, verify

SECRET = "whsec_test"
BODY = b'{"eventId":"e-1","seq":1}'


def test_signature_is_hmac_sha256_over_timestamp_dot_body() -> None:
    expected = hmac.new(SECRET.encode(), b"1700000000." + BODY, hashlib.sha256).hexdigest()
    assert signature(SECRET, 1700000000, BODY) == f"v1={expected}"


def test_verify_accepts_ours_and_refuses_tampering_replay_and_skew() -> None:
    sig = signature(SECRET, 1700000000, BODY)
    assert verify(SECRET, "1700000000", BODY, sig, now=1700000100)
    assert not verify("other-secret", "1700000000", BODY, sig, now=1700000100)
    assert not verify(SECRET, "1700000000", BODY + b" ", sig, now=1700000100)
    # the same signature under a new timestamp is not valid: the timestamp is signed
    assert not verify(SECRET, "1700000050", BODY, sig, now=1700000100)
    assert not verify(SECRET, "1700000000", BODY, sig, now=1700000000 + 301)
    assert not verify(SECRET, "soon", BODY, sig, now=1700000000)


def test_retry_delay_is_full_jitter_up_to_the_cap_then_dead_letter() -> None:
    ceilings: list[float] = []

    def uniform(low: float, high: float) -> float:
        assert low == 0.0
        ceilings.append(high)
        return high / 2

    delays = [
        retry_delay(n, 5, base_seconds=1.0, cap_seconds=5.0, uniform=uniform) for n in range(1, 6)
    ]
    assert ceilings == [1.0, 2.0, 4.0, 5.0]
    assert delays == [0.5, 1.0, 2.0, 2.5, None]  # the fifth failure of five dead-letters


@pytest.mark.parametrize(
    ("status", "ok"),
    [(200, True), (204, True), (299, True), (301, False), (410, False), (500, False)],
)
def test_only_2xx_acknowledges(status: int, ok: bool) -> None:
    assert succeeded(status) is ok


def _resolver(*addresses: str):  # type: ignore[no-untyped-def]
    return lambda host: list(addresses)


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/hook",
        "https:///hook",
        "https://user:pw@example.com/hook",
        "http://example.com:0/",
        "http://[::1",
    ],
)
def test_malformed_urls_are_refused(url: str) -> None:
    with pytest.raises(errors.InvalidWebhookUrl):
        check_url(url, allow_private=True, resolve=_resolver("93.184.216.34"))


@pytest.mark.parametrize(
    "address", ["127.0.0.1", "10.1.2.3", "192.168.0.5", "169.254.169.254", "::1", "fc00::1"]
)
def test_private_addresses_are_refused_unless_allowed(address: str) -> None:
    url = "https://hooks.example.com/in"
    with pytest.raises(errors.InvalidWebhookUrl, match="non-public"):
        check_url(url, allow_private=False, resolve=_resolver("93.184.216.34", address))
    assert check_url(url, allow_private=True, resolve=_resolver(address)) == url


def test_a_public_host_is_accepted_and_an_unresolvable_one_refused() -> None:
    url = "https://hooks.example.com/in"
    assert check_url(url, allow_private=False, resolve=_resolver("93.184.216.34")) == url

    def fails(host: str) -> list[str]:
        raise OSError("no such host")

    with pytest.raises(errors.InvalidWebhookUrl, match="does not resolve"):
        check_url(url, allow_private=False, resolve=fails)
