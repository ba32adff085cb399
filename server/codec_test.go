package server

import (
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// TestRequestCodecDecodesFlowsAsProto: the flow requests, which the codec
// hands to the flow decoder (internal/flowcodec), decode as protobuf-go
// decodes them, and what the decoder declines (an unknown field) is left to
// protobuf-go, which keeps it.
func TestRequestCodecDecodesFlowsAsProto(t *testing.T) {
	t.Parallel()
	batch := &verdictv1.DecideBatchRequest{MinRevision: 9, Requests: []*verdictv1.DecideRequest{
		{Mesh: "m", Protocol: "TCP", Port: 80, Source: tags("app", "web"), Destination: tags("app", "db", "env", "prod")},
		{Source: &verdictv1.Endpoint{Address: "10.0.0.1"}, Destination: &verdictv1.Endpoint{Workload: "db-1"}, Explain: true},
	}}
	unknown := protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 1)
	for name, tc := range map[string]struct {
		b   []byte
		new func() proto.Message
	}{
		"batch":         {mustMarshal(t, batch), func() proto.Message { return &verdictv1.DecideBatchRequest{} }},
		"stream":        {mustMarshal(t, &verdictv1.DecideStreamRequest{Id: "1", Request: batch.Requests[0]}), func() proto.Message { return &verdictv1.DecideStreamRequest{} }},
		"unknown field": {unknown, func() proto.Message { return &verdictv1.DecideRequest{} }},
	} {
		t.Run(name, func(t *testing.T) {
			want, got := tc.new(), tc.new()
			if err := proto.Unmarshal(tc.b, want); err != nil {
				t.Fatal(err)
			}
			if err := newRequestCodec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(tc.b)}, got); err != nil || !proto.Equal(got, want) {
				t.Fatalf("through the codec: %v, %v; want %v", err, got, want)
			}
			if len(want.ProtoReflect().GetUnknown()) != len(got.ProtoReflect().GetUnknown()) {
				t.Errorf("unknown bytes %x, want %x", got.ProtoReflect().GetUnknown(), want.ProtoReflect().GetUnknown())
			}
		})
	}
}
