"""The signature the control plane puts on its requests to a node agent."""

from __future__ import annotations

import time

import pytest
from django.core.exceptions import ImproperlyConfigured

from scheduling import nodelink

TARGET = "/logs/?offset=0&path=%2Fvar%2Flog%2Fa.log"


def test_a_signed_request_is_accepted_by_the_node_it_was_signed_for():
    header = nodelink.authorization("node-a", "GET", TARGET)
    assert nodelink.check("node-a", "GET", TARGET, header) is None


def test_it_refuses_a_request_signed_for_another_node():
    header = nodelink.authorization("node-a", "GET", TARGET)
    assert "not valid for node node-b" in nodelink.check("node-b", "GET", TARGET, header)


def test_it_refuses_a_request_whose_target_was_changed():
    header = nodelink.authorization("node-a", "GET", TARGET)
    other = TARGET.replace("offset=0", "offset=1")
    assert "not valid" in nodelink.check("node-a", "GET", other, header)


def test_it_refuses_an_expired_signature():
    header = nodelink.authorization("node-a", "GET", TARGET, now=time.time() - 3600)
    assert nodelink.check("node-a", "GET", TARGET, header) == "the signature has expired"


def test_it_refuses_an_expiry_moved_forward():
    expires, signature = nodelink.authorization("node-a", "GET", TARGET).split(" ")[1].split(":")
    forged = f"{nodelink.SCHEME} {int(expires) + 30}:{signature}"
    assert "not valid" in nodelink.check("node-a", "GET", TARGET, forged)


@pytest.mark.parametrize(
    "header", [None, "", "Bearer abc", "GpupNode abc", "GpupNode 123", "GpupNode 99999999999:x"]
)
def test_it_refuses_a_missing_or_malformed_header(header):
    assert nodelink.check("node-a", "GET", TARGET, header) is not None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("10.0.0.7", ("10.0.0.7", nodelink.DEFAULT_PORT)),
        ("10.0.0.7:9000", ("10.0.0.7", 9000)),
        ("gpu-b.lab:0", ("gpu-b.lab", 0)),
        ("[fd00::7]:9000", ("fd00::7", 9000)),
    ],
)
def test_an_advertised_address_is_a_host_and_an_optional_port(value, expected):
    assert nodelink.parse_address(value) == expected
    host, port = expected
    assert nodelink.parse_address(nodelink.format_address(host, port)) == expected


@pytest.mark.parametrize("value", ["http://10.0.0.7", "10.0.0.7:x", "10.0.0.7/logs", ":80"])
def test_a_bad_advertised_address_names_the_setting(value):
    with pytest.raises(ImproperlyConfigured, match="NODE_ADVERTISE_ADDRESS"):
        nodelink.parse_address(value)
