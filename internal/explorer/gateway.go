package explorer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	_ "google.golang.org/genproto/googleapis/rpc/errdetails" // the details of errors, for their JSON
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// methods are the gRPC methods the page may call, by the path it posts to
// ("verdict.v1.DecisionService/Decide"), each with how its answer is read.
// Reads only: the explorer writes nothing (Impact and Lint judge a change
// without writing it, as Apply's dry run does). A view that needs another
// method adds it here; the server's method table still judges every call
// (access, validation, redaction, limits).
var methods = methodSet(map[string]answer{
	verdictv1.DecisionService_Decide_FullMethodName:  unary,
	verdictv1.DecisionService_Resolve_FullMethodName: unary,
	verdictv1.PolicyService_Get_FullMethodName:       unary,
	verdictv1.PolicyService_List_FullMethodName:      unary,
	verdictv1.PolicyService_Status_FullMethodName:    unary,
	verdictv1.PolicyService_History_FullMethodName:   unary,
	verdictv1.WatchService_WatchRules_FullMethodName: firstMessage, // a workload's rule lists now
	verdictv1.AnalysisService_Reach_FullMethodName:   onePage,
	verdictv1.AnalysisService_Impact_FullMethodName:  unary,
	verdictv1.AnalysisService_Lint_FullMethodName:    unary,
})

// answer is how the gateway reads a method's answer.
type answer uint8

const (
	// unary: the response.
	unary answer = iota + 1
	// firstMessage: a stream that goes on (a watch) answers its first
	// message, what it holds now; the stream is then cancelled.
	firstMessage
	// onePage: a stream of pages that ends (Reach) answers the page that
	// ?page=N names (0, the first, by default), and the number of pages in
	// the Verdict-Pages header; the stream is read to its end.
	onePage
)

// pagesHeader counts the pages of an onePage method's answer.
const pagesHeader = "Verdict-Pages"

// methodSet keys full method names ("/pkg.Service/Method") by their path
// below /api/.
func methodSet(full map[string]answer) map[string]answer {
	out := make(map[string]answer, len(full))
	for m, a := range full {
		out[strings.TrimPrefix(m, "/")] = a
	}
	return out
}

// maxRequestBytes bounds a page's request body; the server's method table
// bounds each method's own.
const maxRequestBytes = 1 << 20

// gateway forwards POST <service>/<method> with a protojson body to the gRPC
// method of that name and answers its response as protojson, or its status
// as a google.rpc.Status in JSON with the HTTP code of its gRPC code.
type gateway struct {
	conn    grpc.ClientConnInterface
	timeout time.Duration
	log     *slog.Logger
}

// marshal writes the proto3 JSON mapping (64-bit integers are strings),
// field names in lowerCamelCase, enums by name.
var marshal = protojson.MarshalOptions{}

func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct != "application/json" {
		writeStatus(w, status.New(codes.InvalidArgument, "the body must be application/json"))
		return
	}
	path := strings.TrimPrefix(r.URL.Path, "/")
	md, how, ok := lookup(path)
	if !ok {
		writeStatus(w, status.Newf(codes.NotFound, "%s is not a method the explorer calls", path))
		return
	}
	page := 0
	if how == onePage && r.URL.Query().Has("page") {
		n, err := strconv.Atoi(r.URL.Query().Get("page"))
		if err != nil || n < 0 {
			writeStatus(w, status.Newf(codes.InvalidArgument, "page %q: a page number from 0", r.URL.Query().Get("page")))
			return
		}
		page = n
	}
	req, resp, err := messages(md)
	if err != nil {
		g.log.ErrorContext(r.Context(), "explorer: method types", "method", path, "err", err)
		writeStatus(w, status.New(codes.Internal, "internal error"))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBytes))
	if err != nil {
		writeStatus(w, status.Newf(codes.ResourceExhausted, "request body: %v", err))
		return
	}
	if len(body) > 0 {
		if err := protojson.Unmarshal(body, req); err != nil {
			writeStatus(w, status.Newf(codes.InvalidArgument, "request body: %v", err))
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), g.timeout)
	defer cancel()
	if auth := r.Header.Values("Authorization"); len(auth) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, metadata.MD{"authorization": auth})
	}
	full := "/" + path
	switch how {
	case firstMessage:
		err = firstOf(ctx, g.conn, full, req, resp)
	case onePage:
		var pages int
		pages, err = pageOf(ctx, g.conn, full, req, resp, page)
		if err == nil {
			w.Header().Set(pagesHeader, strconv.Itoa(pages))
		}
	default:
		err = g.conn.Invoke(ctx, full, req, resp)
	}
	if err != nil {
		writeStatus(w, status.Convert(err))
		return
	}
	out, err := marshal.Marshal(resp)
	if err != nil {
		g.log.ErrorContext(r.Context(), "explorer: encode answer", "method", full, "err", err)
		writeStatus(w, status.New(codes.Internal, "internal error"))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// lookup finds a method the page may call ("pkg.Service/Method") and how its
// answer is read; the table's kind must agree with the method's descriptor
// (unary, or streaming from the server only).
func lookup(path string) (protoreflect.MethodDescriptor, answer, bool) {
	how, ok := methods[path]
	if !ok {
		return nil, 0, false
	}
	i := strings.LastIndexByte(path, '/')
	svc, name := path[:i], path[i+1:]
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return nil, 0, false
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, 0, false
	}
	md := sd.Methods().ByName(protoreflect.Name(name))
	if md == nil || md.IsStreamingClient() || md.IsStreamingServer() != (how != unary) {
		return nil, 0, false
	}
	return md, how, true
}

// messages are new request and response messages of a method.
func messages(md protoreflect.MethodDescriptor) (req, resp proto.Message, err error) {
	in, err := protoregistry.GlobalTypes.FindMessageByName(md.Input().FullName())
	if err != nil {
		return nil, nil, err
	}
	out, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName())
	if err != nil {
		return nil, nil, err
	}
	return in.New().Interface(), out.New().Interface(), nil
}

// firstOf calls a server-streaming method and receives its first message;
// the stream ends when ctx does (the caller's cancel).
func firstOf(ctx context.Context, conn grpc.ClientConnInterface, method string, req, resp proto.Message) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := openStream(ctx, conn, method, req)
	if err != nil {
		return err
	}
	if err := s.RecvMsg(resp); err != nil {
		if errors.Is(err, io.EOF) {
			return status.Error(codes.Unavailable, "the stream ended before its first message")
		}
		return err
	}
	return nil
}

// pageOf calls a server-streaming method whose stream ends and keeps its
// page'th message (from 0) in resp: it reads the stream to its end and
// returns the number of messages. A page past the last is NOT_FOUND.
func pageOf(ctx context.Context, conn grpc.ClientConnInterface, method string, req, resp proto.Message, page int) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := openStream(ctx, conn, method, req)
	if err != nil {
		return 0, err
	}
	skip := resp.ProtoReflect().New().Interface() // the pages before and after
	n := 0
	for ; ; n++ {
		into := skip
		if n == page {
			into = resp
		}
		if err := s.RecvMsg(into); err != nil {
			if !errors.Is(err, io.EOF) {
				return 0, err
			}
			break
		}
		proto.Reset(skip)
	}
	if page >= n {
		return n, status.Errorf(codes.NotFound, "page %d: the answer has %d page(s), numbered from 0", page, n)
	}
	return n, nil
}

func openStream(ctx context.Context, conn grpc.ClientConnInterface, method string, req proto.Message) (grpc.ClientStream, error) {
	s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, method)
	if err != nil {
		return nil, err
	}
	if err := s.SendMsg(req); err != nil {
		return nil, err
	}
	if err := s.CloseSend(); err != nil {
		return nil, err
	}
	return s, nil
}

// httpCodes maps gRPC codes to HTTP statuses (as grpc-gateway does).
var httpCodes = map[codes.Code]int{
	codes.OK:                 http.StatusOK,
	codes.Canceled:           499,
	codes.Unknown:            http.StatusInternalServerError,
	codes.InvalidArgument:    http.StatusBadRequest,
	codes.DeadlineExceeded:   http.StatusGatewayTimeout,
	codes.NotFound:           http.StatusNotFound,
	codes.AlreadyExists:      http.StatusConflict,
	codes.PermissionDenied:   http.StatusForbidden,
	codes.ResourceExhausted:  http.StatusTooManyRequests,
	codes.FailedPrecondition: http.StatusBadRequest,
	codes.Aborted:            http.StatusConflict,
	codes.OutOfRange:         http.StatusBadRequest,
	codes.Unimplemented:      http.StatusNotImplemented,
	codes.Internal:           http.StatusInternalServerError,
	codes.Unavailable:        http.StatusServiceUnavailable,
	codes.DataLoss:           http.StatusInternalServerError,
	codes.Unauthenticated:    http.StatusUnauthorized,
}

// writeStatus answers a gRPC status: its google.rpc.Status as JSON (code,
// message, details such as BadRequest's field violations) with the HTTP
// status of its code.
func writeStatus(w http.ResponseWriter, st *status.Status) {
	code, ok := httpCodes[st.Code()]
	if !ok {
		code = http.StatusInternalServerError
	}
	body, err := marshal.Marshal(st.Proto())
	if err != nil {
		body = fmt.Appendf(nil, `{"code":%d,"message":"internal error"}`, codes.Internal)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}
