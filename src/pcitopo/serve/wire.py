"""KubeVirt's hook messages on the wire, read and written without protobuf's runtime.

Every hook message is flat: bytes/string fields, plus ``InfoResult``'s repeated ``HookPoint``.
This module reads and writes them in the proto3 wire format protobuf would produce (tag varint,
length varint, bytes; empty fields omitted), instead of through protobuf's runtime, which would
cost the sidecar ~3 MiB of resident memory and ~30 ms of start-up (bench/perf.py); the package
neither imports nor requires protobuf. The code grpcio-tools generates from our .proto files
stays the reference, in the test kit (``testkit/hookproto``): clients and tests speak to the
server through it, and ``tests/sidecar/test_wire.py`` checks these bytes against protobuf's.

The names, field numbers and method paths are KubeVirt's (``pkg/hooks/info/api_info.proto``,
``pkg/hooks/v1alpha{1,2,3}/api_v1alpha*.proto``; our copies in ``proto/testkit/hookproto``);
docs/SOURCES.md, "KubeVirt hook API", says where each fact comes from.
"""

from __future__ import annotations

# The version strings virt-launcher negotiates, newest first (it picks the newest it knows).
VERSIONS = ("v1alpha3", "v1alpha2", "v1alpha1")
INFO_NAME = "pcitopo"
# The hook points we subscribe to, as virt-launcher spells them (KubeVirt pkg/hooks/info/info.go).
ON_DEFINE_DOMAIN = "OnDefineDomain"
SHUTDOWN = "Shutdown"

# Service -> its methods, as virt-launcher calls them (/<service>/<method>).
SERVICES = {
    "kubevirt.hooks.info.Info": ("Info",),
    "kubevirt.hooks.v1alpha1.Callbacks": ("OnDefineDomain",),
    "kubevirt.hooks.v1alpha2.Callbacks": ("OnDefineDomain", "PreCloudInitIso"),
    "kubevirt.hooks.v1alpha3.Callbacks": ("OnDefineDomain", "PreCloudInitIso", "Shutdown"),
}

# Field numbers (proto/testkit/hookproto/*.proto).
DOMAIN_XML, VMI = 1, 2  # OnDefineDomainParams; OnDefineDomainResult.domainXML = 1
CLOUD_INIT_NOCLOUD_SOURCE, CLOUD_INIT_DATA = 1, 3  # PreCloudInitIsoParams/Result
INFO_RESULT_NAME, INFO_RESULT_HOOK_POINTS, INFO_RESULT_VERSIONS = 1, 3, 4  # InfoResult
HOOK_POINT_NAME = 1  # HookPoint; priority = 2 stays 0 and is not written

# The largest request or response the server accepts or sends. A KubeVirt domain is tens of
# KB and a VMI JSON a few KB; gRPC's own default (4 MiB for receiving) would do, but say it here
# so it is a decision: larger requests are refused by gRPC before they reach us.
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
# virt-launcher dials hook sidecars with grpc-go's default call options, whose receive limit is
# 4 MiB (grpc-go: defaultClientMaxReceiveMessageSize = 1024 * 1024 * 4): a larger reply fails
# there with an error that does not name us, so the server refuses it with one that does. The
# reply is OnDefineDomainResult{domainXML = 1}: the XML plus one tag byte and up to five length bytes.
MAX_REPLY_BYTES = 4 * 1024 * 1024
REPLY_FRAMING_BYTES = 6

_VARINT, _FIXED64, _LEN, _GROUP_START, _GROUP_END, _FIXED32 = 0, 1, 2, 3, 4, 5  # wire types
_MAX_FIELD_NUMBER = 0x1FFFFFFF  # 2**29 - 1
_MAX_GROUP_DEPTH = 100  # protobuf's default recursion limit


class WireError(ValueError):
    """A request that is not a well-formed protobuf message."""


ZERO_IN_GROUP = "field number 0 inside a group"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf):
            raise WireError("truncated varint")
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7
        if shift >= 70:
            raise WireError("varint longer than 10 bytes")


def encode_fields(fields: list[tuple[int, bytes]]) -> bytes:
    """A message of length-delimited fields, in the order given; empty values are omitted
    (proto3 does not write fields at their default)."""
    out = bytearray()
    for number, value in fields:
        if value:
            out += _varint(number << 3 | _LEN)
            out += _varint(len(value))
            out += value
    return bytes(out)


def decode_fields(buf: bytes) -> dict[int, bytes]:
    """Field number -> value of every top-level length-delimited field (the last one when a
    number comes twice, as proto3 parses singular fields); other fields (varints, fixed, and
    groups) are skipped, as protobuf skips unknown fields. Raises WireError where protobuf's
    parser would fail."""
    out: dict[int, bytes] = {}
    _scan(buf, 0, out, None, 0)
    return out


def _scan(buf: bytes, i: int, out: dict[int, bytes] | None, group: int | None, depth: int) -> int:
    """Read fields from ``i`` to the end (or to the end of ``group``); returns the new offset.

    Inside a skipped group every field number is checked like a top-level one, so a field
    number 0 there is refused (``ZERO_IN_GROUP``), where protobuf's skipper lets it through:
    the one known difference from protobuf's parser (virt-launcher never sends groups)."""
    n = len(buf)
    while i < n:
        key, i = _read_varint(buf, i)
        number, wire_type = key >> 3, key & 7
        if number == 0 and group is not None:
            raise WireError(ZERO_IN_GROUP)
        if not 0 < number <= _MAX_FIELD_NUMBER or key > 0xFFFFFFFF:
            raise WireError(f"field number {number} out of range")
        if wire_type == _VARINT:
            _, i = _read_varint(buf, i)
        elif wire_type == _FIXED64:
            i += 8
        elif wire_type == _FIXED32:
            i += 4
        elif wire_type == _LEN:
            size, i = _read_varint(buf, i)
            if size > n - i:
                raise WireError("truncated field")
            if out is not None:
                out[number] = buf[i:i + size]
            i += size
        elif wire_type == _GROUP_START:  # a (deprecated) group: skip to its end
            if depth >= _MAX_GROUP_DEPTH:
                raise WireError("groups nested too deeply")
            i = _scan(buf, i, None, number, depth + 1)
        elif wire_type == _GROUP_END and number == group:
            return i
        else:
            raise WireError(f"unexpected wire type {wire_type}")
        if i > n:
            raise WireError("truncated field")
    if group is not None:
        raise WireError("unterminated group")
    return i


# -- the messages the server reads and writes ------------------------------------------------

def on_define_domain_params(buf: bytes) -> tuple[bytes, bytes]:
    """``OnDefineDomainParams`` -> (domainXML, vmi); a missing field is empty."""
    f = decode_fields(buf)
    return f.get(DOMAIN_XML, b""), f.get(VMI, b"")


def on_define_domain_result(domain_xml: bytes) -> bytes:
    return encode_fields([(DOMAIN_XML, domain_xml)])


def pre_cloud_init_iso_echo(buf: bytes) -> bytes:
    """``PreCloudInitIsoResult`` carrying the params' cloud-init data unchanged."""
    f = decode_fields(buf)
    return encode_fields([(n, f.get(n, b"")) for n in (CLOUD_INIT_NOCLOUD_SOURCE, CLOUD_INIT_DATA)])


# InfoResult{name; repeated HookPoint hookPoints; repeated string versions}: the same bytes
# every time. We subscribe to OnDefineDomain and Shutdown, not PreCloudInitIso.
INFO_RESULT = encode_fields(
    [(INFO_RESULT_NAME, INFO_NAME.encode())]
    + [(INFO_RESULT_HOOK_POINTS, encode_fields([(HOOK_POINT_NAME, name.encode())])) for name in (ON_DEFINE_DOMAIN, SHUTDOWN)]
    + [(INFO_RESULT_VERSIONS, v.encode()) for v in VERSIONS]
)


# -- KubeVirt Plugins (VEP 190): proto/testkit/hookproto/plugins_v1alpha1.proto ----------------

PLUGIN_PACKAGE = "kubevirt.hooks.plugins.v1alpha1"
DOMAIN_HOOK_SERVICE = f"{PLUGIN_PACKAGE}.DomainHookService"
NODE_HOOK_SERVICE = f"{PLUGIN_PACKAGE}.NodeHookService"
# Service -> its methods, one socket each: the domain hook (in the VM's pod), the node hook (virt-handler)
DOMAIN_HOOK_SERVICES = {DOMAIN_HOOK_SERVICE: ("MutateDomain",)}
NODE_HOOK_SERVICES = {NODE_HOOK_SERVICE: ("ExecuteNodeHook",)}
# MutateDomainRequest{domain_type = 1; domain = 2; vmi = 3; sidecar_context = 4 {invocation_context = 1}}
MUTATE_DOMAIN_TYPE, MUTATE_DOMAIN, MUTATE_VMI, MUTATE_SIDECAR_CONTEXT, INVOCATION_CONTEXT = 1, 2, 3, 4, 1
MUTATE_RESULT_DOMAIN = 1  # MutateDomainResponse.domain
# ExecuteNodeHookRequest{hookPoint = 1; vmi = 2; node_context = 3 {node_name = 1}}
NODE_HOOK_POINT, NODE_HOOK_VMI, NODE_HOOK_CONTEXT, NODE_NAME = 1, 2, 3, 1


def _string(value: bytes, what: str) -> str:
    """A proto3 ``string`` field: protobuf refuses one that is not UTF-8, and so do we."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise WireError(f"{what} is not UTF-8") from None


def mutate_domain_request(buf: bytes) -> tuple[str, bytes, bytes, str]:
    """``MutateDomainRequest`` -> (domain_type, domain, vmi, invocation_context); missing is empty."""
    f = decode_fields(buf)
    context = decode_fields(f.get(MUTATE_SIDECAR_CONTEXT, b""))
    return (_string(f.get(MUTATE_DOMAIN_TYPE, b""), "domain_type"), f.get(MUTATE_DOMAIN, b""), f.get(MUTATE_VMI, b""),
            _string(context.get(INVOCATION_CONTEXT, b""), "invocation_context"))


def mutate_domain_response(domain_xml: bytes) -> bytes:
    return encode_fields([(MUTATE_RESULT_DOMAIN, domain_xml)])


def execute_node_hook_request(buf: bytes) -> tuple[str, bytes, str]:
    """``ExecuteNodeHookRequest`` -> (hookPoint, vmi, node_name); missing is empty."""
    f = decode_fields(buf)
    node = decode_fields(f.get(NODE_HOOK_CONTEXT, b""))
    return _string(f.get(NODE_HOOK_POINT, b""), "hookPoint"), f.get(NODE_HOOK_VMI, b""), _string(node.get(NODE_NAME, b""), "node_name")
