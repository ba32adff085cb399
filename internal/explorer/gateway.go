package explorer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
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
// ("verdict.v1.DecisionService/Decide"). Reads only: the explorer writes
// nothing. A view that needs another method adds it here; the server's
// method table still judges every call (access, validation, redaction,
// limits). A server-streaming method answers with its first message.
var methods = methodSet(
	verdictv1.DecisionService_Decide_FullMethodName,
	verdictv1.DecisionService_Resolve_FullMethodName,
	verdictv1.PolicyService_Get_FullMethodName,
	verdictv1.PolicyService_List_FullMethodName,
	verdictv1.PolicyService_Status_FullMethodName,
	verdictv1.WatchService_WatchRules_FullMethodName, // a workload's rule lists: the first message
)

// methodSet keys full method names ("/pkg.Service/Method") by their path
// below /api/.
func methodSet(full ...string) map[string]bool {
	out := make(map[string]bool, len(full))
	for _, m := range full {
		out[strings.TrimPrefix(m, "/")] = true
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
	token   string // "" : development mode
}

// marshal writes the proto3 JSON mapping (64-bit integers are strings),
// field names in lowerCamelCase, enums by name.
var marshal = protojson.MarshalOptions{}

func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if g.token != "" && !tokenOK(r, g.token) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="verdict"`)
		writeStatus(w, status.New(codes.Unauthenticated, "the explorer needs the bearer token (Authorization: Bearer <token>)"))
		return
	}
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct != "application/json" {
		writeStatus(w, status.New(codes.InvalidArgument, "the body must be application/json"))
		return
	}
	md, ok := lookup(r.URL.Path)
	if !ok {
		writeStatus(w, status.Newf(codes.NotFound, "%s is not a method the explorer calls", r.URL.Path))
		return
	}
	req, resp, err := messages(md)
	if err != nil {
		g.log.ErrorContext(r.Context(), "explorer: method types", "method", r.URL.Path, "err", err)
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
	full := "/" + r.URL.Path
	if md.IsStreamingServer() {
		err = firstMessage(ctx, g.conn, full, req, resp)
	} else {
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

// lookup finds a method the page may call: "pkg.Service/Method", unary or
// server-streaming.
func lookup(path string) (protoreflect.MethodDescriptor, bool) {
	if !methods[path] {
		return nil, false
	}
	i := strings.LastIndexByte(path, '/')
	svc, name := path[:i], path[i+1:]
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return nil, false
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, false
	}
	md := sd.Methods().ByName(protoreflect.Name(name))
	if md == nil || md.IsStreamingClient() {
		return nil, false
	}
	return md, true
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

// firstMessage calls a server-streaming method and receives its first
// message; the stream ends when ctx does (the caller's cancel).
func firstMessage(ctx context.Context, conn grpc.ClientConnInterface, method string, req, resp proto.Message) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, method)
	if err != nil {
		return err
	}
	if err := s.SendMsg(req); err != nil {
		return err
	}
	if err := s.CloseSend(); err != nil {
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
