package explorer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/verdictpdp/verdict/engine/resource"
)

// documentsPath reads pasted YAML: POST {"yaml": "..."} answers
// {"resources": [Resource, ...]}, each the API's Resource message in
// protobuf JSON, ready for Impact or Lint. It calls nothing and writes
// nothing: it is resource.DecodeYAML, the one decoder verdictctl reads files
// with, so a document is refused here as `verdictctl impact -f` refuses it —
// INVALID_ARGUMENT with BadRequest field violations that name the document,
// its line and the field ("documents[1] (line 7).sources[0].match").
const documentsPath = "documents"

type documents struct {
	log *slog.Logger
}

// documentsRequest is the body of a POST to documentsPath.
type documentsRequest struct {
	YAML string `json:"yaml"`
}

func (d documents) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct != "application/json" {
		writeStatus(w, status.New(codes.InvalidArgument, "the body must be application/json"))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBytes))
	if err != nil {
		writeStatus(w, status.Newf(codes.ResourceExhausted, "request body: %v", err))
		return
	}
	var req documentsRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeStatus(w, status.Newf(codes.InvalidArgument, "request body: %v", err))
		return
	}
	rs, err := resource.DecodeYAML([]byte(req.YAML))
	if err != nil {
		writeStatus(w, invalidDocuments(err))
		return
	}
	if len(rs) == 0 {
		writeStatus(w, status.New(codes.InvalidArgument, "no document: paste the resources to judge"))
		return
	}
	out := struct {
		Resources []json.RawMessage `json:"resources"`
	}{Resources: make([]json.RawMessage, len(rs))}
	for i, res := range rs {
		if out.Resources[i], err = resourceJSON(res); err != nil {
			d.log.ErrorContext(r.Context(), "explorer: encode a document", "index", i, "err", err)
			writeStatus(w, status.New(codes.Internal, "internal error"))
			return
		}
	}
	enc, err := json.Marshal(out)
	if err != nil {
		d.log.ErrorContext(r.Context(), "explorer: encode documents", "err", err)
		writeStatus(w, status.New(codes.Internal, "internal error"))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(enc)
}

// resourceJSON is the API's Resource message of r in protobuf JSON: the
// canonical document (which is the protobuf JSON of its kind's message) under
// the name of its kind's field of the oneof.
func resourceJSON(r resource.Resource) (json.RawMessage, error) {
	doc, err := resource.EncodeJSON(r)
	if err != nil {
		return nil, err
	}
	var field string
	switch r.(type) {
	case *resource.Mesh:
		field = "mesh"
	case *resource.Scope:
		field = "scope"
	case *resource.Policy:
		field = "policy"
	case *resource.Workload:
		field = "workload"
	default:
		return nil, fmt.Errorf("unknown resource type %T", r)
	}
	return json.Marshal(map[string]json.RawMessage{field: doc})
}

// invalidDocuments is the status of documents that do not decode: each
// failing field a BadRequest field violation.
func invalidDocuments(err error) *status.Status {
	var ve *resource.ValidationError
	if !errors.As(err, &ve) || len(ve.Errors) < 2 {
		return status.New(codes.InvalidArgument, err.Error())
	}
	st := status.Newf(codes.InvalidArgument, "%d fields of the documents are not valid", len(ve.Errors))
	br := &errdetails.BadRequest{}
	for _, fe := range ve.Errors {
		br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: fe.Field, Description: fe.Reason})
	}
	with, err := st.WithDetails(br)
	if err != nil {
		return st
	}
	return with
}
