"""The endpoint picker's wire vocabulary (router_client.epp.protocol, picker.endpoint_of),
and the Envoy message fields it relies on, pinned: an `xds-protos` upgrade that renamed or
renumbered one of them fails here rather than in a gateway."""

from __future__ import annotations

import json

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from google.protobuf import json_format, struct_pb2

from router_client.epp import protocol as proto
from router_client.epp.picker import endpoint_of

# (message, field) -> field number, as in envoy/service/ext_proc/v3/external_processor.proto
PINNED = {
    (ep.ProcessingRequest, "request_headers"): 2, (ep.ProcessingRequest, "response_headers"): 3,
    (ep.ProcessingRequest, "request_body"): 4, (ep.ProcessingRequest, "response_body"): 5,
    (ep.ProcessingRequest, "request_trailers"): 6, (ep.ProcessingRequest, "response_trailers"): 7,
    (ep.ProcessingRequest, "metadata_context"): 8, (ep.ProcessingRequest, "protocol_config"): 11,
    (ep.ProcessingResponse, "request_headers"): 1, (ep.ProcessingResponse, "request_body"): 3,
    (ep.ProcessingResponse, "immediate_response"): 7,
    (ep.ProcessingResponse, "dynamic_metadata"): 8,
    (ep.CommonResponse, "header_mutation"): 2, (ep.CommonResponse, "body_mutation"): 3,
    (ep.BodyMutation, "streamed_response"): 3, (ep.StreamedBodyResponse, "body"): 1,
    (ep.StreamedBodyResponse, "end_of_stream"): 2, (ep.HttpBody, "end_of_stream"): 2,
    (ep.ImmediateResponse, "status"): 1, (ep.ImmediateResponse, "body"): 3,
    (base_pb2.HeaderValue, "raw_value"): 3,
}


def test_the_fields_the_picker_uses_keep_their_numbers():
    for (message, name), number in PINNED.items():
        assert message.DESCRIPTOR.fields_by_name[name].number == number, (message, name)


def test_headers_read_raw_values_first_and_names_lower_cased():
    headers = ep.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key="X-Routing-Key", raw_value=b"tenant-7"),
        base_pb2.HeaderValue(key="x-session-id", value="old-style"),
        base_pb2.HeaderValue(key="x-routing-key", raw_value=b"second")]))
    assert proto.header_map(headers) == {"x-routing-key": "tenant-7",
                                         "x-session-id": "old-style"}


def test_the_subset_hint_is_read_as_a_list_or_a_string():
    msg = ep.ProcessingRequest()
    assert proto.subset_hint(msg) is None
    hint = struct_pb2.Struct()
    hint.update({proto.SUBSET_KEY: ["10.0.0.1:8000", "10.0.0.2:8000"]})
    msg.metadata_context.filter_metadata[proto.SUBSET_NAMESPACE].CopyFrom(hint)
    assert proto.subset_hint(msg) == ["10.0.0.1:8000", "10.0.0.2:8000"]
    hint.update({proto.SUBSET_KEY: "10.0.0.3:8000, 10.0.0.4:8000"})
    msg.metadata_context.filter_metadata[proto.SUBSET_NAMESPACE].CopyFrom(hint)
    assert proto.subset_hint(msg) == ["10.0.0.3:8000", "10.0.0.4:8000"]


def test_the_routing_answer_carries_one_value_twice():
    answer = proto.picked_headers("10.0.0.1:8000,10.0.0.2:8000", 42)
    headers = {h.header.key: h.header.raw_value.decode()
               for h in answer.request_headers.response.header_mutation.set_headers}
    assert headers == {proto.DESTINATION_HEADER: "10.0.0.1:8000,10.0.0.2:8000",
                       "content-length": "42"}
    meta = json_format.MessageToDict(answer.dynamic_metadata)
    assert meta == {"envoy.lb": {proto.DESTINATION_HEADER: "10.0.0.1:8000,10.0.0.2:8000"}}


def test_a_large_body_goes_back_in_pieces_and_only_the_last_ends_it():
    body = bytes(range(256)) * 1000  # 256 kB
    pieces = proto.streamed_body(body, request=True)
    assert len(pieces) == 4
    sent = [p.request_body.response.body_mutation.streamed_response for p in pieces]
    assert b"".join(s.body for s in sent) == body
    assert [s.end_of_stream for s in sent] == [False, False, False, True]
    empty = proto.streamed_body(b"", request=False)
    assert len(empty) == 1 and empty[0].response_body.response.body_mutation \
        .streamed_response.end_of_stream


def test_a_refusal_is_an_openai_style_error():
    answer = proto.refused(503, 'no "usable" endpoint', "overloaded").immediate_response
    assert answer.status.code == 503
    assert json.loads(answer.body) == {"error": {"message": 'no "usable" endpoint',
                                                 "type": "overloaded", "code": 503}}


@pytest.mark.parametrize("address, ident, expected", [
    ("http://10.0.0.5:8000", "e0", "10.0.0.5:8000"),
    ("https://10.0.0.5:8443/v1", "e0", "10.0.0.5:8443"),
    ("", "10.1.2.3:8000", "10.1.2.3:8000"),
    ("http://[fd00::1]:8000", "e0", "[fd00::1]:8000"),
    ("http://engine-0.engines.svc:8000", "e0", "engine-0.engines.svc:8000"),
    ("", "engine-0", ""),
    ("http://10.0.0.5", "e0", ""),  # no port: not an endpoint
    ("http://10.0.0.5:99999", "e0", ""),
])
def test_endpoints_come_from_addresses_or_ids(address, ident, expected):
    assert endpoint_of(address, ident) == expected
