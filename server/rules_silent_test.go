package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// TestWatchRulesSilentConnectionFreed: a client that opens WatchRules streams
// and then never reads its connection again (not even the socket: a raw
// HTTP/2 client) gets them dropped, and its connection closed, so that what
// gRPC had queued for those streams is freed. Before, the drop ended the
// handlers but gRPC kept up to a 64 KiB write quota of messages per stream
// for as long as the client held the connection (2,000 such
// streams held 330 MiB). The heap is measured after a GC, with a bound far
// below what the streams' queues hold (~100 KiB each here).
func TestWatchRulesSilentConnectionFreed(t *testing.T) {
	const silent, writes = 200, 30
	long := strings.Repeat("n", 200)
	var docs strings.Builder
	docs.WriteString("kind: Mesh\nname: default\n")
	for i := range 40 { // about 10 KB of rules for app=web
		fmt.Fprintf(&docs, "---\nkind: Policy\nname: p%02d-%s\nsources: [{match: {app: '*'}}]\ndestinations: [{match: {app: web}}]\n", i, long)
	}
	h := start(t, newBackend(decodeYAML(t, docs.String())...), func(c *Config) { c.RulesMaxLag = 100 * time.Millisecond },
		grpc.WithInitialWindowSize(64<<10))
	defer h.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req := &verdictv1.WatchRulesRequest{Workload: tags("app", "web")}
	honest, err := h.wat.WatchRules(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := honest.Recv(); err != nil {
		t.Fatal(err)
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	base := heap()

	// The silent client: the preface, default settings, silent streams each
	// with its request, then nothing; it never reads the connection.
	conn, err := h.lis.DialContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var out bytes.Buffer
	out.WriteString(http2.ClientPreface)
	fr := http2.NewFramer(&out, nil)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	body, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	msg := make([]byte, 5+len(body))
	binary.BigEndian.PutUint32(msg[1:], uint32(len(body)))
	copy(msg[5:], body)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"},
		{":path", verdictv1.WatchService_WatchRules_FullMethodName}, {":authority", "bufnet"},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range silent {
		id := uint32(2*i + 1)
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
		if err := fr.WriteData(id, true, msg); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Write(out.Bytes()); err != nil {
		t.Fatal(err)
	}
	waitWatchers(ctx, t, h, "the silent streams registered", silent+1)

	for i := range writes { // each changes app=web's rules; the honest watcher sees it
		ap, err := h.pol.Apply(ctx, &verdictv1.ApplyRequest{Resources: []*verdictv1.Resource{
			policyRes(&verdictv1.Policy{Name: fmt.Sprintf("w%02d-%s", i, long),
				Sources:      []*verdictv1.Selector{{Match: map[string]string{"app": "*"}}},
				Destinations: []*verdictv1.Selector{{Match: map[string]string{"app": "web"}}}})}})
		if err != nil {
			t.Fatal(err)
		}
		for m, err := honest.Recv(); m.GetRevision() < ap.GetRevision(); m, err = honest.Recv() {
			if err != nil {
				t.Fatalf("honest watcher after write %d: %v", i, err)
			}
		}
	}
	waitWatchers(ctx, t, h, "the silent streams dropped", 1)

	// What the silent streams had queued goes with their connection; polled
	// (gRPC frees it once its transport has seen the close).
	const bound = 4 << 20
	var now uint64
	for now = heap(); now > base+bound && ctx.Err() == nil; now = heap() {
		time.Sleep(50 * time.Millisecond)
	}
	if now > base+bound {
		t.Errorf("live heap %d KiB above the %d KiB before the silent streams (bound %d KiB): their queues were kept",
			(now-base)>>10, base>>10, bound>>10)
	}
}
