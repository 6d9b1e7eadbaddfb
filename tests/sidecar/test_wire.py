"""src/pcitopo/serve/wire.py reads and writes the hook messages itself (protobuf's runtime would cost the
sidecar ~2.5 MiB, see bench/RESULTS.md): its bytes must be protobuf's, and it must accept and
refuse what protobuf's parser accepts and refuses, with one named exception."""

from __future__ import annotations

import os
import random

from google.protobuf.message import DecodeError

from pcitopo.serve import wire
from testkit.hookproto import info_pb2, v1alpha2_pb2, v1alpha3_pb2


def test_info_result_is_protobufs_bytes():
    assert wire.INFO_RESULT == info_pb2.InfoResult(
        name="pcitopo", versions=["v1alpha3", "v1alpha2", "v1alpha1"],
        hookPoints=[info_pb2.HookPoint(name="OnDefineDomain", priority=0), info_pb2.HookPoint(name="Shutdown", priority=0)],
    ).SerializeToString()


def test_messages_round_trip_through_protobuf():
    rnd = random.Random(7)
    for _ in range(500):
        d, v = os.urandom(rnd.choice([0, 1, 127, 128, 16384, 70_000])), os.urandom(rnd.choice([0, 3, 300]))
        params = v1alpha3_pb2.OnDefineDomainParams(domainXML=d, vmi=v).SerializeToString()
        assert wire.on_define_domain_params(params) == (d, v)
        assert wire.on_define_domain_result(d) == v1alpha3_pb2.OnDefineDomainResult(domainXML=d).SerializeToString()
        a, c = os.urandom(rnd.choice([0, 9])), os.urandom(rnd.choice([0, 200]))
        params = v1alpha2_pb2.PreCloudInitIsoParams(cloudInitNoCloudSource=a, vmi=v, cloudInitData=c).SerializeToString()
        assert wire.pre_cloud_init_iso_echo(params) == \
            v1alpha2_pb2.PreCloudInitIsoResult(cloudInitNoCloudSource=a, cloudInitData=c).SerializeToString()


def _ours(b: bytes) -> tuple:
    try:
        f = wire.decode_fields(b)
    except wire.WireError as e:
        return ("refused", str(e))
    return ("ok", f.get(1, b""), f.get(2, b""))


def _protobufs(b: bytes) -> tuple:
    m = v1alpha3_pb2.OnDefineDomainParams()
    try:
        m.ParseFromString(b)
    except DecodeError:
        return ("refused",)
    return ("ok", m.domainXML, m.vmi)


def test_arbitrary_bytes_are_accepted_and_refused_as_protobuf_does():
    """Arbitrary bytes, biased towards plausible keys (fields 1-5, every wire type, groups).
    The one known difference: a field number 0 inside a skipped group, which protobuf's
    skipper lets through and we refuse (virt-launcher never sends groups)."""
    rnd = random.Random(7)
    keys = [0x0A, 0x12, 0x08, 0x1A, 0x0D, 0x09, 0x22, 0x2B, 0x2C, 0x0B, 0x0C, 0x13, 0x14]
    for _ in range(20_000):
        b = bytes(rnd.choice(keys) if rnd.random() < 0.4 else rnd.randrange(256) for _ in range(rnd.randrange(16)))
        ours, theirs = _ours(b), _protobufs(b)
        if ours[0] == "refused" and theirs[0] == "refused":
            continue
        if ours == ("refused", wire.ZERO_IN_GROUP) and theirs[0] == "ok":
            continue  # test_the_one_exception_is_what_it_says
        assert ours == theirs, b


def test_the_one_exception_is_what_it_says():
    """Group 1 (start key 0x0B, end key 0x0C) holding a varint field numbered 0 (key 0x00)."""
    b = b"\x0b\x00\x01\x0c"
    assert _protobufs(b) == ("ok", b"", b"")
    assert _ours(b) == ("refused", wire.ZERO_IN_GROUP)
    # The same field number 0 at the top level: both refuse.
    assert _protobufs(b"\x00\x01")[0] == _ours(b"\x00\x01")[0] == "refused"
